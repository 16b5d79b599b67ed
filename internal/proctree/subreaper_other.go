//go:build !linux

package proctree

// SetSubreaper does nothing off Linux.
func SetSubreaper() error { return nil }
