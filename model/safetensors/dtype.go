// Package safetensors reads and writes the safetensors tensor file format
// (https://github.com/huggingface/safetensors): an 8-byte little-endian header
// length, a JSON header describing every tensor, then the raw tensor bytes.
//
// Reading memory-maps the file read-only, so tensor bytes are returned without
// copies. The package also holds the scalar conversions between float32 and the
// stored float formats (F16, BF16, float8 e4m3fn, F64).
package safetensors

import "fmt"

// DType is the element type of a stored tensor.
type DType uint8

// Element types, named as in the safetensors header ("F32", "BF16", "F8_E4M3", ...).
const (
	// Invalid is the zero DType; it never appears in a valid header.
	Invalid DType = iota
	// F32 is IEEE-754 binary32.
	F32
	// F16 is IEEE-754 binary16.
	F16
	// BF16 is bfloat16 (the upper half of a binary32).
	BF16
	// F8E4M3 is float8 e4m3fn (1 sign, 4 exponent bits with bias 7, 3 mantissa
	// bits, no infinities, 0x7F/0xFF are NaN). Header name "F8_E4M3".
	F8E4M3
	// F64 is IEEE-754 binary64.
	F64
	// I64 is a signed 64-bit integer.
	I64
	// I32 is a signed 32-bit integer.
	I32
	// I16 is a signed 16-bit integer.
	I16
	// I8 is a signed 8-bit integer.
	I8
	// U8 is an unsigned 8-bit integer.
	U8
	// BOOL is a one-byte boolean.
	BOOL
)

var dtypeNames = [...]string{
	Invalid: "INVALID",
	F32:     "F32",
	F16:     "F16",
	BF16:    "BF16",
	F8E4M3:  "F8_E4M3",
	F64:     "F64",
	I64:     "I64",
	I32:     "I32",
	I16:     "I16",
	I8:      "I8",
	U8:      "U8",
	BOOL:    "BOOL",
}

var dtypeSizes = [...]int{
	Invalid: 0,
	F32:     4,
	F16:     2,
	BF16:    2,
	F8E4M3:  1,
	F64:     8,
	I64:     8,
	I32:     4,
	I16:     2,
	I8:      1,
	U8:      1,
	BOOL:    1,
}

// String returns the safetensors header name of the type ("F32", "F8_E4M3", ...).
func (d DType) String() string {
	if int(d) < len(dtypeNames) {
		return dtypeNames[d]
	}
	return fmt.Sprintf("DType(%d)", uint8(d))
}

// Size returns the number of bytes of one element, or 0 for an invalid type.
func (d DType) Size() int {
	if int(d) < len(dtypeSizes) {
		return dtypeSizes[d]
	}
	return 0
}

// Valid reports whether d is one of the known element types.
func (d DType) Valid() bool { return d != Invalid && int(d) < len(dtypeNames) }

// IsFloat reports whether d is a floating-point type that ToFloat32 converts.
func (d DType) IsFloat() bool {
	switch d {
	case F32, F16, BF16, F8E4M3, F64:
		return true
	}
	return false
}

// ParseDType parses a safetensors header dtype name. "F8E4M3" is accepted as an
// alias of "F8_E4M3".
func ParseDType(s string) (DType, error) {
	for i, n := range dtypeNames {
		if i != int(Invalid) && n == s {
			return DType(i), nil
		}
	}
	if s == "F8E4M3" {
		return F8E4M3, nil
	}
	return Invalid, fmt.Errorf("unknown dtype %q", s)
}
