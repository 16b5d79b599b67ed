//go:build linux

package proctree

import "golang.org/x/sys/unix"

// SetSubreaper makes this process the child subreaper of its descendants
// (prctl PR_SET_CHILD_SUBREAPER): one whose parent exits is reparented to
// it rather than to init, so Descendants still finds it. Orphans reparented
// so stay zombies once they exit until this process exits (nothing here
// reaps them: a wait for any child would take the statuses os/exec waits
// for).
func SetSubreaper() error { return unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) }
