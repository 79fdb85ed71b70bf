// Command pause is the sandbox ("pause") container of the local cluster's real nodes: it holds the pod's
// namespaces, reaps the zombies of a shared process namespace, and exits on SIGINT or SIGTERM.
// Built here because no registry can be reached to pull one.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
