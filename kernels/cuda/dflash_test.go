package cuda_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"regexp"
	"strconv"
	"testing"

	kc "github.com/glmflash/glmflash/kernels/cuda"
	"github.com/glmflash/glmflash/kernels/dflash"
	"github.com/stretchr/testify/require"
)

// dflashNormRope is the contract's per-head RMSNorm then NeoX RoPE of one
// head row, in float64 but for the fp32 angles.
func dflashNormRope(x, w []float32, pos int, eps, theta float64) []float64 {
	hd := len(x)
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	r := 1 / math.Sqrt(ss/float64(hd)+eps)
	n := make([]float64, hd)
	for i, v := range x {
		n[i] = float64(w[i]) * float64(v) * r
	}
	y := make([]float64, hd)
	half := hd / 2
	for i := 0; i < half; i++ {
		// transformers' fp32 inv_freq and angle (the CPU's kernels/dflash)
		inv := float64(float32(1 / math.Pow(theta, float64(2*i)/float64(hd))))
		ang := float64(float32(float64(pos) * inv))
		c, s := math.Cos(ang), math.Sin(ang)
		y[i] = n[i]*c - n[i+half]*s
		y[i+half] = n[i+half]*c + n[i]*s
	}
	return y
}

// dflashCase is a batch: per sequence its cached length and new context
// rows.
type dflashCase struct {
	hd, Hq, Hkv, B int
	L, c           []int
	maxPos         int // the cache's positions a slot
	sms            int // DFlashSplit's multiprocessors (the split count)
	bf16           bool
}

