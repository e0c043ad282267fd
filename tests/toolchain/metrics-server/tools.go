//go:build tools

// Package tools pins metrics-server, which scrapes kubelets (the virtual
// kubelet's /metrics/resource among them) for `kubectl top`. It is never
// compiled; it only keeps metrics-server in go.mod.
package tools

import (
	_ "sigs.k8s.io/metrics-server/cmd/metrics-server"
)
