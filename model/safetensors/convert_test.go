package safetensors

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestF8E4M3KnownValues(t *testing.T) {
	cases := map[uint8]float32{
		0x00: 0, 0x38: 1, 0xB8: -1, 0x7E: 448, 0xFE: -448, 0x01: 1.0 / 512, 0x07: 7.0 / 512,
		0x08: 1.0 / 64, 0x40: 2, 0x3C: 1.5, 0x77: 240, 0x30: 0.5,
	}
	for code, want := range cases {
		assert.Equal(t, want, F8E4M3ToFloat32(code), "code %#02x", code)
		assert.Equal(t, code, Float32ToF8E4M3(want), "value %v", want)
	}
	assert.True(t, math.IsNaN(float64(F8E4M3ToFloat32(0x7F))))
	assert.True(t, math.IsNaN(float64(F8E4M3ToFloat32(0xFF))))
	assert.Equal(t, uint32(0x80000000), math.Float32bits(F8E4M3ToFloat32(0x80)), "negative zero")
}

func TestF8E4M3AllCodesRoundTrip(t *testing.T) {
	for c := 0; c < 256; c++ {
		code := uint8(c)
		v := F8E4M3ToFloat32(code)
		assert.Equal(t, code, Float32ToF8E4M3(v), "code %#02x value %v", code, v)
	}
}

// refF8 is a brute-force reference: nearest finite e4m3fn code, ties to the
// even code, saturating at 448.
func refF8(f float32) uint8 {
	if math.IsNaN(float64(f)) {
		if math.Signbit(float64(f)) {
			return 0xFF
		}
		return 0x7F
	}
	var sign uint8
	a := float64(f)
	if math.Signbit(a) {
		sign, a = 0x80, -a
	}
	if a >= 448 {
		return sign | 0x7E
	}
	best, bestErr := uint8(0), math.Inf(1)
	for c := 0; c <= 0x7E; c++ {
		e := math.Abs(float64(F8E4M3ToFloat32(uint8(c))) - a)
		if e < bestErr || (e == bestErr && c%2 == 0) {
			best, bestErr = uint8(c), e
		}
	}
	return sign | best
}

func TestFloat32ToF8E4M3MatchesReference(t *testing.T) {
	var inputs []float32
	for c := 0; c < 0x7E; c++ {
		lo, hi := F8E4M3ToFloat32(uint8(c)), F8E4M3ToFloat32(uint8(c+1))
		mid := float32((float64(lo) + float64(hi)) / 2) // exact in float32
		inputs = append(inputs, mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, 1000), lo, hi)
	}
	inputs = append(inputs, 447.99, 448, 449, 463.99, 464, 465, 480, 1e6, float32(math.Inf(1)),
		1e-30, 1.0/1024, 1.0/1024+1e-9, 3.0/1024, 0, math.SmallestNonzeroFloat32, math.MaxFloat32)
	r := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		inputs = append(inputs, float32(r.NormFloat64()*math.Pow(2, float64(r.IntN(24)-14))))
	}
	for _, v := range inputs {
		for _, s := range []float32{v, -v} {
			require.Equal(t, refF8(s), Float32ToF8E4M3(s), "value %v (%#08x)", s, math.Float32bits(s))
		}
	}
	assert.Equal(t, uint8(0xFE), Float32ToF8E4M3(float32(math.Inf(-1))))
	assert.Equal(t, uint8(0x7F), Float32ToF8E4M3(float32(math.NaN())))
}

func TestBF16AllPatternsRoundTrip(t *testing.T) {
	for i := 0; i < 1<<16; i++ {
		b := uint16(i)
		f := BF16ToFloat32(b)
		got := Float32ToBF16(f)
		if math.IsNaN(float64(f)) {
			require.True(t, math.IsNaN(float64(BF16ToFloat32(got))), "NaN %#04x", b)
			require.Equal(t, b&0x8000, got&0x8000, "NaN sign %#04x", b)
			continue
		}
		require.Equal(t, b, got, "pattern %#04x", b)
	}
}