// The DFlash kernels against a float64 reference of the contract: the
// normed and roped context keys and the raw values land in each
// sequence's slot at L…L+c−1 (nothing else of the cache changes), and the
// block's output is the non-causal softmax attention of every block query
// over the L+c cached keys and the B block keys (GQA), for head dims 40, 42,
// 64 and 128, 1 to 8 heads, empty and non-empty caches and context rows,
// several sequences in slots of another order, and one split or several.
func TestDFlashAttnMatchesReference(t *testing.T) {
	d := openDevice(t)
	cases := []dflashCase{
		{hd: 64, Hq: 1, Hkv: 1, B: 8, L: []int{0}, c: []int{5}, maxPos: 40, sms: 1},
		{hd: 64, Hq: 4, Hkv: 2, B: 8, L: []int{1, 0, 300}, c: []int{0, 3, 7}, maxPos: 320, sms: 132},
		{hd: 128, Hq: 8, Hkv: 2, B: 8, L: []int{300, 1}, c: []int{2, 0}, maxPos: 310, sms: 132, bf16: true},
		{hd: 128, Hq: 8, Hkv: 8, B: 4, L: []int{17}, c: []int{9}, maxPos: 30, sms: 4},
		{hd: 40, Hq: 6, Hkv: 3, B: 5, L: []int{0, 33}, c: []int{0, 1}, maxPos: 40, sms: 8},
		// a head dim not a multiple of 4 (the kernel's scalar loads)
		{hd: 42, Hq: 3, Hkv: 3, B: 8, L: []int{70, 2}, c: []int{3, 4}, maxPos: 80, sms: 132},
		{hd: 64, Hq: 8, Hkv: 1, B: 16, L: []int{300}, c: []int{1}, maxPos: 301, sms: 132},
		// keys over many splits, a split boundary inside the block keys
		{hd: 64, Hq: 2, Hkv: 1, B: 8, L: []int{1000, 4}, c: []int{20, 3}, maxPos: 1024, sms: 132},
	}
	for ci, tc := range cases {
		t.Run(fmt.Sprintf("case%d/hd%d/H%d-%d/B%d", ci, tc.hd, tc.Hq, tc.Hkv, tc.B), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(ci), 35))
			hd, Hq, Hkv, B, S := tc.hd, tc.Hq, tc.Hkv, tc.B, len(tc.L)
			G := Hq / Hkv
			Tb := S * B
			Tc := 0
			crow0 := make([]int32, S)
			for s, c := range tc.c {
				crow0[s] = int32(Tc)
				Tc += c
			}
			const eps, theta = 1e-6, 1e6
			kvw := Hkv * hd
			slotStride := tc.maxPos * kvw
			slots := make([]int32, S)
			for s := range slots {
				slots[s] = int32((s*2 + 1) % (S + 1)) // another order, a slot unused
			}
			nslots := S + 1
			kcache, vcache := randn(r, nslots*slotStride, 1), randn(r, nslots*slotStride, 1)
			q, kb, vb := randn(r, Tb*Hq*hd, 1), randn(r, Tb*kvw, 1), randn(r, Tb*kvw, 1)
			kcr, vcr := randn(r, Tc*kvw, 1), randn(r, Tc*kvw, 1)
			qw, kw := randn(r, hd, 0.5), randn(r, hd, 0.5)
			var qwb, kwb buf
			if tc.bf16 {
				var qb16, kb16 []uint16
				qb16, qw = toBF16(qw)
				kb16, kw = toBF16(kw)
				qwb, kwb = upload(t, d, qb16), upload(t, d, kb16)
			} else {
				qwb, kwb = upload(t, d, qw), upload(t, d, kw)
			}
			// the reference
			wantK := append([]float32(nil), kcache...)
			wantV := append([]float32(nil), vcache...)
			want := make([]float64, Tb*Hq*hd)
			for s := 0; s < S; s++ {
				L, c := tc.L[s], tc.c[s]
				base := int(slots[s]) * slotStride
				for j := 0; j < c; j++ {
					row := int(crow0[s]) + j
					for h := 0; h < Hkv; h++ {
						o := row*kvw + h*hd
						y := dflashNormRope(kcr[o:o+hd], kw, L+j, eps, theta)
						for i := range y {
							wantK[base+(L+j)*kvw+h*hd+i] = float32(y[i])
						}
						copy(wantV[base+(L+j)*kvw+h*hd:], vcr[o:o+hd])
					}
				}
				N := L + c
				for jq := 0; jq < B; jq++ {
					tq := s*B + jq
					for h := 0; h < Hq; h++ {
						g := h / G
						qo := tq*Hq*hd + h*hd
						qv := dflashNormRope(q[qo:qo+hd], qw, N+jq, eps, theta)
						keys := make([][]float64, 0, N+B)
						vals := make([][]float32, 0, N+B)
						for p := 0; p < N; p++ {
							kr := wantK[base+p*kvw+g*hd : base+p*kvw+g*hd+hd]
							k64 := make([]float64, hd)
							for i, v := range kr {
								k64[i] = float64(v)
							}
							keys = append(keys, k64)
							vals = append(vals, wantV[base+p*kvw+g*hd:base+p*kvw+g*hd+hd])
						}
						for jb := 0; jb < B; jb++ {
							o := (s*B+jb)*kvw + g*hd
							keys = append(keys, dflashNormRope(kb[o:o+hd], kw, N+jb, eps, theta))
							vals = append(vals, vb[o:o+hd])
						}
						lg := make([]float64, len(keys))
						mx := math.Inf(-1)
						for i, k := range keys {
							var dot float64
							for e := range k {
								dot += qv[e] * k[e]
							}
							lg[i] = dot / math.Sqrt(float64(hd))
							mx = max(mx, lg[i])
						}
						var sum float64
						for i := range lg {
							lg[i] = math.Exp(lg[i] - mx)
							sum += lg[i]
						}
						for i, v := range vals {
							for e := range v {
								want[qo+e] += lg[i] / sum * float64(v[e])
							}
						}
					}
				}
			}
			sh := kc.DFlashShape{S: S, B: B, Tc: Tc, Hq: Hq, Hkv: Hkv, HeadDim: hd, MaxKeys: tc.maxPos + B}
			require.NoError(t, sh.Check())
			nsplit := kc.DFlashSplit(sh, tc.sms)
			t.Logf("at most %d splits", nsplit)
			po, pml := kc.DFlashPartFloats(sh, nsplit)
			Ls, cs := make([]int32, S), make([]int32, S)
			for s := range Ls {
				Ls[s], cs[s] = int32(tc.L[s]), int32(tc.c[s])
			}
			kcb, vcb := upload(t, d, kcache), upload(t, d, vcache)
			o := poisoned[float32](t, d, Tb*Hq*hd)
			op := kc.DFlashOp{Q: upload(t, d, q).p, Kb: upload(t, d, kb).p, Vb: upload(t, d, vb).p,
				Kc: upload(t, d, append(kcr, 0)).p, Vc: upload(t, d, append(vcr, 0)).p,
				QNorm: qwb.p, KNorm: kwb.p, QNormBF16: tc.bf16, KNormBF16: tc.bf16, O: o.p,
				Qr: poisoned[float32](t, d, Tb*Hq*hd).p, Kbr: poisoned[float32](t, d, Tb*kvw).p,
				PartO: poisoned[float32](t, d, int(po)).p, PartML: poisoned[float32](t, d, int(pml)).p,
				KCache: kcb.p, VCache: vcb.p, SlotStride: int64(slotStride),
				Meta:  kc.DFlashMeta{Slot: upload(t, d, slots).p, L: upload(t, d, Ls).p, C: upload(t, d, cs).p, Crow0: upload(t, d, crow0).p, S: int64(S)},
				Shape: sh, Eps: eps, Theta: theta, NSplit: nsplit}
			require.NoError(t, d.Do(func() error {
				if err := op.Launch(d); err != nil {
					return err
				}
				return d.Sync()
			}))
			gotK, gotV := download[float32](t, kcb), download[float32](t, vcb)
			for i := range wantV {
				require.Equal(t, math.Float32bits(wantV[i]), math.Float32bits(gotV[i]), "v cache float %d", i)
			}
			for i := range wantK {
				if math.Float32bits(wantK[i]) != math.Float32bits(kcache[i]) { // written by the op
					require.InDelta(t, wantK[i], gotK[i], 2e-5*(1+math.Abs(float64(wantK[i]))), "k cache float %d", i)
				} else {
					require.Equal(t, math.Float32bits(kcache[i]), math.Float32bits(gotK[i]), "k cache float %d is not the op's to write", i)
				}
			}
			got := download[float32](t, o)
			want32 := make([]float32, len(want))
			for i, v := range want {
				want32[i] = float32(v)
			}
			require.Less(t, maxRelErr(t, got, want32), 3e-6)
			for i := range want {
				require.InDelta(t, want[i], got[i], 1e-5, "output %d", i)
			}
		})
	}
}

