// Package paged is a matrix of fixed-width float32 rows held in pages of a
// fixed number of rows: the view the attention kernels read a sequence's
// cached latents and pooled keys through. Row i lives in page i/PageRows
// at row i%PageRows; the pages belong to a pool (core/cache) that hands
// them to sequences as they grow, so consecutive rows are contiguous only
// within a page. Kernels ask for contiguous runs (Span) and gather across
// pages only where they need one block (Gather).
package paged

import "fmt"

// Rows is Len rows of Width floats. With PageRows > 0 they are held in
// Pages (PageRows·Width floats each, in row order); with PageRows = 0 the
// view is unpaged: one page (Pages[0]) holds every row and grows as rows
// are written (a snapshot's form, and a kernel's tests').
type Rows struct {
	Width    int
	PageRows int
	Pages    [][]float32
	Len      int
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
	if r.PageRows > 0 {
		return len(r.Pages) * r.PageRows
	}
	if len(r.Pages) == 0 {
		return 0
	}
	return cap(r.Pages[0]) / r.Width
}

// Row is row i (i < Cap), in place.
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
	if r.SpanRows(i, j) == j-i {
		return r.Span(i, j)
	}
	n := (j - i) * r.Width
	if cap(buf) < n {
		buf = make([]float32, n)
	}
	buf = buf[:n]
	o := 0
	for k := i; k < j; {
		s := r.Span(k, j)
		o += copy(buf[o:], s)
		k += len(s) / r.Width
	}
	return buf
}

// Write copies src (whole rows) to rows i.., which must lie below Cap
// (unpaged: the page grows, at least doubling). Len is not changed.
func (r *Rows) Write(i int, src []float32) error {
	W := r.Width
	if W == 0 || len(src)%W != 0 {
		return fmt.Errorf("paged: writing %d floats as rows of %d", len(src), W)
	}
	n := len(src) / W
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

// Slot returns row i to be written: an unpaged page grows to hold it (at
// least doubling); a paged view must hold it (i < Cap). Len is not changed.
func (r *Rows) Slot(i int) ([]float32, error) {
	W := r.Width
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
	out := make([]float32, 0, r.Len*r.Width)
	for k := 0; k < r.Len; {
		s := r.Span(k, r.Len)
		out = append(out, s...)
		k += len(s) / r.Width
	}
	return out
}

// Clone is an unpaged copy of rows [0, Len).
func (r *Rows) Clone() Rows {
	return Flat(r.Width, r.Flatten())
}
