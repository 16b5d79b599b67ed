//go:build unix

package safetensors

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// copyFixture copies the tiny checkpoint's safetensors file into a
// temporary directory (the tests truncate and overwrite it).
func copyFixture(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(fixturePath)
	require.NoError(t, err)
	p := filepath.Join(t.TempDir(), "model.safetensors")
	require.NoError(t, os.WriteFile(p, b, 0o644))
	return p
}

// readFaulting reads every byte of b the way a kernel would, with faults
// turned into panics, and returns the error FaultOf makes of one.
func readFaulting(b []byte) (sum byte, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if err = FaultOf(r); err == nil {
				panic(r)
			}
		}
	}()
	for _, x := range b {
		sum += x
	}
	return sum, nil
}

// A Guarded file truncated under its mapping: reading the lost pages
// faults (SIGBUS), which becomes an error naming the file and the offset,
// and the file is refused from then on; the process survives.
func TestGuardedTruncatedFaultIsAnError(t *testing.T) {
	p := copyFixture(t)
	f, err := OpenMode(p, Guarded)
	require.NoError(t, err)
	defer f.Close()
	require.True(t, f.Mapped())
	require.NoError(t, f.Check())
	name := "model.language_model.embed_tokens.weight"
	raw, err := f.Bytes(name)
	require.NoError(t, err)
	_, err = readFaulting(raw)
	require.NoError(t, err)

	require.NoError(t, os.Truncate(p, 0))
	_, err = readFaulting(raw)
	require.Error(t, err)
	assert.ErrorContains(t, err, p)
	assert.ErrorContains(t, err, "SIGBUS")
	assert.ErrorContains(t, err, "truncated to 0 bytes")
	assert.ErrorContains(t, err, "model.weights: guarded")
	// sticky: every later read and check is refused with the same reason
	assert.Equal(t, err, f.Check())
	_, err2 := f.Bytes(name)
	assert.Equal(t, err, err2)
}

// A fault outside any mapping is not a checkpoint's (FaultOf says nil),
// and a panic that is not a fault neither.
func TestFaultOfOtherPanics(t *testing.T) {
	assert.NoError(t, FaultOf("boom"))
	assert.NoError(t, Fault(1))
}

// Another checkpoint copied over a Guarded file (same inode, new bytes)
// is detected by Check, and by VerifyHeader when the times were put back.
func TestGuardedReplacedIsDetected(t *testing.T) {
	p := copyFixture(t)
	f, err := OpenMode(p, Guarded)
	require.NoError(t, err)
	defer f.Close()
	st, err := os.Stat(p)
	require.NoError(t, err)
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	other := bytes.Clone(b)
	other[len(other)-1] ^= 0xff // a different last weight, same size
	w, err := os.OpenFile(p, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = w.WriteAt(other, 0)
	require.NoError(t, err)
	require.NoError(t, w.Close())
	require.NoError(t, os.Chtimes(p, st.ModTime(), st.ModTime())) // cp -p: the times put back
	err = f.Check()
	require.Error(t, err)
	assert.ErrorContains(t, err, p)
	assert.ErrorContains(t, err, "changed on disk since they were loaded")
	assert.ErrorContains(t, err, "status changed at") // the change time cannot be put back
	assert.Equal(t, err, f.VerifyHeader())
}

// VerifyHeader compares the header's bytes with those loaded: a header
// that differs is refused even when the file's identity matches.
func TestVerifyHeader(t *testing.T) {
	p := copyFixture(t)
	f, err := OpenMode(p, Guarded)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, f.VerifyHeader())
	f.header[0] ^= 1 // as if another header had been loaded
	err = f.VerifyHeader()
	require.Error(t, err)
	assert.ErrorContains(t, err, "the header on disk is not the one loaded")
}

// A Copy file is immune: truncating or overwriting the file changes none
// of its bytes, and Check has nothing to refuse.
func TestCopySurvivesTruncationAndReplacement(t *testing.T) {
	p := copyFixture(t)
	f, err := OpenMode(p, Copy)
	require.NoError(t, err)
	defer f.Close()
	require.False(t, f.Mapped())
	name := "model.language_model.embed_tokens.weight"
	before, err := f.Float32(name)
	require.NoError(t, err)
	require.NoError(t, os.Truncate(p, 0))
	require.NoError(t, os.WriteFile(p, []byte("something else"), 0o644))
	raw, err := f.Bytes(name)
	require.NoError(t, err)
	_, err = readFaulting(raw)
	require.NoError(t, err)
	after, err := f.Float32(name)
	require.NoError(t, err)
	assert.Equal(t, before, after)
	assert.NoError(t, f.Check())
}

func TestParseMode(t *testing.T) {
	for _, m := range []Mode{Copy, Guarded} {
		got, err := ParseMode(m.String())
		require.NoError(t, err)
		assert.Equal(t, m, got)
	}
	_, err := ParseMode("mmap")
	assert.ErrorContains(t, err, `"mmap" is not a weights mode (copy or guarded)`)
	_, err = OpenMode(fixturePath, Mode(7))
	assert.ErrorContains(t, err, "not a weights mode")
}
