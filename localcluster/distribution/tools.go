//go:build tools

// Package tools pins the CNCF distribution registry's command, built by ../build_addons.sh.
package tools

import (
	_ "github.com/distribution/distribution/v3/cmd/registry"
)
