//go:build tools

// Pins the current wireguard-go (with its TUN and UDP offloads) for the
// tunnel's interoperability test and the tunnel benchmark, which build it
// from this module (tests/wireguard-go/build.sh).
package tools

import _ "golang.zx2c4.com/wireguard"