func TestBF16RoundNearestEven(t *testing.T) {
	cases := []struct {
		in   uint32
		want uint16
	}{
		{0x3F808000, 0x3F80}, // tie, lower is even
		{0x3F818000, 0x3F82}, // tie, upper is even
		{0x3F808001, 0x3F81}, // just above tie
		{0x3F807FFF, 0x3F80}, // just below tie
		{0xBF818000, 0xBF82}, // negative tie
		{0x7F7FFFFF, 0x7F80}, // overflow to +Inf
		{0x7F800000, 0x7F80}, // +Inf
		{0x00000001, 0x0000}, // tiny subnormal
		{0x00008000, 0x0000}, // subnormal tie to even
		{0x00018000, 0x0002}, // subnormal tie to even (up)
	}
	for _, c := range cases {
		assert.Equal(t, c.want, Float32ToBF16(math.Float32frombits(c.in)), "input %#08x", c.in)
	}
	nan := Float32ToBF16(math.Float32frombits(0x7F800001)) // signalling NaN with low payload
	assert.True(t, math.IsNaN(float64(BF16ToFloat32(nan))))
	negNaN := Float32ToBF16(math.Float32frombits(0xFFC00000))
	assert.True(t, math.IsNaN(float64(BF16ToFloat32(negNaN))))
	assert.Equal(t, uint16(0x8000), negNaN&0x8000)

	r := rand.New(rand.NewPCG(3, 4))
	for range 100000 {
		u := r.Uint32()
		f := math.Float32frombits(u)
		if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
			continue
		}
		got := Float32ToBF16(f)
		lo := uint16(u >> 16)
		hi := lo + 1
		dlo := math.Abs(float64(BF16ToFloat32(lo)) - float64(f))
		dhi := math.Abs(float64(BF16ToFloat32(hi)) - float64(f))
		if math.IsInf(float64(BF16ToFloat32(hi)), 0) {
			// Overflow: the rounding boundary is the midpoint to 2^128.
			dhi = math.Abs(math.Ldexp(1, 128)*sign(f) - float64(f))
		}
		want := lo
		if dhi < dlo || (dhi == dlo && hi%2 == 0) {
			want = hi
		}
		require.Equal(t, want, got, "input %#08x", u)
	}
}

func sign(f float32) float64 {
	if f < 0 {
		return -1
	}
	return 1
}

func TestF16AllPatternsRoundTrip(t *testing.T) {
	for i := 0; i < 1<<16; i++ {
		h := uint16(i)
		f := F16ToFloat32(h)
		got := Float32ToF16(f)
		if math.IsNaN(float64(f)) {
			require.True(t, math.IsNaN(float64(F16ToFloat32(got))), "NaN %#04x", h)
			require.Equal(t, h&0x8000, got&0x8000)
			continue
		}
		require.Equal(t, h, got, "pattern %#04x value %v", h, f)
	}
	assert.Equal(t, float32(65504), F16ToFloat32(0x7BFF))
	assert.Equal(t, float32(1), F16ToFloat32(0x3C00))
	assert.Equal(t, float32(math.Ldexp(1, -24)), F16ToFloat32(0x0001))
	assert.True(t, math.IsInf(float64(F16ToFloat32(0xFC00)), -1))
}

