//go:build !linux

package host

import (
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"os/exec"

	"github.com/glmflash/glmflash/internal/regular"
)

// verifiedCommand hashes the plugin file and runs it by path. Only Linux
// runs exactly the bytes it hashed (through a sealed memory file); here a
// file swapped between the check and the start would run unverified.
// No lifeline pipe or parent-death signal either: a plugin outlives a host
// that dies without stopping it.
func verifiedCommand(path string, want []byte) (*exec.Cmd, []byte, func(), *os.File, error) {
	f, _, err := regular.Open(path)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return nil, nil, nil, nil, err
	}
	sum := h.Sum(nil)
	if want != nil && !equalBytes(sum, want) {
		return nil, sum, nil, nil, errChecksum
	}
	return exec.Command(path), sum, func() {}, nil, nil
}

func killGroup(int) {}

func groupAlive(int) bool { return false }

func descendants(int) []struct{} { return nil }

func killDescendants([]struct{}) int { return 0 }

// VerifiedExecutable hashes the executable at path and runs it by path if
// its SHA-256 is want (off Linux a file swapped between the check and the
// start would run).
func VerifiedExecutable(path string, want []byte, args ...string) (*exec.Cmd, func(), error) {
	if len(want) != sha256.Size {
		return nil, nil, fmt.Errorf("%s: no expected SHA-256: refusing to run it", path)
	}
	cmd, got, _, _, err := verifiedCommand(path, want)
	if err == errChecksum {
		return nil, nil, fmt.Errorf("checksum verification failed: SHA-256 of %s is %x, expected %x: refusing to run it", path, got, want)
	}
	if err != nil {
		return nil, nil, err
	}
	cmd.Args = append(cmd.Args, args...)
	return cmd, func() {}, nil
}
