package safetensors

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
)

// MaxHeaderSize is the largest JSON header accepted (100 MB), as in the reference library.
const MaxHeaderSize = 100 << 20

// metadataKey is the reserved header key holding free-form string metadata.
const metadataKey = "__metadata__"

// TensorInfo describes one tensor of a safetensors file.
type TensorInfo struct {
	Name  string
	DType DType
	Shape []int
	// Begin and End are byte offsets of the tensor data relative to the start
	// of the data section (the byte after the header).
	Begin, End int64
}

// NumElements returns the product of the shape (1 for a scalar).
func (t TensorInfo) NumElements() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// ByteLen returns End-Begin.
func (t TensorInfo) ByteLen() int64 { return t.End - t.Begin }

type rawTensorInfo struct {
	DType       *string  `json:"dtype"`
	Shape       *[]int64 `json:"shape"`
	DataOffsets *[]int64 `json:"data_offsets"`
}

// ParseHeader parses and validates a safetensors JSON header. dataSize is the
// size in bytes of the data section that follows the header; every tensor
// must lie inside it. It checks that the JSON is one object without duplicate
// keys, that every entry has a known dtype, non-negative dims, ordered offsets
// whose length equals numel×element size, and that no two tensors overlap.
// The "__metadata__" entry, if present, must map strings to strings.
func ParseHeader(header []byte, dataSize int64) (infos map[string]TensorInfo, metadata map[string]string, err error) {
	if len(header) > MaxHeaderSize {
		return nil, nil, fmt.Errorf("header is %d bytes, more than the %d byte limit", len(header), MaxHeaderSize)
	}
	if dataSize < 0 {
		return nil, nil, fmt.Errorf("negative data size %d", dataSize)
	}
	dec := json.NewDecoder(bytes.NewReader(header))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return nil, nil, fmt.Errorf("header is not valid JSON: %w", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, nil, errors.New("header is not a JSON object")
	}
	infos = make(map[string]TensorInfo)
	seen := make(map[string]bool)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, nil, fmt.Errorf("header is not valid JSON: %w", err)
		}
		key, ok := tok.(string)
		if !ok {
			return nil, nil, fmt.Errorf("header is not valid JSON: unexpected %v", tok)
		}
		if seen[key] {
			return nil, nil, fmt.Errorf("header has duplicate key %q", key)
		}
		seen[key] = true
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, nil, fmt.Errorf("header entry %q is not valid JSON: %w", key, err)
		}
		if key == metadataKey {
			metadata, err = parseMetadata(raw)
			if err != nil {
				return nil, nil, err
			}
			continue
		}
		info, err := parseTensorInfo(key, raw, dataSize)
		if err != nil {
			return nil, nil, err
		}
		infos[key] = info
	}
	if _, err := dec.Token(); err != nil { // closing brace
		return nil, nil, fmt.Errorf("header is not valid JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		// Only trailing whitespace (the format's padding) may follow the object.
		return nil, nil, errors.New("header has trailing data after the JSON object")
	}
	if err := checkOverlap(infos); err != nil {
		return nil, nil, err
	}
	return infos, metadata, nil
}

func parseMetadata(raw json.RawMessage) (map[string]string, error) {
	if bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return nil, nil
	}
	var md map[string]string
	if err := json.Unmarshal(raw, &md); err != nil {
		return nil, fmt.Errorf("header %s must map strings to strings: %w", metadataKey, err)
	}
	return md, nil
}

func parseTensorInfo(name string, raw json.RawMessage, dataSize int64) (TensorInfo, error) {
	if name == "" {
		return TensorInfo{}, errors.New("header has a tensor with an empty name")
	}
	var r rawTensorInfo
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return TensorInfo{}, fmt.Errorf("tensor %s: bad header entry: %w", name, err)
	}
	switch {
	case r.DType == nil:
		return TensorInfo{}, fmt.Errorf("tensor %s: header entry has no dtype", name)
	case r.Shape == nil:
		return TensorInfo{}, fmt.Errorf("tensor %s: header entry has no shape", name)
	case r.DataOffsets == nil:
		return TensorInfo{}, fmt.Errorf("tensor %s: header entry has no data_offsets", name)
	}
	dt, err := ParseDType(*r.DType)
	if err != nil {
		return TensorInfo{}, fmt.Errorf("tensor %s: %w", name, err)
	}
	info := TensorInfo{Name: name, DType: dt, Shape: make([]int, len(*r.Shape))}
	numel := int64(1)
	for i, d := range *r.Shape {
		if d < 0 {
			return TensorInfo{}, fmt.Errorf("tensor %s: shape %v has a negative dimension", name, *r.Shape)
		}
		if d != 0 && numel > math.MaxInt64/d {
			return TensorInfo{}, fmt.Errorf("tensor %s: shape %v overflows", name, *r.Shape)
		}
		numel *= d
		info.Shape[i] = int(d)
	}
	offs := *r.DataOffsets
	if len(offs) != 2 {
		return TensorInfo{}, fmt.Errorf("tensor %s: data_offsets %v must have 2 entries", name, offs)
	}
	info.Begin, info.End = offs[0], offs[1]
	if info.Begin < 0 || info.End < info.Begin {
		return TensorInfo{}, fmt.Errorf("tensor %s: data_offsets %v are not ordered", name, offs)
	}
	if info.End > dataSize {
		return TensorInfo{}, fmt.Errorf("tensor %s: data_offsets %v end past the data section (%d bytes)", name, offs, dataSize)
	}
	size := int64(dt.Size())
	if numel > math.MaxInt64/size || numel*size != info.End-info.Begin {
		return TensorInfo{}, fmt.Errorf("tensor %s: %d bytes at data_offsets %v, but shape %v of %s needs %d×%d",
			name, info.End-info.Begin, offs, info.Shape, dt, numel, size)
	}
	return info, nil
}

func checkOverlap(infos map[string]TensorInfo) error {
	list := make([]TensorInfo, 0, len(infos))
	for _, t := range infos {
		list = append(list, t)
	}
	sort.Slice(list, func(i, j int) bool {
		if list[i].Begin != list[j].Begin {
			return list[i].Begin < list[j].Begin
		}
		if list[i].End != list[j].End {
			return list[i].End < list[j].End
		}
		return list[i].Name < list[j].Name
	})
	for i := 1; i < len(list); i++ {
		prev, cur := list[i-1], list[i]
		if cur.Begin < prev.End {
			return fmt.Errorf("tensors %s [%d,%d) and %s [%d,%d) overlap", prev.Name, prev.Begin, prev.End, cur.Name, cur.Begin, cur.End)
		}
	}
	return nil
}
