// Package indexer implements the DSA lightning indexer with k-pool
// compression: keys of kpool consecutive positions are pooled with a learned
// per-channel softmax, each query scores the complete pools it can see, keeps
// the best ones, and always attends the incomplete tail pool.
package indexer

import (
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/glmflash/glmflash/kernels/gemm"
	"github.com/glmflash/glmflash/kernels/paged"
	"github.com/glmflash/glmflash/kernels/parallel"
)

// Config holds one indexer's geometry.
type Config struct {
	Heads      int       // index_n_heads
	Dim        int       // index_head_dim
	KPool      int       // index_kpool
	TopK       int       // index_topk (tokens; TopK/KPool pools are kept)
	SelectTail bool      // index_kpool_always_select_tail
	APE        []float32 // index_kpool_compress_ape [KPool][Dim]
}

// Width is the number of positions a selection row holds: TopK plus the
// largest possible tail (KPool−1). Unused entries are −1.
func (c *Config) Width() int { return c.TopK/c.KPool*c.KPool + c.KPool - 1 }

// State is one sequence's indexer cache for one layer: pooled keys of the
// complete pools and the raw key/gate rows of the pending incomplete pool.
type State struct {
	// Pools holds a row of Dim floats per complete pool (Pools.Len pools):
	// in the sequence's pages (a page of P tokens holds P/KPool pools), or
	// unpaged (a zero State grows one page as pools complete).
	Pools paged.Rows
	// Pools.FP8 holds them as e4m3 with a scale per block (kv dtype fp8):
	// a pooled key is quantized as its pool completes and dequantized as
	// Select scores it; the pending rows stay fp32.
	PendK []float32 // [nPend][Dim]
	PendG []float32 // [nPend][Dim]
	// Share is a saved selection row (positions, −1 padded) made for the
	// query at position SharePos, which later queries may reuse (the MTP
	// layer's index_share_for_mtp_iteration); empty when none is saved.
	Share    []int32
	SharePos int
	key      []float32 // an fp8 state's pooled key before it is quantized
}

// NumPools is the number of complete pools cached.
func (s *State) NumPools() int { return s.Pools.Len }

// Reset empties the state (its pages stay attached: the owner of the pages
// detaches them).
func (s *State) Reset() {
	s.Pools.Len = 0
	s.PendK, s.PendG, s.Share = s.PendK[:0], s.PendG[:0], s.Share[:0]
}

// SaveShare keeps row, the selection made for the query at position pos,
// for later queries to reuse (SelectShared).
func (s *State) SaveShare(row []int32, pos int) {
	s.Share = append(s.Share[:0], row...)
	s.SharePos = pos
}

// SelectShared fills sel ([T][width]) for T queries from position pos0
// without scoring: each row is the saved selection's positions followed by
// every position in (SharePos, pos], ascending like Select's rows, then −1
// padding. Where the saved selection held every position up to SharePos
// (no pool was left out), this is exactly what Select gives. It fails when
// no selection is saved, a query precedes it, or a row would not fit.
func SelectShared(sel []int32, width int, st *State, pos0, T int) error {
	if len(st.Share) == 0 {
		return fmt.Errorf("indexer: no saved selection to share")
	}
	for j := 0; j < T; j++ {
		pos := pos0 + j
		if pos <= st.SharePos {
			return fmt.Errorf("indexer: query at position %d does not follow the saved selection's position %d", pos, st.SharePos)
		}
		row := sel[j*width : (j+1)*width]
		o := 0
		for _, p := range st.Share {
			if p >= 0 {
				if o == width {
					return fmt.Errorf("indexer: a shared selection row holds more than %d positions", width)
				}
				row[o] = p
				o++
			}
		}
		for p := st.SharePos + 1; p <= pos; p++ {
			if o == width {
				return fmt.Errorf("indexer: the shared selection at position %d needs more than %d positions (%d steps after position %d)", pos, width, pos-st.SharePos, st.SharePos)
			}
			row[o] = int32(p)
			o++
		}
		for ; o < width; o++ {
			row[o] = -1
		}
	}
	return nil
}

// PoolKey writes key[c] = Σ_j softmax_j(gate[j][c]+ape[j][c])·k[j][c].
func (c *Config) PoolKey(key, k, gate []float32) {
	D, P := c.Dim, c.KPool
	var lb [16]float64
	var l []float64
	if P <= len(lb) {
		l = lb[:P]
	} else {
		l = make([]float64, P)
	}
	for ch := 0; ch < D; ch++ {
		mx := math.Inf(-1)
		for j := 0; j < P; j++ {
			l[j] = float64(gate[j*D+ch] + c.APE[j*D+ch])
			mx = math.Max(mx, l[j])
		}
		var s, acc float64
		for j := 0; j < P; j++ {
			e := math.Exp(l[j] - mx)
			s += e
			acc += e * float64(k[j*D+ch])
		}
		key[ch] = float32(acc / s)
	}
}

