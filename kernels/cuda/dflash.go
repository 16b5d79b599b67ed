package cuda

import (
	"fmt"
	"math"
)

// DFlash's block attention (src/dflash.cu): glmf_dflash_prep normalizes and
// rotates the q and k rows and appends the context rows' K/V to the draft
// caches, glmf_dflash_attn computes the attention of each split of a
// sequence's keys, glmf_dflash_reduce adds the splits.

// Limits of the kernels.
const (
	// DFlashMaxHeadDim is the largest head dimension glmf_dflash_attn
	// takes (its shared tiles of queries, keys and values fill 48 KiB at
	// 128).
	DFlashMaxHeadDim = 128
	// DFlashQueriesPerBlock is the queries (block rows × heads of one KV
	// group) a glmf_dflash_attn block serves; a group of more takes more
	// blocks, each reading the group's keys.
	DFlashQueriesPerBlock = 32
	// dflashKeyTile is the keys a block stages at a time (DFLASH_KT).
	dflashKeyTile = 32
	// DFlashMinSplit is the fewest keys a split takes (DFLASH_KMIN).
	DFlashMinSplit = 64
)

// DFlashShape is the size of a dflash_attn batch: S sequences of B block
// rows each, Tc new context rows in all, Hq query and Hkv key/value heads
// of HeadDim, and at most MaxKeys keys a sequence (the draft cache's
// capacity plus the block: it bounds the splits worth launching).
type DFlashShape struct {
	S, B, Tc, Hq, Hkv, HeadDim, MaxKeys int
}

// Check reports a shape the kernels cannot run.
func (sh DFlashShape) Check() error {
	switch {
	case sh.S < 1 || sh.B < 1:
		return fmt.Errorf("cuda: dflash_attn needs at least one sequence and one block row, got %d sequences of %d", sh.S, sh.B)
	case sh.Tc < 0:
		return fmt.Errorf("cuda: dflash_attn: %d context rows", sh.Tc)
	case sh.Hq < 1 || sh.Hkv < 1 || sh.Hq%sh.Hkv != 0:
		return fmt.Errorf("cuda: dflash_attn: %d query heads are not a multiple of %d key/value heads", sh.Hq, sh.Hkv)
	case sh.HeadDim < 2 || sh.HeadDim%2 != 0 || sh.HeadDim > DFlashMaxHeadDim:
		return fmt.Errorf("cuda: dflash_attn: head_dim %d is not an even number in [2, %d] (the CUDA kernel's limit)", sh.HeadDim, DFlashMaxHeadDim)
	case sh.MaxKeys < sh.B:
		return fmt.Errorf("cuda: dflash_attn: at most %d keys a sequence cannot hold its %d block keys", sh.MaxKeys, sh.B)
	}
	return nil
}

// chunks is the glmf_dflash_attn blocks a KV head group's queries take.
func (sh DFlashShape) chunks() int {
	q := sh.B * sh.Hq / sh.Hkv
	return (q + DFlashQueriesPerBlock - 1) / DFlashQueriesPerBlock
}

// DFlashSplit is the most splits glmf_dflash_attn divides a sequence's
// keys into on a GPU of sms multiprocessors (its grid's x): about two
// blocks an SM, and no more than MaxKeys keys fill at DFlashMinSplit a
// split. On the device a sequence of n keys takes splits of
// max(DFlashMinSplit, ⌈n/nsplit⌉ rounded up to the key tile) keys, so
// short contexts take few splits and long ones all. It depends on the
// shape only (not on the lengths): eager steps and graph replays split
// alike, and a graph captured at one length serves every other.
func DFlashSplit(sh DFlashShape, sms int) (nsplit int) {
	base := sh.S * sh.Hkv * sh.chunks()
	nsplit = max(1, (2*max(sms, 1)+base-1)/base)
	return min(nsplit, max(1, (sh.MaxKeys+DFlashMinSplit-1)/DFlashMinSplit))
}

// DFlashPartFloats is the floats of the splits' partial outputs and of
// their maxima and sums (DFlashOp.PartO, PartML) for nsplit splits.
func DFlashPartFloats(sh DFlashShape, nsplit int) (o, ml int64) {
	q := int64(sh.S) * int64(nsplit) * int64(sh.B) * int64(sh.Hq)
	return q * int64(sh.HeadDim), 2 * q
}

