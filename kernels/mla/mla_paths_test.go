package mla

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"testing"

	"github.com/glmflash/glmflash/kernels/parallel"
	"github.com/stretchr/testify/require"
)

func randVec(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

// sparseSel builds T selection rows of the given width for queries at
// positions pos0.. over a cache of L positions: rows of kinds that exercise
// both paths' corner cases (dense causal prefixes, sparse pools with a tail,
// padding first, empty rows, repeated and unsorted positions).
func sparseSel(r *rand.Rand, T, width, pos0 int) []int32 {
	sel := make([]int32, T*width)
	for i := range sel {
		sel[i] = -1
	}
	for t := 0; t < T; t++ {
		row := sel[t*width : (t+1)*width]
		pos := pos0 + t
		switch t % 5 {
		case 0: // dense causal prefix (a contiguous run)
			for i := 0; i <= pos && i < width; i++ {
				row[i] = int32(pos - min(pos, width-1) + i)
			}
		case 1: // sparse pools of 4, ascending, then the tail
			pools := r.Perm(pos/4 + 1)
			k := min(len(pools), (width-3)/4)
			chosen := pools[:k]
			sort.Ints(chosen)
			o := 0
			for _, p := range chosen {
				for x := 0; x < 4; x++ {
					if p*4+x <= pos {
						row[o] = int32(p*4 + x)
						o++
					}
				}
			}
		case 2: // padding first, then a few positions out of order
			for i := width / 2; i < width; i++ {
				row[i] = int32(r.IntN(pos + 1))
			}
		case 3: // empty row
		case 4: // a single position
			row[width-1] = int32(pos)
		}
	}
	return sel
}

func TestAbsorbedMatchesExpand(t *testing.T) {
	for _, workers := range []int{1, 2, 5} {
		for _, T := range []int{1, 3, 7} {
			t.Run(fmt.Sprintf("workers=%d/T=%d", workers, T), func(t *testing.T) {
				old := parallel.Workers
				parallel.Workers = workers
				defer func() { parallel.Workers = old }()
				r := rand.New(rand.NewPCG(uint64(T), uint64(workers)))
				H, dq, dv, R, L, width := 4, 16, 12, 24, 40, 19
				c := &Config{Heads: H, QKDim: dq, VDim: dv, Rank: R, Scale: float32(1 / math.Sqrt(float64(dq))), KVBW: randVec(r, H*(dq+dv)*R)}
				ckv, q := randVec(r, L*R), randVec(r, T*H*dq)
				sel := sparseSel(r, T, width, L-T)
				oe, oa := make([]float32, T*H*dv), make([]float32, T*H*dv)
				for i := range oa {
					oa[i] = float32(math.NaN()) // every output must be written
				}
				c.AttendExpand(oe, q, ckv, sel, T, width)
				c.AttendAbsorbed(oa, q, ckv, sel, T, width)
				for i := range oe {
					require.InDelta(t, oe[i], oa[i], 2e-5*(1+math.Abs(float64(oe[i]))), "output %d", i)
				}
			})
		}
	}
}

func TestAttendPathsMatchReference(t *testing.T) {
	for _, p := range []Path{PathExpand, PathAbsorb} {
		t.Run(p.String(), func(t *testing.T) {
			Force = p
			defer func() { Force = PathAuto }()
			TestAttendMatchesDenseReference(t)
		})
	}
}

// One Workspace through calls of every size and both paths gives each call
// the results of a fresh one, bit for bit (its marks, row map and buffer
// hold the previous call's values: nothing may read them).
func TestWorkspaceReuse(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	H, dq, dv, R, width := 4, 16, 12, 24, 19
	c := &Config{Heads: H, QKDim: dq, VDim: dv, Rank: R, Scale: float32(1 / math.Sqrt(float64(dq))), KVBW: randVec(r, H*(dq+dv)*R)}
	var ws Workspace
	for i, s := range []struct {
		T, L int
		p    Path
	}{{7, 40, PathExpand}, {3, 200, PathAbsorb}, {30, 60, PathExpand}, {1, 61, PathAuto}, {30, 90, PathAbsorb}, {5, 300, PathExpand}, {30, 120, PathAuto}, {2, 10, PathAbsorb}} {
		c.Path = s.p
		ckv, q := randVec(r, s.L*R), randVec(r, s.T*H*dq)
		sel := sparseSel(r, s.T, width, s.L-s.T)
		want, got := make([]float32, s.T*H*dv), make([]float32, s.T*H*dv)
		c.AttendWith(new(Workspace), want, q, ckv, sel, s.T, width)
		for j := range got {
			got[j] = float32(math.NaN())
		}
		c.AttendWith(&ws, got, q, ckv, sel, s.T, width)
		require.Equal(t, want, got, "call %d (T %d, L %d, %s)", i, s.T, s.L, s.p)
	}
	c.Path = PathAuto
}

func TestCostRule(t *testing.T) {
	// the bench preset's geometry
	c := &Config{Heads: 8, QKDim: 128, VDim: 128, Rank: 256}
	// decode: absorb from two positions on
	for _, n := range []int{2, 32, 259} {
		require.Equal(t, PathAbsorb, c.Choose(1, n, n), "decode over %d positions", n)
	}
	require.Equal(t, PathExpand, c.Choose(1, 1, 1))
	// a dense causal prefill of T tokens (sel = T(T+1)/2, union = T): expand
	for _, T := range []int{8, 512, 2048} {
		require.Equal(t, PathExpand, c.Choose(T, T*(T+1)/2, T), "prefill of %d", T)
	}
	// a short chunk against a long sparse context: absorb
	require.Equal(t, PathAbsorb, c.Choose(16, 16*259, 8192))
	// scratch: expand's grows with the union, absorb's with T only
	e, a := c.Scratch(512, 1024)
	require.Equal(t, 1024*(256+8*256), e)
	require.Equal(t, 2*512*8*256, a)
	// narrow heads (QKDim+VDim ≪ 2·Rank): a chunk of 64 queries whose union
	// is 400 positions is cheaper expanded (Costs), but its expansion would
	// hold more than absorb's scratch: absorb; at a union of 300 both rules
	// keep expand
	n := &Config{Heads: 8, QKDim: 32, VDim: 32, Rank: 256}
	ex, ab := n.Costs(64, 64*259, 400)
	require.Less(t, ex, ab)
	require.Equal(t, PathAbsorb, n.Choose(64, 64*259, 400))
	require.Equal(t, PathExpand, n.Choose(64, 64*259, 300))
	// the released geometry (64 heads of 256, kv_lora 512): a 512-token
	// chunk whose selections span 2048 positions of a long context is 11%
	// cheaper expanded, at twice absorb's scratch (260 vs 128 MiB)
	g := &Config{Heads: 64, QKDim: 256, VDim: 256, Rank: 512}
	ex, ab = g.Costs(512, 512*2051, 2048)
	require.Less(t, ex, ab)
	require.Equal(t, PathAbsorb, g.Choose(512, 512*2051, 2048))
	require.Equal(t, PathExpand, g.Choose(512, 512*2051, 512))
	// forcing
	c.Path = PathExpand
	require.Equal(t, PathExpand, c.Choose(1, 259, 259))
	Force = PathAbsorb
	require.Equal(t, PathAbsorb, c.Choose(2048, 2048*259, 2048))
	Force = PathAuto
}

// decodeSel is the selection row of a decode query at position ctx−1 with
// the bench preset's indexer (top 64 pools of 4 plus the tail): every
// position while they fit, else 64 random pools and the tail.
func decodeSel(r *rand.Rand, ctx, width int) []int32 {
	row := make([]int32, width)
	for i := range row {
		row[i] = -1
	}
	pos := ctx - 1
	if ctx <= width {
		for i := 0; i < ctx; i++ {
			row[i] = int32(i)
		}
		return row
	}
	nPools := ctx / 4
	chosen := r.Perm(nPools)[:64]
	sort.Ints(chosen)
	o := 0
	for _, p := range chosen {
		for x := 0; x < 4; x++ {
			row[o] = int32(p*4 + x)
			o++
		}
	}
	for p := nPools * 4; p <= pos; p++ {
		row[o] = int32(p)
		o++
	}
	return row
}

// BenchmarkDecode is one decode query of the bench preset's MLA (8 heads of
// 128, kv_lora 256, 259-wide selections) at several contexts, by each path
// and by Attend's choice.
func BenchmarkDecode(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	H, dq, dv, R, width := 8, 128, 128, 256, 259
	c := &Config{Heads: H, QKDim: dq, VDim: dv, Rank: R, Scale: float32(1 / math.Sqrt(float64(dq))), KVBW: randVec(r, H*(dq+dv)*R)}
	for _, ctx := range []int{32, 1024, 8192} {
		ckv, q := randVec(r, ctx*R), randVec(r, H*dq)
		sel := decodeSel(r, ctx, width)
		o := make([]float32, H*dv)
		for _, p := range []Path{PathAuto, PathExpand, PathAbsorb} {
			b.Run(fmt.Sprintf("ctx=%d/%s", ctx, p), func(b *testing.B) {
				c.Path = p
				for i := 0; i < b.N; i++ {
					c.Attend(o, q, ckv, sel, 1, width)
				}
			})
		}
	}
}

// BenchmarkPrefillExpand is a 512-token prefill's attention by the expand
// path at the bench preset's geometry, each query selecting its last 256
// positions.
func BenchmarkPrefillExpand(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	H, dq, dv, R, T, width := 8, 128, 128, 256, 512, 256
	c := &Config{Heads: H, QKDim: dq, VDim: dv, Rank: R, Scale: float32(1 / math.Sqrt(float64(dq))), KVBW: randVec(r, H*(dq+dv)*R)}
	ckv, q := randVec(r, T*R), randVec(r, T*H*dq)
	sel := make([]int32, T*width)
	for t := 0; t < T; t++ {
		for i := range width {
			sel[t*width+i] = -1
			if p := t - i; p >= 0 {
				sel[t*width+i] = int32(p)
			}
		}
	}
	o := make([]float32, T*H*dv)
	for b.Loop() {
		c.AttendExpand(o, q, ckv, sel, T, width)
	}
}
