//go:build tools

// Package tools pins kwok's controller command, built by ../build_addons.sh.
package tools

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
