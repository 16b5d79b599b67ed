//go:build linux

package host

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/glmflash/glmflash/internal/proctree"
	"github.com/glmflash/glmflash/internal/regular"
	"github.com/glmflash/glmflash/plugins/protocol"
)

// maxPluginBytes bounds a plugin executable (it is copied into memory).
const maxPluginBytes = 1 << 30

// verifiedCommand makes the command that runs the plugin at path, such that
// what runs is exactly what was hashed: the file is copied into a sealed
// memory file (memfd: no one can change it afterwards) while it is hashed,
// the hash is compared with want (nil: unverified), and the command executes
// the memory file through its descriptor (/proc/self/fd/3 in the child). A
// file swapped or rewritten after the check is never run.
//
// The plugin runs in a process group of its own, so that it and any child
// it leaves can be killed together, and is tied to the host's life: it gets
// SIGTERM when the thread that started it exits (Pdeathsig; the runner
// starts it from a goroutine locked to its thread for the plugin's life),
// and the read end of a pipe (descriptor 4, protocol.EnvParentFD) whose
// write end, life, only the host holds: however the host dies, the plugin
// reads end of file there (the SDK then kills its descendants and exits).
// Because "$0" of what runs is /proc/self/fd/3, the plugin's directory and
// path are in protocol.EnvDir and EnvPath (a wrapper script finds its
// files through them). close releases the descriptors the child inherits
// once the process has started (or failed to); the caller closes life when
// the plugin is stopped.
func verifiedCommand(path string, want []byte) (cmd *exec.Cmd, sum []byte, close func(), life *os.File, err error) {
	cmd, sum, closeRO, err := memfdCommand(path, want)
	if err != nil {
		return nil, sum, nil, nil, err
	}
	r, w, err := os.Pipe() // both ends close-on-exec: no other child inherits them
	if err != nil {
		closeRO()
		return nil, nil, nil, nil, fmt.Errorf("the plugin's lifeline pipe: %w", err)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		abs = path
	}
	cmd.ExtraFiles = append(cmd.ExtraFiles, r) // descriptor 4
	cmd.Env = []string{protocol.EnvDir + "=" + filepath.Dir(abs), protocol.EnvPath + "=" + abs,
		fmt.Sprintf("%s=%d", protocol.EnvParentFD, 3+len(cmd.ExtraFiles)-1)}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGTERM
	return cmd, sum, func() { closeRO(); r.Close() }, w, nil
}

// memfdCommand is the command that runs the sealed copy of path.
func memfdCommand(path string, want []byte) (cmd *exec.Cmd, sum []byte, close func(), err error) {
	f, st, err := regular.Open(path)
	if err != nil {
		return nil, nil, nil, err
	}
	defer f.Close()
	if st.Size() > maxPluginBytes {
		return nil, nil, nil, fmt.Errorf("%s: %d bytes, more than the %d a plugin may have", path, st.Size(), maxPluginBytes)
	}
	fd, err := unix.MemfdCreate(st.Name(), unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("memfd_create: %w", err)
	}
	mem := os.NewFile(uintptr(fd), "memfd:"+st.Name())
	defer mem.Close()
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(mem, h), io.LimitReader(f, maxPluginBytes)); err != nil {
		return nil, nil, nil, fmt.Errorf("reading %s: %w", path, err)
	}
	sum = h.Sum(nil)
	if want != nil && !equalBytes(sum, want) {
		return nil, sum, nil, errChecksum
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SEAL|unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_WRITE); err != nil {
		return nil, nil, nil, fmt.Errorf("sealing the copy of %s: %w", path, err)
	}
	// execve refuses a file open for writing: run it through a read-only
	// descriptor and close the writable one (deferred above)
	ro, err := os.Open(fmt.Sprintf("/proc/self/fd/%d", fd))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("reopening the copy of %s: %w", path, err)
	}
	cmd = exec.Command("/proc/self/fd/3")
	cmd.Args[0] = path // what ps shows
	cmd.ExtraFiles = []*os.File{ro}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd, sum, func() { ro.Close() }, nil
}

// killGroup kills the process group pgid (the plugin and its children).
func killGroup(pgid int) {
	if pgid > 0 {
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	}
}

// groupAlive reports whether process group pgid still has a member.
func groupAlive(pgid int) bool { return syscall.Kill(-pgid, 0) == nil }

// descendants lists pid's descendants (proctree), for killDescendants once
// the plugin is stopped.
func descendants(pid int) []proctree.Proc {
	if pid <= 0 {
		return nil
	}
	return proctree.Descendants(pid)
}

// killDescendants kills those of ps still running; it returns how many.
func killDescendants(ps []proctree.Proc) int { return proctree.Kill(ps) }

// VerifiedExecutable is the command that runs the executable at path only
// if its SHA-256 is want, and runs exactly the bytes hashed (a sealed
// memory file, as for plugins: a file swapped after the check never runs);
// Args[0] is path. release closes the descriptor the child inherits, once
// it started (or failed to). Other executables than plugins use it (a
// study's serving.binary).
func VerifiedExecutable(path string, want []byte, args ...string) (cmd *exec.Cmd, release func(), err error) {
	if len(want) != sha256.Size {
		return nil, nil, fmt.Errorf("%s: no expected SHA-256: refusing to run it", path)
	}
	cmd, got, release, err := memfdCommand(path, want)
	if errors.Is(err, errChecksum) {
		return nil, nil, fmt.Errorf("checksum verification failed: SHA-256 of %s is %x, expected %x: refusing to run it", path, got, want)
	}
	if err != nil {
		return nil, nil, err
	}
	cmd.Args = append(cmd.Args, args...)
	cmd.SysProcAttr = nil // not a plugin: no process group of its own
	return cmd, release, nil
}
