package paged

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/glmflash/glmflash/model/safetensors"
	"github.com/stretchr/testify/require"
)

// The e4m3 codec is the checkpoint loader's: every code decodes to the
// same value, and encoding rounds as safetensors.Float32ToF8E4M3 does over
// every code's neighbourhood, the ties between codes, the subnormals, the
// saturation and the specials.
func TestFP8CodecMatchesSafetensors(t *testing.T) {
	for c := range 256 {
		want, got := safetensors.F8E4M3ToFloat32(uint8(c)), FP8Decode(uint8(c))
		require.Equal(t, math.Float32bits(want), math.Float32bits(got), "code %#x", c)
	}
	check := func(f float32) {
		require.Equal(t, safetensors.Float32ToF8E4M3(f), FP8Encode(f), "%g (bits %#x)", f, math.Float32bits(f))
	}
	for c := range 256 {
		v := FP8Decode(uint8(c))
		if v != v {
			continue
		}
		u := math.Float32bits(v)
		for d := -3; d <= 3; d++ {
			check(math.Float32frombits(u + uint32(d)))
		}
		if c < 0x7e || (c >= 0x80 && c < 0xfe) { // the midpoint to the next code: a tie
			check((v + FP8Decode(uint8(c+1))) / 2)
		}
	}
	for _, f := range []float32{0, float32(math.Copysign(0, -1)), 448, 449, 464, 1e9, -1e9, float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 0x1p-10, 0x1p-9, 0x1.8p-10, -0x1p-7} {
		check(f)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		check(math.Float32frombits(r.Uint32()))
	}
}

// A block's scale is the smallest power of two that brings its largest
// magnitude to at most 448.
func TestFP8Scale(t *testing.T) {
	for _, c := range []struct{ amax, want float32 }{{448, 1}, {449, 2}, {896, 2}, {897, 4}, {1, 0x1p-8}, {0.5, 0x1p-9}, {0.51, 0x1p-9}, {0, 1}, {1e-40, 0x1p-126}} {
		require.Equal(t, c.want, FP8Scale(c.amax), "amax %g", c.amax)
	}
	require.Equal(t, float32(1), FP8Scale(float32(math.Inf(1))))
	require.Equal(t, float32(1), FP8Scale(float32(math.NaN())))
}

// Quantizing a row and reading it back errs by at most half an e4m3 step:
// |x − x'| ≤ max(|x|·2⁻⁴, scale·2⁻¹⁰) per value, with each block's own
// scale (rows of several blocks of very different magnitudes, a last block
// shorter than 128, zeros); the row's relative RMS error stays below 4%.
func TestFP8RoundTripError(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, width := range []int{16, 32, 128, 200, 512} {
		nb := FP8Blocks(width)
		row := make([]float32, width)
		for i := range row {
			mag := math.Pow(10, float64(i/FP8Block%4)-2) // blocks of 0.01 … 10
			row[i] = float32(r.NormFloat64() * mag)
		}
		row[width-1] = 0
		codes, scales, back := make([]byte, width), make([]float32, nb), make([]float32, width)
		FP8Quantize(codes, scales, row)
		FP8Dequantize(back, codes, scales)
		var se, sx float64
		for i, x := range row {
			s := scales[i/FP8Block]
			bound := max(math.Abs(float64(x))/16, float64(s)/1024)
			require.LessOrEqual(t, math.Abs(float64(x-back[i])), bound, "width %d value %d: %g read back as %g (scale %g)", width, i, x, back[i], s)
			se += float64((x - back[i]) * (x - back[i]))
			sx += float64(x * x)
		}
		require.Zero(t, back[width-1])
		rel := math.Sqrt(se / sx)
		t.Logf("width %d: relative RMS error %.4f", width, rel)
		require.Less(t, rel, 0.04)
		for b := range nb {
			var amax float32
			for _, x := range row[b*FP8Block : min((b+1)*FP8Block, width)] {
				amax = max(amax, float32(math.Abs(float64(x))))
			}
			require.Equal(t, FP8Scale(amax), scales[b], "block %d", b)
		}
	}
}

// fp8Rows is n rows of width values, paged (pages of per rows, in
// shuffled page order) or unpaged (per 0), written from src.
func fp8Rows(t *testing.T, width, per, n int, src []float32) *Rows {
	t.Helper()
	r := &Rows{Width: width, PageRows: per, FP8: true}
	if per > 0 {
		np := (n + per - 1) / per
		nb := FP8Blocks(width)
		codes, scales := make([]byte, np*per*width), make([]float32, np*per*nb)
		for _, p := range rand.New(rand.NewPCG(5, 6)).Perm(np) {
			r.Codes = append(r.Codes, codes[p*per*width:(p+1)*per*width])
			r.Scales = append(r.Scales, scales[p*per*nb:(p+1)*per*nb])
		}
	}
	// written in uneven pieces, across page ends
	for i := 0; i < n; {
		k := min(n-i, 1+i%3)
		require.NoError(t, r.Write(i, src[i*width:(i+k)*width]))
		i += k
	}
	r.Len = n
	return r
}

// FP8 rows read back (ReadRow, Read, Gather, Flatten) the round trip of
// what was written, paged across page ends or unpaged; the in-place
// write (Slot) is refused, and a write past the pages fails.
func TestFP8Rows(t *testing.T) {
	const width, n = 40, 23
	r := rand.New(rand.NewPCG(7, 8))
	src := make([]float32, n*width)
	for i := range src {
		src[i] = float32(r.NormFloat64())
	}
	want := make([]float32, n*width)
	for i := range n {
		codes, scales := make([]byte, width), make([]float32, FP8Blocks(width))
		FP8Quantize(codes, scales, src[i*width:(i+1)*width])
		FP8Dequantize(want[i*width:(i+1)*width], codes, scales)
	}
	for _, per := range []int{0, 1, 4, 5} {
		rows := fp8Rows(t, width, per, n, src)
		require.Equal(t, want, rows.Flatten(), "pages of %d", per)
		cl := rows.Clone()
		require.Equal(t, want, cl.Flatten())
		require.False(t, cl.FP8, "a clone is fp32")
		row := make([]float32, width)
		for i := range n {
			rows.ReadRow(row, i)
			require.Equal(t, want[i*width:(i+1)*width], row)
		}
		var buf []float32
		for i := 0; i < n; {
			got, nb := rows.Read(buf, i, n)
			buf = nb
			k := rows.SpanRows(i, n)
			require.Len(t, got, k*width)
			require.Equal(t, want[i*width:(i+k)*width], got)
			i += k
		}
		require.Equal(t, want[3*width:17*width], rows.Gather(nil, 3, 17))
		_, err := rows.Slot(0)
		require.ErrorContains(t, err, "fp8 rows are written whole")
		if per > 0 {
			require.Error(t, rows.Write(rows.Cap(), make([]float32, width)))
			rows.KeepPages(2)
			require.Equal(t, 2, rows.NumPages())
			require.Equal(t, min(n, 2*per), rows.Len)
		}
	}
}
