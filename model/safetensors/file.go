package safetensors

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sort"

	"github.com/glmflash/glmflash/internal/regular"
)

// File is an open safetensors file. Its tensor bytes come from a read-only
// memory mapping (or, where mapping fails, from a copy in memory). A File is
// safe for concurrent readers; Close must not race with them.
type File struct {
	path     string
	data     []byte // whole file
	unmap    func([]byte) error
	dataOff  int64 // offset of the data section within data
	infos    map[string]TensorInfo
	metadata map[string]string
	closed   bool
}

// Open reads the header of the safetensors file at path, validates it and maps
// the file into memory. Every error names the file.
func Open(path string) (*File, error) {
	f, st, err := regular.Open(path) // never blocks on a FIFO or a device
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	defer f.Close()
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
	sf := &File{path: path, dataOff: dataOff, infos: infos, metadata: md}
	var m []byte
	err = errNoMmap
	if !forceNoMmap {
		m, err = mmapFile(f, size)
	}
	if err == nil {
		sf.data, sf.unmap = m, munmap
	} else {
		buf := make([]byte, size)
		if _, err := f.ReadAt(buf, 0); err != nil {
			return nil, fmt.Errorf("safetensors %s: reading: %w", path, err)
		}
		sf.data = buf
	}
	return sf, nil
}

// DropResident releases the file's mapped pages from the process's resident
// set (madvise MADV_DONTNEED on the read-only mapping): bytes handed out stay
// valid and read the same, their pages coming back from the page cache when
// touched. A reader that copied tensors (into its own layout) calls it so
// the copied sources are not resident twice. Nothing happens when the file
// was read into memory instead of mapped, or is closed.
func (f *File) DropResident() error {
	if f.unmap == nil || f.closed || len(f.data) == 0 {
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
// until Close.
func (f *File) Bytes(name string) ([]byte, error) {
	if f.closed {
		return nil, fmt.Errorf("safetensors %s: file is closed", f.path)
	}
	t, ok := f.infos[name]
	if !ok {
		return nil, fmt.Errorf("safetensors %s: no tensor %s", f.path, name)
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
	data := f.data
	f.data = nil
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
