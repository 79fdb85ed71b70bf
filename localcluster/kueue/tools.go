//go:build tools

// Package tools pins Kueue's controller-manager command, built by ../build_addons.sh.
package tools

import (
	_ "sigs.k8s.io/kueue/cmd/kueue"
)