// The split of the keys changes only rounding: one split and many give
// outputs within fp32 rounding of each other, and the same split twice the
// same bits.
func TestDFlashSplitInvariance(t *testing.T) {
	d := openDevice(t)
	r := rand.New(rand.NewPCG(3, 5))
	const hd, Hq, Hkv, B, S, L, maxPos = 64, 4, 2, 8, 2, 600, 640
	kvw := Hkv * hd
	sh := kc.DFlashShape{S: S, B: B, Tc: 0, Hq: Hq, Hkv: Hkv, HeadDim: hd, MaxKeys: maxPos + B}
	kcb, vcb := upload(t, d, randn(r, S*maxPos*kvw, 1)), upload(t, d, randn(r, S*maxPos*kvw, 1))
	meta := kc.DFlashMeta{Slot: upload(t, d, []int32{1, 0}).p, L: upload(t, d, []int32{L, 37}).p, C: upload(t, d, []int32{0, 0}).p,
		Crow0: upload(t, d, []int32{0, 0}).p, S: S}
	q, kb, vb := upload(t, d, randn(r, S*B*Hq*hd, 1)), upload(t, d, randn(r, S*B*kvw, 1)), upload(t, d, randn(r, S*B*kvw, 1))
	w := upload(t, d, randn(r, hd, 0.5))
	run := func(nsplit int) []float32 {
		po, pml := kc.DFlashPartFloats(sh, nsplit)
		o := poisoned[float32](t, d, S*B*Hq*hd)
		op := kc.DFlashOp{Q: q.p, Kb: kb.p, Vb: vb.p, QNorm: w.p, KNorm: w.p, O: o.p,
			Qr: poisoned[float32](t, d, S*B*Hq*hd).p, Kbr: poisoned[float32](t, d, S*B*kvw).p,
			PartO: poisoned[float32](t, d, int(po)).p, PartML: poisoned[float32](t, d, int(pml)).p,
			KCache: kcb.p, VCache: vcb.p, SlotStride: int64(maxPos * kvw), Meta: meta, Shape: sh, Eps: 1e-6, Theta: 1e4, NSplit: nsplit}
		require.NoError(t, d.Do(func() error {
			if err := op.Launch(d); err != nil {
				return err
			}
			return d.Sync()
		}))
		return download[float32](t, o)
	}
	one := run(1)
	nsplit := kc.DFlashSplit(sh, 132)
	require.Equal(t, 11, nsplit) // 648 keys, 64 a split at least
	many := run(nsplit)
	require.Less(t, maxRelErr(t, many, one), 1e-6)
	again := run(nsplit)
	for i := range many {
		require.Equal(t, math.Float32bits(many[i]), math.Float32bits(again[i]), "output %d", i)
	}
	op := kc.DFlashOp{Shape: sh}
	require.ErrorContains(t, d.Do(func() error { return op.Launch(d) }), "0 splits")
	bad := sh
	bad.HeadDim = 256
	require.ErrorContains(t, bad.Check(), "head_dim 256")
}