// Append adds T new tokens' keys and gates ([T][Dim]) for a sequence whose
// first new token is at absolute position pos0, pooling every pool they
// complete. visible[j] receives the number of complete pools that token j
// can see (pools ending at or before it); nil skips that (the batch
// metadata already holds it). A paged state must hold the pages of the
// pools the tokens complete (the store takes them before the run); an
// error says which pool did not fit, with every earlier one appended.
func (c *Config) Append(st *State, pos0 int, k, gate []float32, T int, visible []int) error {
	D := c.Dim
	if st.Pools.Width == 0 {
		st.Pools.Width = D
	}
	for j := 0; j < T; j++ {
		st.PendK = append(st.PendK, k[j*D:(j+1)*D]...)
		st.PendG = append(st.PendG, gate[j*D:(j+1)*D]...)
		if len(st.PendK) == c.KPool*D {
			n := st.Pools.Len
			if st.Pools.FP8 {
				if cap(st.key) < D {
					st.key = make([]float32, D)
				}
				c.PoolKey(st.key[:D], st.PendK, st.PendG)
				if err := st.Pools.Write(n, st.key[:D]); err != nil {
					return fmt.Errorf("indexer: pool %d: %w", n, err)
				}
			} else {
				dst, err := st.Pools.Slot(n)
				if err != nil {
					return fmt.Errorf("indexer: pool %d: %w", n, err)
				}
				c.PoolKey(dst, st.PendK, st.PendG)
			}
			st.Pools.Len = n + 1
			st.PendK, st.PendG = st.PendK[:0], st.PendG[:0]
		}
		if visible != nil {
			visible[j] = (pos0 + j + 1) / c.KPool
		}
	}
	return nil
}

// queryBlock is the number of queries Select scores with one GEMM.
const queryBlock = 8

// Select fills sel ([T][Width]) for T queries of one sequence: q is
// [T][Heads·Dim], w ([T][Heads]) the per-head weights already multiplied by
// Heads^−½, visible from Append, pos0 the first query's position. Each row
// lists the positions of the best min(TopK/KPool, visible) pools by
// Σ_h w[h]·ReLU(q_h·key·Dim^−½) (ties: lower pool first; a NaN score ranks
// last), in ascending pool order, then the tail positions
// [KPool·visible, pos].
//
// A query that sees no more pools than it keeps takes them all without
// scoring. The others are scored in blocks of queryBlock queries: one GEMM
// of the block's Heads·queryBlock query heads against the cached pooled
// keys the block can see (gemm.MatMulT; its dot products are those of every
// other GEMM in the engine), then the head reduction in head order, then a
// partial selection (TopPools) instead of a full sort.
func (c *Config) Select(sel []int32, st *State, pos0 int, q, w []float32, T int, visible []int) {
	nb := (T + queryBlock - 1) / queryBlock
	inner := nb < parallel.Workers // few blocks (decode): parallelise each GEMM instead
	a := selectArgs{c, sel, st, pos0, q, w, T, visible, inner}
	if inner {
		a.Run(0, nb)
		return
	}
	parallel.ForArgs(&selectPool, nb, 1, a)
}

// selectArgs is one Select call; Run scores query blocks [lo, hi).
type selectArgs struct {
	c       *Config
	sel     []int32
	st      *State
	pos0    int
	q, w    []float32
	T       int
	visible []int
	inner   bool
}

var selectPool parallel.Pool[selectArgs]

// selectScratch is a worker's scratch for Select's blocks.
type selectScratch struct {
	dots, scores []float32
	keys         []float32 // fp8 pooled keys, dequantized
	order        []int32
}

var selectScratches = sync.Pool{New: func() any { return new(selectScratch) }}

func (a *selectArgs) Run(lo, hi int) {
	sc := selectScratches.Get().(*selectScratch)
	defer selectScratches.Put(sc)
	for b := lo; b < hi; b++ {
		a.block(sc, b)
	}
}

