// Command etcd is etcd's server, built from its Go module at the version
// pinned in go.mod (etcd's own modules use relative replace lines, so it
// cannot be installed with `go install`).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
