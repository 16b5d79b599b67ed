package safetensors

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"sync/atomic"

	"github.com/glmflash/glmflash/internal/regular"
)

// File is an open safetensors file. Its tensor bytes are a copy in
// memory made at open (Copy) or a read-only shared mapping of the file
// (Guarded; a copy where mapping fails). A File is safe for concurrent
// readers; Close must not race with them.
type File struct {
	path     string
	mode     Mode
	data     []byte // whole file
	unmap    func([]byte) error
	mapped   bool  // data is a mapping of the file (DropResident applies)
	dataOff  int64 // offset of the data section within data
	infos    map[string]TensorInfo
	metadata map[string]string
	closed   bool
	// gen makes the tensors of a generated File (NewGenerated).
	gen *generation

	// Guarded mode: the open file, its identity at open and the hash of
	// its header, and the sticky reason it may not be read any more.
	fd       *os.File
	identity identity
	header   [sha256.Size]byte
	broken   atomic.Pointer[error]
}

// Mode says how Open holds a file's tensor bytes.
type Mode int

const (
	// Copy reads the whole file into anonymous memory at open (off the Go
	// heap, read-only once filled): truncating or rewriting the file
	// afterwards changes nothing that is served. It costs the file's size
	// in memory, for as long as the File is open.
	Copy Mode = iota
	// Guarded maps the file read-only (MAP_SHARED): its pages come from the
	// page cache and cost no memory of their own, but the file's bytes are
	// the served weights. Check compares the open file's identity (device,
	// inode, size, modification and change times) with the one it had at
	// open; a fault while reading the mapping (the file truncated under it:
	// SIGBUS) is turned into an error by a reader that runs with
	// debug.SetPanicOnFault and asks Fault, and the file is refused from
	// then on.
	Guarded
)

