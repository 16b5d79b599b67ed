package cuda

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
)

// The PTX generated from src/all.cu by `make ptx` (nvcc, where the CUDA
// toolkit exists), committed like generated protobuf code. Each file starts
// with the SHA-256 of the sources it was made from (SourcesHash); a test
// fails when the sources changed and the PTX was not regenerated.
//
//go:embed ptx/*.ptx
var ptxFS embed.FS

// PTX targets: Hopper machine code paths for compute capability ≥ 9.0, and
// a portable target the driver JIT-compiles for any GPU from 7.5 on.
const (
	ptxHopper   = "ptx/glmflash.sm_90.ptx"
	ptxPortable = "ptx/glmflash.compute_75.ptx"
)

// HashHeader starts the first line of every generated PTX file.
const HashHeader = "// glmflash-sources-sha256: "

// PTXDirEnv names a directory whose glmflash.*.ptx files replace the
// embedded ones: a development aid for testing freshly compiled kernels
// (`make ptx` on the GPU machine) with an already built binary.
const PTXDirEnv = "GLMFLASH_CUDA_PTX_DIR"

// PTXFor returns the PTX to load on a GPU of compute capability
// major.minor.
func PTXFor(major, minor int) (string, error) {
	name := ptxPortable
	switch {
	case major >= 9:
		name = ptxHopper
	case major*10+minor < 75:
		return "", fmt.Errorf("cuda: compute capability %d.%d is below 7.5, the oldest glmflash's PTX targets", major, minor)
	}
	if dir := os.Getenv(PTXDirEnv); dir != "" {
		b, err := os.ReadFile(filepath.Join(dir, filepath.Base(name)))
		if err != nil {
			return "", fmt.Errorf("cuda: %s: %w", PTXDirEnv, err)
		}
		return string(b), nil
	}
	b, err := ptxFS.ReadFile(name)
	if err != nil {
		return "", fmt.Errorf("cuda: %s is not embedded (run make ptx on a machine with nvcc): %w", name, err)
	}
	return string(b), nil
}

// PTXFiles returns the embedded PTX files by name.
func PTXFiles() map[string]string {
	out := map[string]string{}
	_ = fs.WalkDir(ptxFS, "ptx", func(p string, d fs.DirEntry, err error) error { // the callback never fails
		if err == nil && !d.IsDir() {
			b, _ := ptxFS.ReadFile(p)
			out[p] = string(b)
		}
		return nil
	})
	return out
}

var (
	entryRE   = regexp.MustCompile(`(?m)^(?:\.(?:visible|weak)\s+)?\.entry\s+(\w+)\(`)
	namesOnce sync.Once
	names     []string
)

// KernelNames lists the kernels in the embedded module.
func KernelNames() []string {
	namesOnce.Do(func() {
		b, err := ptxFS.ReadFile(ptxHopper)
		if err != nil {
			return
		}
		names = EntryNames(string(b))
	})
	return names
}

// EntryNames lists the kernels (.entry functions) of a PTX text, sorted:
// what a module loaded from it holds (the embedded PTX's, or a
// GLMFLASH_CUDA_PTX_DIR file's, which may add kernels the embedded one
// lacks).
func EntryNames(ptx string) []string {
	var out []string
	for _, m := range entryRE.FindAllStringSubmatch(ptx, -1) {
		out = append(out, m[1])
	}
	sort.Strings(out)
	return out
}

// SourcesHash is the SHA-256 that `make ptx` records: over the *.cu and
// *.cuh files of dir in byte order of their names, each contributing its
// name, a newline and its contents (the Makefile computes the same with
// printf, cat and sha256sum).
func SourcesHash(dir string) (string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	var files []string
	for _, e := range ents {
		if n := e.Name(); !e.IsDir() && (strings.HasSuffix(n, ".cu") || strings.HasSuffix(n, ".cuh")) {
			files = append(files, n)
		}
	}
	sort.Strings(files)
	h := sha256.New()
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return "", err
		}
		h.Write([]byte(f + "\n"))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// RecordedHash returns the sources hash a PTX file records.
func RecordedHash(ptx string) (string, bool) {
	line, _, _ := strings.Cut(ptx, "\n")
	if !strings.HasPrefix(line, HashHeader) {
		return "", false
	}
	return strings.TrimSpace(strings.TrimPrefix(line, HashHeader)), true
}
