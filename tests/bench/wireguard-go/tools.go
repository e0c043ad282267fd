//go:build tools

// Pins the current wireguard-go (with its TUN and UDP offloads) for the
// tunnel benchmark, which builds it from this module (tests/bench/tunnel.sh).
package tools

import _ "golang.zx2c4.com/wireguard"
