// Package paged is a matrix of fixed-width float32 rows held in pages of a
// fixed number of rows: the view the attention kernels read a sequence's
// cached latents and pooled keys through. Row i lives in page i/PageRows
// at row i%PageRows; the pages belong to a pool (core/cache) that hands
// them to sequences as they grow, so consecutive rows are contiguous only
// within a page. Kernels ask for contiguous runs (Span, or Read for rows
// of either dtype) and gather across pages only where they need one block
// (Gather).
//
// Rows are fp32, or fp8 (FP8: e4m3 codes with a scale per block of
// FP8Block values, quantized as they are written and dequantized as they
// are read: Read, ReadRow, Gather, Flatten); the in-place views (Row,
// Span, Slot) are fp32's only.
package paged

import "fmt"

// Rows is Len rows of Width floats. With PageRows > 0 they are held in
// Pages (PageRows·Width floats each, in row order); with PageRows = 0 the
// view is unpaged: one page (Pages[0]) holds every row and grows as rows
// are written (a snapshot's form, and a kernel's tests').
//
// FP8 rows hold Codes pages (PageRows·Width bytes each) and Scales pages
// (PageRows·FP8Blocks(Width) floats each) instead of Pages; unpaged, one
// page of each grows.
type Rows struct {
	Width    int
	PageRows int
	Pages    [][]float32
	Len      int
	FP8      bool
	Codes    [][]byte
	Scales   [][]float32
}

// Flat is an unpaged view of data, len(data)/width rows.
func Flat(width int, data []float32) Rows {
	if width <= 0 {
		return Rows{}
	}
	return Rows{Width: width, Pages: [][]float32{data}, Len: len(data) / width}
}

// Paged reports whether the rows are held in pages of PageRows rows.
func (r *Rows) Paged() bool { return r.PageRows > 0 }

// Cap is the number of rows the pages hold (unpaged: the page's capacity).
func (r *Rows) Cap() int {
	if r.Width == 0 {
		return 0
	}
	if r.FP8 {
		if r.PageRows > 0 {
			return len(r.Codes) * r.PageRows
		}
		if len(r.Codes) == 0 {
			return 0
		}
		return cap(r.Codes[0]) / r.Width
	}
	if r.PageRows > 0 {
		return len(r.Pages) * r.PageRows
	}
	if len(r.Pages) == 0 {
		return 0
	}
	return cap(r.Pages[0]) / r.Width
}

// NumPages is the number of pages the rows are held in.
func (r *Rows) NumPages() int {
	if r.FP8 {
		return len(r.Codes)
	}
	return len(r.Pages)
}

// KeepPages drops the pages past the first k (paged rows; Len is cut to
// the rows they hold).
func (r *Rows) KeepPages(k int) {
	if r.FP8 {
		r.Codes, r.Scales = r.Codes[:k], r.Scales[:k]
	} else {
		r.Pages = r.Pages[:k]
	}
	r.Len = min(r.Len, k*r.PageRows)
}

// fp8At is row i's codes and scales (i < Cap).
func (r *Rows) fp8At(i int) ([]byte, []float32) {
	W, nb := r.Width, FP8Blocks(r.Width)
	p, o := 0, i
	if r.PageRows > 0 {
		p, o = i/r.PageRows, i%r.PageRows
	}
	return r.Codes[p][o*W : (o+1)*W], r.Scales[p][o*nb : (o+1)*nb]
}

// ReadRow copies row i (i < Cap) into dst (Width floats), dequantized
// where the rows are fp8.
func (r *Rows) ReadRow(dst []float32, i int) {
	if r.FP8 {
		c, s := r.fp8At(i)
		FP8Dequantize(dst[:r.Width], c, s)
		return
	}
	copy(dst[:r.Width], r.Row(i))
}

// Read is the rows of Span(i, j) as floats: fp32 rows in place, fp8 rows
// dequantized into buf (grown when short). It returns them and buf (its
// new storage where it grew).
func (r *Rows) Read(buf []float32, i, j int) (rows, newBuf []float32) {
	if !r.FP8 {
		return r.Span(i, j), buf
	}
	n := r.SpanRows(i, j)
	W := r.Width
	if cap(buf) < n*W {
		buf = make([]float32, n*W)
	}
	out := buf[:n*W]
	for k := range n {
		r.ReadRow(out[k*W:(k+1)*W], i+k)
	}
	return out, buf
}

// Row is row i (i < Cap), in place (fp32 rows only).
func (r *Rows) Row(i int) []float32 {
	W := r.Width
	if r.PageRows == 0 {
		return r.Pages[0][i*W : (i+1)*W]
	}
	p, o := i/r.PageRows, i%r.PageRows
	return r.Pages[p][o*W : (o+1)*W]
}

// Span is the contiguous run of rows [i, min(j, the end of row i's page)),
// in place (unpaged: [i, j)); i < j ≤ Cap.
func (r *Rows) Span(i, j int) []float32 {
	W := r.Width
	if r.PageRows == 0 {
		return r.Pages[0][i*W : j*W]
	}
	p, o := i/r.PageRows, i%r.PageRows
	e := min(r.PageRows, o+j-i)
	return r.Pages[p][o*W : e*W]
}

