module liqo-rs/bench/wireguard-go

go 1.24.0

require golang.zx2c4.com/wireguard v0.0.0-20260522210424-ecfc5a8d5446

require (
	golang.org/x/crypto v0.37.0 // indirect
	golang.org/x/net v0.39.0 // indirect
	golang.org/x/sys v0.32.0 // indirect
	golang.zx2c4.com/wintun v0.0.0-20230126152724-0fa3db229ce2 // indirect
)
