package cuda_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	kc "github.com/glmflash/glmflash/kernels/cuda"
)

// BenchmarkDFlashAttn times one dflash_attn (its three kernels) on the gpu
// preset's drafter geometry (32 query heads and 8 K/V heads of 128, block 8)
// for S sequences of L cached context keys and one new context row each,
// in a store of 102,400 (S 1) or 32,768 (S 8) positions (the split is
// sized by the shape, as the backend sizes it). kvGB/s counts the K and V rows read (the floor of a
// memory-bound kernel: every cached key and value once per KV head group).
// Graph of reps calls:
//
//	go test -run - -bench DFlashAttn ./kernels/cuda
func BenchmarkDFlashAttn(b *testing.B) {
	d := openDevice(b)
	if d.Emulated {
		b.Skip("the emulator's timings mean nothing")
	}
	const reps = 20
	const Hq, Hkv, hd, B = 32, 8, 128, 8
	r := rand.New(rand.NewPCG(35, 9))
	kvw := Hkv * hd
	for _, c := range []struct {
		S, maxPos int
		Ls        []int
	}{{1, 102400, []int{1024, 8192, 32768, 100000}}, {8, 32768, []int{1024, 8192, 32000}}} {
		S, maxPos := c.S, c.maxPos
		kcache := upload(b, d, randn(r, S*maxPos*kvw, 1))
		vcache := upload(b, d, randn(r, S*maxPos*kvw, 1))
		for _, L := range c.Ls {
			sh := kc.DFlashShape{S: S, B: B, Tc: S, Hq: Hq, Hkv: Hkv, HeadDim: hd, MaxKeys: maxPos + B}
			nsplit := kc.DFlashSplit(sh, d.SMs)
			po, pml := kc.DFlashPartFloats(sh, nsplit)
			slots, Ls, cs, crow0 := make([]int32, S), make([]int32, S), make([]int32, S), make([]int32, S)
			for s := range slots {
				slots[s], Ls[s], cs[s], crow0[s] = int32(s), int32(L), 1, int32(s)
			}
			w := upload(b, d, randn(r, hd, 0.5))
			op := kc.DFlashOp{Q: upload(b, d, randn(r, S*B*Hq*hd, 1)).p, Kb: upload(b, d, randn(r, S*B*kvw, 1)).p, Vb: upload(b, d, randn(r, S*B*kvw, 1)).p,
				Kc: upload(b, d, randn(r, S*kvw, 1)).p, Vc: upload(b, d, randn(r, S*kvw, 1)).p, QNorm: w.p, KNorm: w.p,
				O: poisoned[float32](b, d, S*B*Hq*hd).p, Qr: poisoned[float32](b, d, S*B*Hq*hd).p, Kbr: poisoned[float32](b, d, S*B*kvw).p,
				PartO: poisoned[float32](b, d, int(po)).p, PartML: poisoned[float32](b, d, int(pml)).p,
				KCache: kcache.p, VCache: vcache.p, SlotStride: int64(maxPos * kvw),
				Meta:  kc.DFlashMeta{Slot: upload(b, d, slots).p, L: upload(b, d, Ls).p, C: upload(b, d, cs).p, Crow0: upload(b, d, crow0).p, S: int64(S)},
				Shape: sh, Eps: 1e-6, Theta: 1e6, NSplit: nsplit}
			kvBytes := float64(2 * 4 * S * (L + 1 + B) * kvw)
			b.Run(fmt.Sprintf("S%d/L%d", S, L), func(b *testing.B) {
				us := deviceMicros(b, d, reps, true, func() error { return op.Launch(d) })
				b.ReportMetric(us, "us/launch")
				b.ReportMetric(kvBytes/us/1e3, "kvGB/s")
			})
		}
	}
}
