//go:build tools

// Package tools pins scheduler-plugins' scheduler command, built by ../build_addons.sh.
package tools

import (
	_ "sigs.k8s.io/scheduler-plugins/cmd/scheduler"
)
