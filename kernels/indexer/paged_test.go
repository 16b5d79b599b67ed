package indexer

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/glmflash/glmflash/kernels/paged"
	"github.com/stretchr/testify/require"
)

// withPages is an empty state whose pooled keys live in pages of pr pools
// (enough for maxPools).
func withPages(D, pr, maxPools int) *State {
	st := &State{Pools: paged.Rows{Width: D, PageRows: pr}}
	for n := 0; n < maxPools; n += pr {
		st.Pools.Pages = append(st.Pools.Pages, make([]float32, pr*D))
	}
	return st
}

// Pooled keys in pages (one pool per page, odd page sizes) give the
// selection and the pooled keys of unpaged ones exactly, in decode steps
// and prefill blocks (the scores' GEMM runs once per page's run of keys);
// a pool past the pages is refused.
func TestSelectPagedMatchesUnpaged(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	H, D, kpool, topk, L := 3, 8, 4, 16, 123
	c := &Config{Heads: H, Dim: D, KPool: kpool, TopK: topk, SelectTail: true, APE: rnd(r, kpool*D)}
	k, g, q, w := rnd(r, L*D), rnd(r, L*D), rnd(r, L*H*D), rnd(r, L*H)
	Wd := c.Width()
	for _, split := range []int{1, 9, L} {
		for _, pr := range []int{1, 3, 4, 64} {
			flat, pg := &State{}, withPages(D, pr, L/kpool)
			for t0 := 0; t0 < L; t0 += split {
				n := min(split, L-t0)
				vis := make([]int, n)
				require.NoError(t, c.Append(flat, t0, k[t0*D:(t0+n)*D], g[t0*D:(t0+n)*D], n, vis))
				require.NoError(t, c.Append(pg, t0, k[t0*D:(t0+n)*D], g[t0*D:(t0+n)*D], n, nil))
				want, got := make([]int32, n*Wd), make([]int32, n*Wd)
				c.Select(want, flat, t0, q[t0*H*D:(t0+n)*H*D], w[t0*H:(t0+n)*H], n, vis)
				c.Select(got, pg, t0, q[t0*H*D:(t0+n)*H*D], w[t0*H:(t0+n)*H], n, vis)
				require.Equal(t, want, got, fmt.Sprintf("split %d, pages of %d pools, from %d", split, pr, t0))
			}
			require.Equal(t, flat.Pools.Flatten(), pg.Pools.Flatten())
			require.Equal(t, L/kpool, pg.NumPools())
		}
	}
	st := withPages(D, 2, 2)
	err := c.Append(st, 0, k[:5*kpool*D], g[:5*kpool*D], 5*kpool, nil)
	require.ErrorContains(t, err, "indexer: pool 2: paged: row 2 passes the 2 rows of the sequence's 1 pages")
	require.Equal(t, 2, st.NumPools())
}

// fp8Pages is an empty state whose pooled keys are fp8 (kv dtype fp8) in
// pages of pr pools (enough for maxPools).
func fp8Pages(D, pr, maxPools int) *State {
	st := &State{Pools: paged.Rows{Width: D, PageRows: pr, FP8: true}}
	for n := 0; n < maxPools; n += pr {
		st.Pools.Codes = append(st.Pools.Codes, make([]byte, pr*D))
		st.Pools.Scales = append(st.Pools.Scales, make([]float32, pr*paged.FP8Blocks(D)))
	}
	return st
}

// FP8 pooled keys are the fp32 ones quantized as each pool completes (the
// pending rows stay fp32), and Select over them gives the selection of
// fp32 keys holding their dequantized values, in decode steps and prefill
// blocks and on any page size.
func TestSelectFP8(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	H, D, kpool, topk, L := 3, 8, 4, 16, 123
	c := &Config{Heads: H, Dim: D, KPool: kpool, TopK: topk, SelectTail: true, APE: rnd(r, kpool*D)}
	k, g, q, w := rnd(r, L*D), rnd(r, L*D), rnd(r, L*H*D), rnd(r, L*H)
	Wd := c.Width()
	for _, split := range []int{1, 9, L} {
		for _, pr := range []int{1, 3, 64} {
			flat, f8 := &State{}, fp8Pages(D, pr, L/kpool)
			for t0 := 0; t0 < L; t0 += split {
				n := min(split, L-t0)
				vis := make([]int, n)
				require.NoError(t, c.Append(flat, t0, k[t0*D:(t0+n)*D], g[t0*D:(t0+n)*D], n, vis))
				require.NoError(t, c.Append(f8, t0, k[t0*D:(t0+n)*D], g[t0*D:(t0+n)*D], n, nil))
				require.Equal(t, flat.PendK, f8.PendK)
				// the fp32 keys' round trip is what the fp8 state holds
				keys := flat.Pools.Flatten()
				codes, scales := make([]byte, D), make([]float32, paged.FP8Blocks(D))
				for p := 0; p < flat.NumPools(); p++ {
					paged.FP8Quantize(codes, scales, keys[p*D:(p+1)*D])
					paged.FP8Dequantize(keys[p*D:(p+1)*D], codes, scales)
				}
				require.Equal(t, keys, f8.Pools.Flatten())
				deq := &State{Pools: paged.Flat(D, keys)}
				want, got := make([]int32, n*Wd), make([]int32, n*Wd)
				c.Select(want, deq, t0, q[t0*H*D:(t0+n)*H*D], w[t0*H:(t0+n)*H], n, vis)
				c.Select(got, f8, t0, q[t0*H*D:(t0+n)*H*D], w[t0*H:(t0+n)*H], n, vis)
				require.Equal(t, want, got, fmt.Sprintf("split %d, fp8 pages of %d pools, from %d", split, pr, t0))
			}
			require.Equal(t, L/kpool, f8.NumPools())
		}
	}
}
