package host

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// The file that runs is the file that was verified: a plugin swapped for
// another program right after its checksum was checked (the window of the
// old hash-then-exec-by-path) still runs the verified bytes.
func TestVerifiedBytesAreWhatRuns(t *testing.T) {
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	script := func(who string) []byte {
		return []byte("#!/bin/sh\necho " + who + " > " + marker + "\n")
	}
	path := filepath.Join(dir, "glmflash-pass-swap")
	require.NoError(t, os.WriteFile(path, script("verified"), 0o755))
	sum := sha256.Sum256(script("verified"))
	afterVerify = func(p string) {
		tmp := p + ".evil"
		require.NoError(t, os.WriteFile(tmp, script("swapped-in"), 0o755))
		require.NoError(t, os.Rename(tmp, p))
	}
	defer func() { afterVerify = nil }()
	h, err := Open(Options{Dir: dir, Log: zerolog.Nop(), StartTimeout: 5 * time.Second,
		Checksums: map[string]string{"glmflash-pass-swap": hex.EncodeToString(sum[:])}})
	require.NoError(t, err)
	defer h.Close()
	b, err := os.ReadFile(marker)
	require.NoError(t, err, "the plugin ran: %v", h.Plugin("swap").Err())
	require.Equal(t, "verified\n", string(b))
	// the script exits without a handshake: a start failure with its reason
	require.ErrorContains(t, h.Plugin("swap").Err(), "could not start")

	// and a file that does not match is never run
	require.NoError(t, os.Remove(marker))
	afterVerify = nil
	h2, err := Open(Options{Dir: dir, Log: zerolog.Nop(), Checksums: map[string]string{"glmflash-pass-swap": strings.Repeat("0", 64)}})
	require.NoError(t, err)
	defer h2.Close()
	require.ErrorContains(t, h2.Plugin("swap").Err(), "checksum verification failed")
	_, err = os.Stat(marker)
	require.True(t, os.IsNotExist(err), "a mismatching file never runs")
}