func TestFloat32ToF16MatchesReference(t *testing.T) {
	// All finite non-negative half values, ascending with their codes.
	var vals []float64
	for c := 0; c <= 0x7BFF; c++ {
		vals = append(vals, float64(F16ToFloat32(uint16(c))))
	}
	ref := func(f float32) uint16 {
		a := math.Abs(float64(f))
		var s uint16
		if math.Signbit(float64(f)) {
			s = 0x8000
		}
		if a >= 65520 {
			return s | 0x7C00
		}
		i := sort.SearchFloat64s(vals, a)
		if i < len(vals) && vals[i] == a {
			return s | uint16(i)
		}
		lo, hi := i-1, i
		if hi == len(vals) {
			return s | uint16(lo)
		}
		dlo, dhi := a-vals[lo], vals[hi]-a
		if dhi < dlo || (dhi == dlo && hi%2 == 0) {
			return s | uint16(hi)
		}
		return s | uint16(lo)
	}
	r := rand.New(rand.NewPCG(5, 6))
	var inputs []float32
	for c := 0; c < 0x7BFF; c++ {
		mid := float32((vals[c] + vals[c+1]) / 2)
		inputs = append(inputs, mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, 1e9))
	}
	for range 100000 {
		inputs = append(inputs, float32(r.NormFloat64()*math.Pow(2, float64(r.IntN(44)-28))))
	}
	inputs = append(inputs, 65519.99, 65520, 1e9, float32(math.Ldexp(1, -25)), float32(math.Ldexp(1.0000001, -25)), 1e-30)
	for _, v := range inputs {
		for _, s := range []float32{v, -v} {
			require.Equal(t, ref(s), Float32ToF16(s), "value %v (%#08x)", s, math.Float32bits(s))
		}
	}
	assert.Equal(t, uint16(0x7C00), Float32ToF16(float32(math.Inf(1))))
	assert.True(t, math.IsNaN(float64(F16ToFloat32(Float32ToF16(float32(math.NaN()))))))
}

func TestToFloat32AllDTypes(t *testing.T) {
	want := []float32{0, 1, -2.5, 0.375, 448, -0.015625}
	for _, dt := range []DType{F32, F16, BF16, F8E4M3, F64} {
		raw := make([]byte, len(want)*dt.Size())
		require.NoError(t, FromFloat32(dt, want, raw), dt.String())
		got := make([]float32, len(want))
		require.NoError(t, ToFloat32(dt, raw, got), dt.String())
		assert.Equal(t, want, got, dt.String())
	}
	// Hand-encoded little-endian bytes.
	raw := make([]byte, 8)
	binary.LittleEndian.PutUint32(raw, math.Float32bits(3.5))
	binary.LittleEndian.PutUint16(raw[4:], 0x3FC0) // bf16 1.5
	got := make([]float32, 1)
	require.NoError(t, ToFloat32(F32, raw[:4], got))
	assert.Equal(t, float32(3.5), got[0])
	require.NoError(t, ToFloat32(BF16, raw[4:6], got))
	assert.Equal(t, float32(1.5), got[0])
}

func TestToFloat32Errors(t *testing.T) {
	err := ToFloat32(I32, make([]byte, 4), make([]float32, 1))
	require.ErrorContains(t, err, "I32")
	err = ToFloat32(BF16, make([]byte, 3), make([]float32, 2))
	require.ErrorContains(t, err, "3 bytes of BF16")
	err = FromFloat32(U8, []float32{1}, make([]byte, 1))
	require.ErrorContains(t, err, "U8")
	err = FromFloat32(F32, []float32{1}, make([]byte, 3))
	require.Error(t, err)
}

func TestDType(t *testing.T) {
	all := []DType{F32, F16, BF16, F8E4M3, F64, I64, I32, I16, I8, U8, BOOL}
	sizes := []int{4, 2, 2, 1, 8, 8, 4, 2, 1, 1, 1}
	for i, d := range all {
		got, err := ParseDType(d.String())
		require.NoError(t, err)
		assert.Equal(t, d, got)
		assert.Equal(t, sizes[i], d.Size(), d.String())
		assert.True(t, d.Valid())
	}
	assert.Equal(t, "F8_E4M3", F8E4M3.String())
	d, err := ParseDType("F8E4M3")
	require.NoError(t, err)
	assert.Equal(t, F8E4M3, d)
	_, err = ParseDType("F4")
	assert.ErrorContains(t, err, `"F4"`)
	assert.Equal(t, 0, Invalid.Size())
	assert.False(t, Invalid.Valid())
	assert.Equal(t, "DType(200)", DType(200).String())
	assert.Equal(t, 0, DType(200).Size())
	assert.True(t, BF16.IsFloat())
	assert.False(t, I8.IsFloat())
}