// String is the mode's configuration name ("copy", "guarded").
func (m Mode) String() string {
	switch m {
	case Copy:
		return "copy"
	case Guarded:
		return "guarded"
	case Generated:
		return "generated"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// ParseMode reads a mode's configuration name.
func ParseMode(s string) (Mode, error) {
	switch s {
	case "copy", "":
		return Copy, nil
	case "guarded":
		return Guarded, nil
	}
	return 0, fmt.Errorf("%q is not a weights mode (copy or guarded)", s)
}

// Open opens the safetensors file at path in Copy mode (OpenMode).
func Open(path string) (*File, error) { return OpenMode(path, Copy) }

// OpenMode reads the header of the safetensors file at path, validates it
// and copies or maps the file (mode). Every error names the file.
func OpenMode(path string, mode Mode) (*File, error) {
	if mode != Copy && mode != Guarded {
		return nil, fmt.Errorf("safetensors %s: %v is not a weights mode", path, mode)
	}
	f, st, err := regular.Open(path) // never blocks on a FIFO or a device
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	keep := false
	defer func() {
		if !keep {
			f.Close()
		}
	}()
	size := st.Size()
	if size < 8 {
		return nil, fmt.Errorf("safetensors %s: truncated: %d bytes, shorter than the 8-byte header length", path, size)
	}
	var lenBuf [8]byte
	if _, err := io.ReadFull(f, lenBuf[:]); err != nil {
		return nil, fmt.Errorf("safetensors %s: reading header length: %w", path, err)
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n > MaxHeaderSize {
		return nil, fmt.Errorf("safetensors %s: header length %d exceeds the %d byte limit", path, n, MaxHeaderSize)
	}
	if int64(n) > size-8 {
		return nil, fmt.Errorf("safetensors %s: truncated: header length %d but only %d bytes follow", path, n, size-8)
	}
	header := make([]byte, n)
	if _, err := io.ReadFull(f, header); err != nil {
		return nil, fmt.Errorf("safetensors %s: reading header: %w", path, err)
	}
	dataOff := 8 + int64(n)
	infos, md, err := ParseHeader(header, size-dataOff)
	if err != nil {
		if maxEnd := maxDeclaredEnd(header); maxEnd > size-dataOff {
			return nil, fmt.Errorf("safetensors %s: truncated: tensors need %d data bytes, file has %d: %w", path, maxEnd, size-dataOff, err)
		}
		return nil, fmt.Errorf("safetensors %s: %w", path, err)
	}
	sf := &File{path: path, mode: mode, dataOff: dataOff, infos: infos, metadata: md}
	if mode == Guarded {
		sf.header = sha256.Sum256(header)
		if sf.identity, err = identityOf(f); err != nil {
			return nil, fmt.Errorf("safetensors %s: %w", path, err)
		}
		var m []byte
		err = errNoMmap
		if !forceNoMmap {
			m, err = mmapFile(f, size)
		}
		if err == nil {
			sf.data, sf.unmap, sf.mapped, sf.fd = m, munmap, true, f
			keep = true
			register(sf)
			return sf, nil
		}
	}
	// a copy: in anonymous memory where there is (sealed read-only once
	// filled), else on the heap
	buf, free, err := allocCopy(size)
	if err != nil {
		buf, free = make([]byte, size), nil
	}
	if err := readAll(f, buf); err != nil {
		if free != nil {
			_ = free(buf)
		}
		return nil, fmt.Errorf("safetensors %s: reading: %w", path, err)
	}
	if free != nil {
		_ = sealCopy(buf) // advice: a stray write faults instead of changing a weight
	}
	sf.data, sf.unmap = buf, free
	return sf, nil
}

// readAll fills buf from the start of f, a bounded chunk at a time, and
// fails when f is shorter than buf (it shrank since it was measured).
func readAll(f *os.File, buf []byte) error {
	const chunk = 64 << 20
	for off := 0; off < len(buf); {
		n, err := f.ReadAt(buf[off:min(off+chunk, len(buf))], int64(off))
		off += n
		if err == io.EOF && off < len(buf) {
			return fmt.Errorf("the file shrank to %d bytes while it was read (%d expected)", off, len(buf))
		}
		if err != nil && err != io.EOF {
			return err
		}
	}
	return nil
}

// Mode is how the file's bytes are held.
func (f *File) Mode() Mode { return f.mode }

// Mapped reports whether the tensor bytes are a mapping of the file (Guarded
// mode where mapping succeeded).
func (f *File) Mapped() bool { return f.mapped }

// Check says whether the file's bytes may still be read: nil for a copy,
// and for a mapping whose file is the one opened (same device, inode, size,
// modification and change times, and header bytes) and never faulted. A
// failed check is sticky: a file that changed on disk stays refused even
// when it changes back.
func (f *File) Check() error {
	if !f.mapped {
		return nil
	}
	if e := f.broken.Load(); e != nil {
		return *e
	}
	if f.fd == nil { // closed
		return fmt.Errorf("safetensors %s: file is closed", f.path)
	}
	now, err := identityOf(f.fd)
	if err != nil {
		return f.breakWith(fmt.Errorf("safetensors %s: checking the mapped file: %w", f.path, err))
	}
	if why := f.identity.diff(now); why != "" {
		return f.breakWith(fmt.Errorf("safetensors %s: the memory-mapped weights changed on disk since they were loaded (%s): refusing to serve them (model.weights: guarded; copy holds them in memory instead)", f.path, why))
	}
	return nil
}

// VerifyHeader re-reads the header through the open file and compares its
// SHA-256 with the one at open (a heavier check than Check's, for a health
// probe): nil for a copy.
func (f *File) VerifyHeader() error {
	if err := f.Check(); err != nil || !f.mapped {
		return err
	}
	h := make([]byte, f.dataOff)
	if _, err := f.fd.ReadAt(h, 0); err != nil {
		return f.breakWith(fmt.Errorf("safetensors %s: re-reading the header: %w", f.path, err))
	}
	if sha256.Sum256(h[8:]) != f.header {
		return f.breakWith(fmt.Errorf("safetensors %s: the header on disk is not the one loaded (another checkpoint was written over it): refusing to serve it", f.path))
	}
	return nil
}

// ErrRefused is in the chain of every error of a Guarded file that refuses
// its bytes from then on (changed on disk, faulted): a server that sees it
// can stop advertising itself as serving.
var ErrRefused = errors.New("safetensors: the checkpoint's weights are refused")

// refused is a refusal's error, ErrRefused in its chain, its text the
// reason alone.
type refused struct{ error }

func (r refused) Is(target error) bool { return target == ErrRefused }
func (r refused) Unwrap() error        { return r.error }

func (f *File) breakWith(err error) error {
	err = refused{err}
	if f.broken.CompareAndSwap(nil, &err) {
		return err
	}
	return *f.broken.Load()
}

// DropResident releases the file's mapped pages from the process's resident
// set (madvise MADV_DONTNEED on the read-only mapping): bytes handed out stay
// valid and read the same, their pages coming back from the page cache when
// touched. A reader that copied tensors (into its own layout) calls it so
// the copied sources are not resident twice. Nothing happens when the file
// was read into memory instead of mapped, or is closed.
func (f *File) DropResident() error {
	if !f.mapped || f.closed || len(f.data) == 0 {
		return nil
	}
	return dropPages(f.data)
}

// maxDeclaredEnd returns the largest data offset a header declares, ignoring
// all other validation, so that Open can tell a truncated file from a bad header.
func maxDeclaredEnd(header []byte) int64 {
	infos, _, err := ParseHeader(header, 1<<62)
	if err != nil {
		return -1
	}
	var m int64
	for _, t := range infos {
		m = max(m, t.End)
	}
	return m
}

// Path returns the path the file was opened from.
func (f *File) Path() string { return f.path }

// Tensors returns the tensor descriptions keyed by name. The map must not be modified.
func (f *File) Tensors() map[string]TensorInfo { return f.infos }

// Names returns the tensor names in sorted order.
func (f *File) Names() []string {
	names := make([]string, 0, len(f.infos))
	for n := range f.infos {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Metadata returns the header's "__metadata__" map (nil if absent).
func (f *File) Metadata() map[string]string { return f.metadata }

// Info returns the description of the named tensor.
func (f *File) Info(name string) (TensorInfo, bool) {
	t, ok := f.infos[name]
	return t, ok
}

// Bytes returns the raw little-endian bytes of the named tensor. The slice
// aliases the read-only mapping: it must not be written and is only valid
// until Close. On a generated File (NewGenerated) it is a hold on the
// tensor's bytes, valid until Release or Close.
func (f *File) Bytes(name string) ([]byte, error) {
	if f.closed {
		return nil, fmt.Errorf("safetensors %s: file is closed", f.path)
	}
	if e := f.broken.Load(); e != nil {
		return nil, *e
	}
	t, ok := f.infos[name]
	if !ok {
		return nil, fmt.Errorf("safetensors %s: no tensor %s", f.path, name)
	}
	if f.gen != nil {
		return f.gen.acquire(f.path, t)
	}
	b, e := f.dataOff+t.Begin, f.dataOff+t.End
	return f.data[b:e:e], nil
}

// Float32 returns the named tensor converted to a fresh float32 slice
// (float dtypes only).
func (f *File) Float32(name string) ([]float32, error) {
	raw, err := f.Bytes(name)
	if err != nil {
		return nil, err
	}
	defer f.Release(name)
	t := f.infos[name]
	out := make([]float32, t.NumElements())
	if err := ToFloat32(t.DType, raw, out); err != nil {
		return nil, fmt.Errorf("safetensors %s: tensor %s: %w", f.path, name, err)
	}
	return out, nil
}

// Close releases the mapping. Slices returned by Bytes become invalid.
func (f *File) Close() error {
	if f.closed {
		return nil
	}
	f.closed = true
	if f.gen != nil {
		if err := f.gen.close(); err != nil {
			return fmt.Errorf("safetensors %s: %w", f.path, err)
		}
		return nil
	}
	data := f.data
	f.data = nil
	if f.mapped {
		unregister(f)
	}
	if f.fd != nil {
		f.fd.Close()
		f.fd = nil
	}
	if f.unmap != nil {
		if err := f.unmap(data); err != nil {
			return fmt.Errorf("safetensors %s: unmap: %w", f.path, err)
		}
	}
	return nil
}

var errNoMmap = errors.New("mmap not supported")

// forceNoMmap makes Open read files into memory (tests of the fallback path).
var forceNoMmap = false