// DFlashOp is one dflash_attn: its inputs (q, kb, vb [S·B][H·hd], kc, vc
// [Tc][Hkv·hd], the per-head q_norm and k_norm weights), its output O
// [S·B][Hq·hd], its temporaries (Qr [S·B][Hq·hd], Kbr [S·B][Hkv·hd], the
// partials of DFlashPartFloats), the layer's draft caches (per slot
// SlotStride floats: [positions][Hkv·hd]) and the step's metadata.
type DFlashOp struct {
	Q, Kb, Vb, Kc, Vc    DevicePtr
	QNorm, KNorm         DevicePtr
	QNormBF16, KNormBF16 bool
	O                    DevicePtr
	Qr, Kbr              DevicePtr
	PartO, PartML        DevicePtr
	KCache, VCache       DevicePtr
	SlotStride           int64
	Meta                 DFlashMeta
	Shape                DFlashShape
	Eps, Theta           float64
	// NSplit is the most splits of a sequence's keys (DFlashSplit's).
	NSplit int
}

// Launch starts the op's three kernels on d's current stream.
func (op *DFlashOp) Launch(d *Device) error {
	sh := op.Shape
	if err := sh.Check(); err != nil {
		return err
	}
	if op.NSplit < 1 {
		return fmt.Errorf("cuda: dflash_attn: %d splits of the keys (at least one)", op.NSplit)
	}
	b2i := func(b bool) int64 {
		if b {
			return 1
		}
		return 0
	}
	Tb := sh.S * sh.B
	items := int64(Tb)*int64(sh.Hq+sh.Hkv) + int64(sh.Tc)*int64(sh.Hkv)
	prep := DFlashPrepArgs{Q: op.Q, Kb: op.Kb, Kc: op.Kc, Vc: op.Vc, Qw: op.QNorm, QwBf16: b2i(op.QNormBF16), Kw: op.KNorm, KwBf16: b2i(op.KNormBF16),
		Qo: op.Qr, Kbo: op.Kbr, Kcache: op.KCache, Vcache: op.VCache, SlotStride: op.SlotStride, M: op.Meta,
		Tc: int64(sh.Tc), Hq: int64(sh.Hq), Hkv: int64(sh.Hkv), Hd: int64(sh.HeadDim), B: int64(sh.B), Eps: op.Eps, Theta: op.Theta}
	if err := LaunchDflashPrep(d, Dim3{X: uint32((items + 7) / 8)}, Dim3{X: 256}, 0, &prep); err != nil {
		return err
	}
	attn := DFlashAttnArgs{Q: op.Qr, Kb: op.Kbr, Vb: op.Vb, Kcache: op.KCache, Vcache: op.VCache, SlotStride: op.SlotStride, M: op.Meta,
		PartO: op.PartO, PartMl: op.PartML, Hq: int64(sh.Hq), Hkv: int64(sh.Hkv), Hd: int64(sh.HeadDim), B: int64(sh.B),
		Nsplit: int64(op.NSplit), Scale: 1 / math.Sqrt(float64(sh.HeadDim))}
	smem := 4 * (DFlashQueriesPerBlock + 2*dflashKeyTile) * sh.HeadDim
	grid := Dim3{X: uint32(op.NSplit), Y: uint32(sh.Hkv * sh.chunks()), Z: uint32(sh.S)}
	if err := LaunchDflashAttn(d, grid, Dim3{X: 256}, smem, &attn); err != nil {
		return err
	}
	red := DFlashReduceArgs{PartO: op.PartO, PartMl: op.PartML, O: op.O, M: op.Meta, Hq: int64(sh.Hq), Hkv: int64(sh.Hkv), Hd: int64(sh.HeadDim),
		B: int64(sh.B), Nsplit: int64(op.NSplit)}
	block := uint32(32)
	for int(block) < sh.HeadDim {
		block *= 2
	}
	return LaunchDflashReduce(d, Dim3{X: uint32(sh.Hq), Y: uint32(sh.B), Z: uint32(sh.S)}, Dim3{X: block}, 0, &red)
}
