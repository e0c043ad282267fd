//go:build tools

// Package tools pins kwok, which fakes the test clusters' worker nodes.
// It is never compiled; it only keeps kwok in go.mod.
package tools

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
