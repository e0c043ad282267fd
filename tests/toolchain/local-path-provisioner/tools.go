//go:build tools

// Package tools pins local-path-provisioner, the dynamic storage
// provisioner of the clusters with a real node (k3s's and kind's default
// StorageClass). Its command is the module's root package, which cannot
// be imported from a program of our own: this file is never compiled; it
// only keeps the module in go.mod.
package tools

import (
	_ "github.com/rancher/local-path-provisioner"
)
