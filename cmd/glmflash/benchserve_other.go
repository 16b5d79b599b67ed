//go:build !linux

package main

import "syscall"

// childAttrs puts a started server in a process group of its own (a Ctrl-C
// reaches bench serve, which stops it).
func childAttrs() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