// SpanRows is the number of rows Span(i, j) holds.
func (r *Rows) SpanRows(i, j int) int {
	if r.PageRows == 0 {
		return j - i
	}
	return min(r.PageRows-i%r.PageRows, j-i)
}

// Gather returns rows [i, j) contiguous: in place where they lie in one
// page, else copied into buf (grown when short; the returned slice may be
// buf's new storage).
func (r *Rows) Gather(buf []float32, i, j int) []float32 {
	if j <= i {
		return nil
	}
	if !r.FP8 && r.SpanRows(i, j) == j-i {
		return r.Span(i, j)
	}
	n := (j - i) * r.Width
	if cap(buf) < n {
		buf = make([]float32, n)
	}
	buf = buf[:n]
	if r.FP8 {
		for k := i; k < j; k++ {
			r.ReadRow(buf[(k-i)*r.Width:], k)
		}
		return buf
	}
	o := 0
	for k := i; k < j; {
		s := r.Span(k, j)
		o += copy(buf[o:], s)
		k += len(s) / r.Width
	}
	return buf
}

// Write copies src (whole rows) to rows i.., which must lie below Cap
// (unpaged: the page grows, at least doubling); fp8 rows are quantized.
// Len is not changed.
func (r *Rows) Write(i int, src []float32) error {
	W := r.Width
	if W == 0 || len(src)%W != 0 {
		return fmt.Errorf("paged: writing %d floats as rows of %d", len(src), W)
	}
	n := len(src) / W
	if r.FP8 {
		if r.PageRows == 0 {
			r.growFP8(i + n)
		} else if i+n > r.Cap() {
			return fmt.Errorf("paged: rows [%d, %d) pass the %d rows of the sequence's %d pages", i, i+n, r.Cap(), len(r.Codes))
		}
		for k := range n {
			c, s := r.fp8At(i + k)
			FP8Quantize(c, s, src[k*W:(k+1)*W])
		}
		return nil
	}
	if r.PageRows == 0 {
		if len(r.Pages) == 0 {
			r.Pages = [][]float32{nil}
		}
		pg := r.Pages[0]
		if need := (i + n) * W; need > len(pg) {
			if need > cap(pg) {
				g := make([]float32, need, max(need, 2*cap(pg), 256))
				copy(g, pg)
				pg = g
			}
			pg = pg[:need]
		}
		copy(pg[i*W:], src)
		r.Pages[0] = pg
		return nil
	}
	if i+n > r.Cap() {
		return fmt.Errorf("paged: rows [%d, %d) pass the %d rows of the sequence's %d pages", i, i+n, r.Cap(), len(r.Pages))
	}
	for k := i; k < i+n; {
		s := r.Span(k, i+n)
		copy(s, src[(k-i)*W:])
		k += len(s) / W
	}
	return nil
}

// growFP8 grows unpaged fp8 rows to hold n rows (at least doubling).
func (r *Rows) growFP8(n int) {
	W, nb := r.Width, FP8Blocks(r.Width)
	if len(r.Codes) == 0 {
		r.Codes, r.Scales = [][]byte{nil}, [][]float32{nil}
	}
	c, s := r.Codes[0], r.Scales[0]
	if n*W > len(c) {
		if n*W > cap(c) {
			m := max(n, 2*(cap(c)/W), 16)
			g, h := make([]byte, len(c), m*W), make([]float32, len(s), m*nb)
			copy(g, c)
			copy(h, s)
			c, s = g, h
		}
		c, s = c[:n*W], s[:n*nb]
	}
	r.Codes[0], r.Scales[0] = c, s
}

// Slot returns row i to be written: an unpaged page grows to hold it (at
// least doubling); a paged view must hold it (i < Cap). Len is not changed.
// FP8 rows have no row in place to write: they are refused (Write them).
func (r *Rows) Slot(i int) ([]float32, error) {
	W := r.Width
	if r.FP8 {
		return nil, fmt.Errorf("paged: fp8 rows are written whole (Write), not in place")
	}
	if r.PageRows > 0 {
		if i >= r.Cap() {
			return nil, fmt.Errorf("paged: row %d passes the %d rows of the sequence's %d pages", i, r.Cap(), len(r.Pages))
		}
		return r.Row(i), nil
	}
	if len(r.Pages) == 0 {
		r.Pages = [][]float32{nil}
	}
	pg := r.Pages[0]
	if need := (i + 1) * W; need > len(pg) {
		if need > cap(pg) {
			g := make([]float32, need, max(need, 2*cap(pg), 256))
			copy(g, pg)
			pg = g
		}
		r.Pages[0] = pg[:need]
	}
	return r.Row(i), nil
}

// Flatten copies rows [0, Len) into one slice (nil when Width is 0).
func (r *Rows) Flatten() []float32 {
	if r.Width == 0 {
		return nil
	}
	if r.FP8 {
		out := make([]float32, r.Len*r.Width)
		for k := range r.Len {
			r.ReadRow(out[k*r.Width:], k)
		}
		return out
	}
	out := make([]float32, 0, r.Len*r.Width)
	for k := 0; k < r.Len; {
		s := r.Span(k, r.Len)
		out = append(out, s...)
		k += len(s) / r.Width
	}
	return out
}

// Clone is an unpaged fp32 copy of rows [0, Len) (fp8 rows dequantized).
func (r *Rows) Clone() Rows {
	return Flat(r.Width, r.Flatten())
}