func (a *selectArgs) block(sc *selectScratch, b int) {
	c, sel, st, pos0, q, w, T, visible, inner := a.c, a.sel, a.st, a.pos0, a.q, a.w, a.T, a.visible, a.inner
	H, D, W := c.Heads, c.Dim, c.Width()
	scale := float32(1 / math.Sqrt(float64(D)))
	keep := c.TopK / c.KPool
	var dots []float32
	scores, order := sc.scores, sc.order
	defer func() { sc.scores, sc.order = scores, order }()
	j0, j1 := b*queryBlock, min((b+1)*queryBlock, T)
	// the pools the block's scored queries can see
	nMax := 0
	for j := j0; j < j1; j++ {
		if visible[j] > keep {
			nMax = max(nMax, visible[j])
		}
	}
	if nMax > 0 {
		rows := (j1 - j0) * H
		if cap(sc.dots) < rows*nMax {
			sc.dots = make([]float32, 2*rows*nMax) // headroom: nMax grows with the context
		}
		dots = sc.dots[:rows*nMax]
		// one GEMM per page's run of pooled keys: the run of pools
		// [p0, p0+kc) writes dots[p0·rows:] as [rows][kc]
		x := q[j0*H*D : j1*H*D]
		for p0 := 0; p0 < nMax; {
			var keys []float32
			keys, sc.keys = st.Pools.Read(sc.keys, p0, nMax)
			kc := len(keys) / D
			d := dots[p0*rows : (p0+kc)*rows]
			if inner {
				gemm.MatMulT(d, x, rows, D, keys, kc)
			} else {
				gemm.MatMulTSerial(d, x, rows, D, keys, kc)
			}
			p0 += kc
		}
	}
	for j := j0; j < j1; j++ {
		row := sel[j*W : (j+1)*W]
		for i := range row {
			row[i] = -1
		}
		n := visible[j]
		o := 0
		if n <= keep {
			for pos := 0; pos < n*c.KPool; pos++ {
				row[o] = int32(pos)
				o++
			}
		} else {
			if cap(scores) < n {
				scores = make([]float32, 2*n)
			}
			scores = scores[:n]
			clear(scores)
			wj := w[j*H : (j+1)*H]
			rows := (j1 - j0) * H
			for h := 0; h < H; h++ {
				r := (j-j0)*H + h
				for p0 := 0; p0 < n; {
					kc := st.Pools.SpanRows(p0, nMax) // the GEMM's runs
					d := dots[p0*rows+r*kc:]
					for p := p0; p < min(p0+kc, n); p++ {
						if v := d[p-p0] * scale; v > 0 {
							scores[p] += wj[h] * v
						}
					}
					p0 += kc
				}
			}
			order = TopPools(order, scores, keep)
			for _, p := range order {
				for x := 0; x < c.KPool; x++ {
					row[o] = int32(int(p)*c.KPool + x)
					o++
				}
			}
		}
		if c.SelectTail {
			for pos := n * c.KPool; pos <= pos0+j; pos++ {
				row[o] = int32(pos)
				o++
			}
		}
	}
}

// better reports whether pool a ranks before pool b: the higher score, ties
// to the lower pool, a NaN score below every number.
func better(scores []float32, a, b int32) bool {
	sa, sb := scores[a], scores[b]
	if sa != sb {
		if sb != sb { // NaN
			return sa == sa || a < b
		}
		if sa != sa {
			return false
		}
		return sa > sb
	}
	return a < b
}

// TopPools returns (in buf's storage) the k best pools of scores in
// ascending pool order, the same set a stable sort by descending score
// would put first (ties to the lower pool), found by quickselect in
// expected O(len(scores)) time without sorting the rest; k ≥ len(scores)
// returns every pool.
func TopPools(buf []int32, scores []float32, k int) []int32 {
	n := len(scores)
	buf = buf[:0]
	for p := 0; p < n; p++ {
		buf = append(buf, int32(p))
	}
	if k >= n {
		return buf
	}
	if k <= 0 {
		return buf[:0]
	}
	// quickselect: afterwards buf[:k] holds the k best. better is a strict
	// total order (ties broken by pool), so there are no equal elements.
	lo, hi := 0, n-1
	for lo < hi {
		// median of three as the pivot, moved to hi
		mid := lo + (hi-lo)/2
		if better(scores, buf[mid], buf[lo]) {
			buf[mid], buf[lo] = buf[lo], buf[mid]
		}
		if better(scores, buf[hi], buf[lo]) {
			buf[hi], buf[lo] = buf[lo], buf[hi]
		}
		if better(scores, buf[mid], buf[hi]) {
			buf[mid], buf[hi] = buf[hi], buf[mid]
		}
		piv := buf[hi]
		i := lo
		for j := lo; j < hi; j++ {
			if better(scores, buf[j], piv) {
				buf[i], buf[j] = buf[j], buf[i]
				i++
			}
		}
		buf[i], buf[hi] = buf[hi], buf[i]
		// buf[lo:i] rank before the pivot, buf[i+1:hi+1] after it
		switch {
		case i == k || i == k-1:
			lo = hi // done: buf[:k] are the best
		case i > k:
			hi = i - 1
		default:
			lo = i + 1
		}
	}
	top := buf[:k]
	slices.Sort(top)
	return top
}
