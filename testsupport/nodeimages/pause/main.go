// Command pause is the sandbox ("pause") container of the real-node tests'
// pods: it holds the pod's namespaces open, blocks until SIGTERM or SIGINT
// and then exits 0. As PID 1 of the pod's PID namespace it also reaps the
// zombies it inherits.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	reap() // children orphaned before Notify took effect
	for s := range sigs {
		if s == syscall.SIGCHLD {
			reap()
			continue
		}
		os.Exit(0)
	}
}

// reap waits for every child that has exited, without blocking; signals
// coalesce, so one SIGCHLD may stand for many children.
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return // no exited child left (0) or no children at all (ECHILD)
		}
	}
}
