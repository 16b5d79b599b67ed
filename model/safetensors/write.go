package safetensors

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
)

// WriteTensor is one tensor to write. Data holds the raw little-endian bytes
// (numel × DType.Size()).
type WriteTensor struct {
	Name  string
	DType DType
	Shape []int
	Data  []byte
}

// Write writes a safetensors file holding tensors (data laid out in the
// given order) and optional string metadata. Header keys are sorted and the
// header is padded with spaces to a multiple of 8 bytes, like the reference
// Python library. The file is written to a temporary name and renamed into
// place, so a failed write leaves no partial file at path.
func Write(path string, tensors []WriteTensor, metadata map[string]string) error {
	w, err := NewWriter(path, tensors, metadata)
	if err != nil {
		return err
	}
	for _, t := range tensors {
		if err := w.WriteTensor(t.Name, t.Data); err != nil {
			w.Abort()
			return err
		}
	}
	return w.Close()
}

// Writer writes a safetensors file whose tensor list is known in advance,
// one tensor at a time, so that large files never need to be held in memory.
// Tensors must be written in the order they were declared.
type Writer struct {
	path  string
	tmp   string
	f     *os.File
	bw    *bufio.Writer
	specs []WriteTensor
	next  int
	err   error
}

// NewWriter creates path (through a temporary file) and writes the header for
// tensors; the Data fields of tensors are ignored. Call WriteTensor for each
// tensor in order, then Close (or Abort).
func NewWriter(path string, tensors []WriteTensor, metadata map[string]string) (*Writer, error) {
	header, err := encodeHeader(tensors, metadata)
	if err != nil {
		return nil, fmt.Errorf("safetensors %s: %w", path, err)
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return nil, fmt.Errorf("safetensors %s: %w", path, err)
	}
	w := &Writer{path: path, tmp: f.Name(), f: f, bw: bufio.NewWriterSize(f, 1<<20), specs: tensors}
	var lenBuf [8]byte
	binary.LittleEndian.PutUint64(lenBuf[:], uint64(len(header)))
	if _, err := w.bw.Write(lenBuf[:]); err != nil {
		w.Abort()
		return nil, fmt.Errorf("safetensors %s: %w", path, err)
	}
	if _, err := w.bw.Write(header); err != nil {
		w.Abort()
		return nil, fmt.Errorf("safetensors %s: %w", path, err)
	}
	return w, nil
}

// WriteTensor writes the data of the next declared tensor, which must be name.
func (w *Writer) WriteTensor(name string, data []byte) error {
	if w.err != nil {
		return w.err
	}
	if w.next >= len(w.specs) {
		return fmt.Errorf("safetensors %s: tensor %s was not declared (or written twice)", w.path, name)
	}
	spec := w.specs[w.next]
	if spec.Name != name {
		return fmt.Errorf("safetensors %s: tensor %s written out of order, expected %s", w.path, name, spec.Name)
	}
	if want := tensorBytes(spec); int64(len(data)) != want {
		return fmt.Errorf("safetensors %s: tensor %s: %d bytes, shape %v of %s needs %d", w.path, name, len(data), spec.Shape, spec.DType, want)
	}
	if _, err := w.bw.Write(data); err != nil {
		w.err = fmt.Errorf("safetensors %s: %w", w.path, err)
		return w.err
	}
	w.next++
	return nil
}

// Close checks that every declared tensor was written, flushes the file and
// renames it into place.
func (w *Writer) Close() error {
	if w.err != nil {
		w.Abort()
		return w.err
	}
	if w.next != len(w.specs) {
		err := fmt.Errorf("safetensors %s: only %d of %d tensors written (next: %s)", w.path, w.next, len(w.specs), w.specs[w.next].Name)
		w.Abort()
		return err
	}
	err := w.bw.Flush()
	if err == nil {
		err = w.f.Close()
	} else {
		w.f.Close()
	}
	if err == nil {
		err = os.Rename(w.tmp, w.path)
	}
	if err != nil {
		os.Remove(w.tmp)
		w.err = fmt.Errorf("safetensors %s: %w", w.path, err)
		return w.err
	}
	w.err = errors.New("safetensors: writer is closed")
	return nil
}

// Abort discards the partially written file.
func (w *Writer) Abort() {
	if w.f != nil {
		w.f.Close()
		os.Remove(w.tmp)
		w.f = nil
	}
	if w.err == nil {
		w.err = errors.New("safetensors: writer was aborted")
	}
}

func tensorBytes(t WriteTensor) int64 {
	n := int64(t.DType.Size())
	for _, d := range t.Shape {
		n *= int64(d)
	}
	return n
}

type headerEntry struct {
	DType       string  `json:"dtype"`
	Shape       []int   `json:"shape"`
	DataOffsets []int64 `json:"data_offsets"`
}

// encodeHeader builds the padded JSON header for tensors laid out in order.
func encodeHeader(tensors []WriteTensor, metadata map[string]string) ([]byte, error) {
	entries := make(map[string]headerEntry, len(tensors))
	var off int64
	for _, t := range tensors {
		switch {
		case t.Name == "":
			return nil, errors.New("tensor with an empty name")
		case t.Name == metadataKey:
			return nil, fmt.Errorf("tensor name %q is reserved", metadataKey)
		case !t.DType.Valid():
			return nil, fmt.Errorf("tensor %s: invalid dtype %s", t.Name, t.DType)
		}
		if _, dup := entries[t.Name]; dup {
			return nil, fmt.Errorf("tensor %s is listed twice", t.Name)
		}
		n := int64(t.DType.Size())
		for _, d := range t.Shape {
			if d < 0 {
				return nil, fmt.Errorf("tensor %s: shape %v has a negative dimension", t.Name, t.Shape)
			}
			if d != 0 && n > math.MaxInt64/int64(d) {
				return nil, fmt.Errorf("tensor %s: shape %v overflows", t.Name, t.Shape)
			}
			n *= int64(d)
		}
		shape := t.Shape
		if shape == nil {
			shape = []int{}
		}
		entries[t.Name] = headerEntry{DType: t.DType.String(), Shape: shape, DataOffsets: []int64{off, off + n}}
		off += n
	}
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	buf.WriteByte('{')
	first := true
	writeKV := func(k string, v any) error {
		if !first {
			buf.WriteByte(',')
		}
		first = false
		kb, err := json.Marshal(k)
		if err != nil {
			return err
		}
		vb, err := json.Marshal(v)
		if err != nil {
			return err
		}
		buf.Write(kb)
		buf.WriteByte(':')
		buf.Write(vb)
		return nil
	}
	if len(metadata) > 0 {
		if err := writeKV(metadataKey, metadata); err != nil { // map keys are marshalled sorted
			return nil, err
		}
	}
	for _, n := range names {
		if err := writeKV(n, entries[n]); err != nil {
			return nil, err
		}
	}
	buf.WriteByte('}')
	for buf.Len()%8 != 0 {
		buf.WriteByte(' ')
	}
	if buf.Len() > MaxHeaderSize {
		return nil, fmt.Errorf("header of %d bytes exceeds the %d byte limit", buf.Len(), MaxHeaderSize)
	}
	return buf.Bytes(), nil
}