// The DFlash kernels agree with the CPU's (kernels/dflash, what the CPU
// backend binds) within fp32 rounding: the cached context keys and the
// block's output of a batch of three sequences, one of them at positions
// past 4,000 (where fp32 and float64 RoPE angles part).
func TestDFlashAttnMatchesCPU(t *testing.T) {
	d := openDevice(t)
	r := rand.New(rand.NewPCG(35, 1))
	const hd, Hq, Hkv, B, maxPos = 128, 4, 2, 8, 4200
	Ls, cs := []int{4100, 0, 9}, []int{3, 5, 0}
	S, kvw := len(Ls), Hkv*hd
	cfg := dflash.Config{Heads: Hq, KVHeads: Hkv, HeadDim: hd, Eps: 1e-6, Theta: 1e6}
	qw, kw := randn(r, hd, 0.5), randn(r, hd, 0.5)
	kcache, vcache := randn(r, S*maxPos*kvw, 1), randn(r, S*maxPos*kvw, 1)
	Tc := 0
	crow0 := make([]int32, S)
	for s, c := range cs {
		crow0[s] = int32(Tc)
		Tc += c
	}
	q, kb, vb := randn(r, S*B*Hq*hd, 1), randn(r, S*B*kvw, 1), randn(r, S*B*kvw, 1)
	kcr, vcr := randn(r, Tc*kvw, 1), randn(r, Tc*kvw, 1)
	want := make([]float32, S*B*Hq*hd)
	wantK := append([]float32(nil), kcache...)
	for s := 0; s < S; s++ {
		L, c := Ls[s], cs[s]
		base := s * maxPos * kvw // slot s
		kctx := append([]float32(nil), kcr[int(crow0[s])*kvw:(int(crow0[s])+c)*kvw]...)
		cfg.NormRope(kctx, c, Hkv, kw, L)
		copy(wantK[base+L*kvw:], kctx)
		kbs := append([]float32(nil), kb[s*B*kvw:(s+1)*B*kvw]...)
		cfg.NormRope(kbs, B, Hkv, kw, L+c)
		qs := append([]float32(nil), q[s*B*Hq*hd:(s+1)*B*Hq*hd]...)
		cfg.NormRope(qs, B, Hq, qw, L+c)
		keys := append(append([]float32(nil), wantK[base:base+(L+c)*kvw]...), kbs...)
		vals := append(append(append([]float32(nil), vcache[base:base+L*kvw]...), vcr[int(crow0[s])*kvw:(int(crow0[s])+c)*kvw]...), vb[s*B*kvw:(s+1)*B*kvw]...)
		cfg.Attend(want[s*B*Hq*hd:(s+1)*B*Hq*hd], qs, B, keys, vals, L+c+B)
	}
	sh := kc.DFlashShape{S: S, B: B, Tc: Tc, Hq: Hq, Hkv: Hkv, HeadDim: hd, MaxKeys: maxPos + B}
	nsplit := kc.DFlashSplit(sh, d.SMs)
	po, pml := kc.DFlashPartFloats(sh, nsplit)
	slots := []int32{0, 1, 2}
	Lb, cb := make([]int32, S), make([]int32, S)
	for s := range Lb {
		Lb[s], cb[s] = int32(Ls[s]), int32(cs[s])
	}
	kcb, vcb := upload(t, d, kcache), upload(t, d, vcache)
	o := poisoned[float32](t, d, S*B*Hq*hd)
	op := kc.DFlashOp{Q: upload(t, d, q).p, Kb: upload(t, d, kb).p, Vb: upload(t, d, vb).p, Kc: upload(t, d, kcr).p, Vc: upload(t, d, vcr).p,
		QNorm: upload(t, d, qw).p, KNorm: upload(t, d, kw).p, O: o.p,
		Qr: poisoned[float32](t, d, S*B*Hq*hd).p, Kbr: poisoned[float32](t, d, S*B*kvw).p,
		PartO: poisoned[float32](t, d, int(po)).p, PartML: poisoned[float32](t, d, int(pml)).p,
		KCache: kcb.p, VCache: vcb.p, SlotStride: int64(maxPos * kvw),
		Meta:  kc.DFlashMeta{Slot: upload(t, d, slots).p, L: upload(t, d, Lb).p, C: upload(t, d, cb).p, Crow0: upload(t, d, crow0).p, S: int64(S)},
		Shape: sh, Eps: cfg.Eps, Theta: cfg.Theta, NSplit: nsplit}
	require.NoError(t, d.Do(func() error {
		if err := op.Launch(d); err != nil {
			return err
		}
		return d.Sync()
	}))
	gotK := download[float32](t, kcb)
	require.Less(t, maxRelErr(t, gotK, wantK), 1e-7)
	for i := range wantK {
		require.InDelta(t, wantK[i], gotK[i], 2e-6*(1+math.Abs(float64(wantK[i]))), "k cache float %d", i)
	}
	got := download[float32](t, o)
	require.Less(t, maxRelErr(t, got, want), 2e-6)
	for i := range want {
		require.InDelta(t, want[i], got[i], 1e-5, "output %d", i)
	}
}

// The Go side's limits of the DFlash kernels are the sources' (#define in
// src/dflash.cu): the head dims the shared tiles take, the queries a block
// serves and the fewest keys a split takes.
func TestDFlashLimitsMatchSources(t *testing.T) {
	src, err := os.ReadFile("src/dflash.cu")
	require.NoError(t, err)
	for name, want := range map[string]int{"DFLASH_MAXHD": kc.DFlashMaxHeadDim, "DFLASH_QB": kc.DFlashQueriesPerBlock, "DFLASH_KMIN": kc.DFlashMinSplit} {
		m := regexp.MustCompile(`(?m)^#define ` + name + ` (\d+)$`).FindSubmatch(src)
		require.NotNil(t, m, name)
		require.Equal(t, strconv.Itoa(want), string(m[1]), name)
	}
}
