//go:build linux

package main

import "syscall"

// childAttrs puts a started server in a process group of its own (a Ctrl-C
// reaches bench serve, which stops it) and has it sent SIGTERM when the
// thread that started it exits (this process dies).
func childAttrs() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}
