package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"unsafe"

	"github.com/glmflash/glmflash/core/ir"
	kc "github.com/glmflash/glmflash/kernels/cuda"
	"github.com/glmflash/glmflash/kernels/gemm"
)

// The CUDA backend is a ir.GEMMTuner: prefill-autotune measures its
// GEMM choices on the GPU with CUDA events.
var _ ir.GEMMTuner = (*Backend)(nil)

// TunerInfo implements ir.GEMMTuner: a table's choices belong to the
// GPU model and, for cuBLASLt algorithms, to the library version.
func (b *Backend) TunerInfo() ir.TunerInfo {
	return ir.TunerInfo{Device: "cuda", Model: b.dev.Name, Library: fmt.Sprintf("cuBLASLt %d", b.dev.LtVersion())}
}

// GEMMKind implements ir.GEMMTuner: weights stored in BF16 or FP8
// (dequantized: bf16-exact) stay bf16 on the device unless FP32Weights;
// precision bf16 makes their GEMMs take bf16 activations.
func (b *Backend) GEMMKind(weightDType string) string {
	if !b.opts.FP32Weights && weightDType == "F8_E4M3" {
		return fp8KindOf(string(b.opts.Precision))
	}
	bf16 := !b.opts.FP32Weights && (weightDType == "BF16" || strings.HasPrefix(weightDType, "F8"))
	return gemmKindOf(bf16, string(b.opts.Precision))
}

// GEMMCandidates implements ir.GEMMTuner. fp8 weights have one kernel per
// row count (gemv, tiled, or cuBLAS on the dequantized copy): nothing to
// choose, but TuneGEMM measures it.
func (b *Backend) GEMMCandidates(kind string, rows int) []string {
	if kind == kindF32FP8W || kind == kindBF16FP8W {
		return []string{b.gemm.plan(kind, rows).ch.String()}
	}
	var out []string
	if kind == kindBF16BF16W && rows <= skinnyMaxRows {
		out = append(out, "gemv")
	}
	if rows <= kc.ColMaxRows {
		for t := colTriedMin; t <= colTriedMax; t *= 2 {
			out = append(out, fmt.Sprintf("col:%d", t))
		}
	}
	if rows <= skinnyMaxRows {
		out = append(out, "skinny")
	}
	out = append(out, "tiled")
	if rows > skinnyMaxRows && rows <= skinny8MaxRows {
		out = append(out, "skinny8")
	}
	if kind != kindF32BF16W {
		out = append(out, "cublas", "lt")
	}
	return out
}

// tuneBufs are one measurement's device buffers.
type tuneBufs struct {
	A, Abf, W, C kc.DevicePtr
	S, Wbf       kc.DevicePtr // fp8: block scales, bf16 copy for the library
	sizes        []int64
	ptrs         []*kc.DevicePtr
}

// TuneGEMM implements ir.GEMMTuner: on random data of the shape, the
// default choice's output is the reference; every candidate runs once
// (rejected if it fails or differs by more than the tolerance, relative),
// then reps times between CUDA events; the fastest median wins (the
// default among them, so a choice is never slower than the default as
// measured).
func (b *Backend) TuneGEMM(t ir.GEMMTune) (ir.GEMMChoice, error) {
	if t.Rows < 1 || t.N < 1 || t.K < 1 {
		return ir.GEMMChoice{}, fmt.Errorf("cuda: tuning a %d×%d×%d GEMM", t.Rows, t.N, t.K)
	}
	switch t.Kind {
	case kindF32BF16W, kindF32F32W, kindBF16BF16W, kindF32FP8W, kindBF16FP8W:
	default:
		return ir.GEMMChoice{}, fmt.Errorf("cuda: no GEMM kind %q (%s, %s, %s, %s or %s)", t.Kind, kindF32BF16W, kindF32F32W, kindBF16BF16W, kindF32FP8W, kindBF16FP8W)
	}
	if t.Reps < 1 {
		t.Reps = 3
	}
	if t.MaxLibAlgos < 1 {
		t.MaxLibAlgos = 8
	}
	var res ir.GEMMChoice
	err := b.dev.Do(func() error {
		var err error
		res, err = b.tune(t)
		return err
	})
	return res, err
}

func (b *Backend) tune(t ir.GEMMTune) (ir.GEMMChoice, error) {
	dev := b.dev
	M, N, K := t.Rows, t.N, t.K
	fp8W := t.Kind == kindF32FP8W || t.Kind == kindBF16FP8W
	bfW, bfA := t.Kind != kindF32F32W && !fp8W, t.Kind == kindBF16BF16W || t.Kind == kindBF16FP8W
	r := rand.New(rand.NewPCG(uint64(N)*131+uint64(K), uint64(M)))
	x := make([]float32, M*K)
	w := make([]float32, N*K)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	for i := range w {
		w[i] = float32(r.NormFloat64() / math.Sqrt(float64(K)))
	}
	var bufs tuneBufs
	defer func() {
		for i, p := range bufs.ptrs {
			dev.Free(*p, bufs.sizes[i])
			b.sh.work.Add(-bufs.sizes[i])
		}
	}()
	alloc := func(p *kc.DevicePtr, n int64) error {
		q, err := dev.Alloc(n)
		if err != nil {
			return err
		}
		*p = q
		b.sh.work.Add(n)
		bufs.ptrs, bufs.sizes = append(bufs.ptrs, p), append(bufs.sizes, n)
		return nil
	}
	wsz := int64(4)
	switch {
	case fp8W:
		wsz = 1
	case bfW:
		wsz = 2
	}
	sld, srows := int64((K+fp8Block-1)/fp8Block), int64((N+fp8Block-1)/fp8Block)
	for _, a := range []struct {
		p *kc.DevicePtr
		n int64
	}{{&bufs.A, 4 * int64(M*K)}, {&bufs.Abf, 2 * int64(M*K)}, {&bufs.W, wsz * int64(N*K)}, {&bufs.C, 4 * int64(M*N)},
		{&bufs.S, 4 * sld * srows}, {&bufs.Wbf, 2 * int64(N*K)}} {
		if err := alloc(a.p, a.n); err != nil {
			return ir.GEMMChoice{}, err
		}
	}
	W := devTensor{ptr: bufs.W, bf16: bfW, n: int64(N * K), fp8: fp8W, scale: bufs.S, sld: sld, sgoff: sld * srows, rows: int64(N), cols: int64(K), matrixCount: 1}
	if err := dev.Upload(bufs.A, unsafe.Pointer(unsafe.SliceData(x)), 4*int64(len(x))); err != nil {
		return ir.GEMMChoice{}, err
	}
	if fp8W { // codes of about unit size (never the NaN codes), scales 1/sqrt(K)
		codes := make([]byte, len(w))
		for i := range codes {
			codes[i] = byte(0x30+r.IntN(0x10)) | byte(r.IntN(2)<<7)
		}
		sc := make([]float32, sld*srows)
		for i := range sc {
			sc[i] = float32(1 / math.Sqrt(float64(K)))
		}
		if err := dev.Upload(bufs.W, unsafe.Pointer(unsafe.SliceData(codes)), int64(len(codes))); err != nil {
			return ir.GEMMChoice{}, err
		}
		if err := dev.Upload(bufs.S, unsafe.Pointer(unsafe.SliceData(sc)), 4*int64(len(sc))); err != nil {
			return ir.GEMMChoice{}, err
		}
	} else if bfW {
		wb := make([]uint16, len(w))
		gemm.Float32sToBF16(wb, w)
		if err := dev.Upload(bufs.W, unsafe.Pointer(unsafe.SliceData(wb)), 2*int64(len(wb))); err != nil {
			return ir.GEMMChoice{}, err
		}
	} else if err := dev.Upload(bufs.W, unsafe.Pointer(unsafe.SliceData(w)), 4*int64(len(w))); err != nil {
		return ir.GEMMChoice{}, err
	}
	// what the binding runs for a choice, the activation cast included
	run := func(ch gemmChoice) error {
		if ch.lib() {
			A := bufs.A
			if bfA {
				if err := castBF16(dev, bufs.A, M*K, bufs.Abf); err != nil {
					return err
				}
				A = bufs.Abf
			}
			Wp, err := libWeight(dev, W, func() kc.DevicePtr { return bufs.Wbf })
			if err != nil {
				return err
			}
			return libGemm(dev, ch, bfA, M, N, K, A, K, Wp, bufs.C, N)
		}
		a := kc.GemmArgs{A: bufs.A, Lda: int64(K), M: int64(M), N: int64(N), K: int64(K), Nout: 1, ARound: b2i(bfA)}
		W.setW(&a)
		a.Out[0], a.Ow[0] = bufs.C, int64(N)
		return b.gemm.launchOwn(dev, &a, 1, ch)
	}
	out := make([]float32, M*N)
	result := func() ([]float32, error) {
		err := dev.Download(unsafe.Pointer(unsafe.SliceData(out)), bufs.C, 4*int64(len(out)))
		return out, err
	}
	e0, err := dev.NewEvent()
	if err != nil {
		return ir.GEMMChoice{}, err
	}
	defer dev.DestroyEvent(e0)
	e1, err := dev.NewEvent()
	if err != nil {
		return ir.GEMMChoice{}, err
	}
	defer dev.DestroyEvent(e1)
	measure := func(ch gemmChoice) (int64, error) {
		var ts []float64
		for range t.Reps {
			if err := dev.RecordEvent(e0); err != nil {
				return 0, err
			}
			if err := run(ch); err != nil {
				return 0, err
			}
			if err := dev.RecordEvent(e1); err != nil {
				return 0, err
			}
			ms, err := dev.ElapsedKeep(e0, e1)
			if err != nil {
				return 0, err
			}
			ts = append(ts, ms)
		}
		sort.Float64s(ts)
		return int64(ts[len(ts)/2] * 1e6), nil
	}
	// the reference: the default choice
	def := b.gemm.plan(t.Kind, M).ch
	if err := run(def); err != nil {
		return ir.GEMMChoice{}, fmt.Errorf("the default GEMM (%s): %w", def, err)
	}
	got, err := result()
	if err != nil {
		return ir.GEMMChoice{}, err
	}
	ref := append([]float32(nil), got...)
	defNs, err := measure(def)
	if err != nil {
		return ir.GEMMChoice{}, err
	}
	res := ir.GEMMChoice{Kernel: def.String(), Name: "default (" + def.String() + ")", DefaultNs: defNs, TunedNs: defNs, Measured: 1}
	var cands []gemmChoice
	for _, c := range b.GEMMCandidates(t.Kind, M) {
		if c == "lt" {
			algos, err := dev.LtAlgos(kc.LtSpec{M: M, N: N, K: K, Lda: K, Ldw: K, Ldc: N, BF16: bfA}, t.MaxLibAlgos)
			if err != nil {
				return ir.GEMMChoice{}, err
			}
			for _, a := range algos {
				cands = append(cands, gemmChoice{kind: chLt, algo: a})
			}
			continue
		}
		ch, err := parseChoice(c)
		if err != nil {
			return ir.GEMMChoice{}, err
		}
		if ch != def {
			cands = append(cands, ch)
		}
	}
	for _, ch := range cands {
		res.Measured++
		if ch.kind == chLt && dev.LtCheck(kc.LtSpec{M: M, N: N, K: K, Lda: K, Ldw: K, Ldc: N, BF16: bfA}, ch.algo) != nil {
			res.Rejected++ // libGemm would fall back to cuBLAS: not this candidate
			continue
		}
		if err := run(ch); err != nil {
			res.Rejected++
			continue
		}
		got, err := result()
		if err != nil {
			return ir.GEMMChoice{}, err
		}
		if gemm.MaxRelDiff(got, ref) > t.Tolerance {
			res.Rejected++
			continue
		}
		ns, err := measure(ch)
		if err != nil {
			return ir.GEMMChoice{}, err
		}
		if ns < res.TunedNs {
			res.TunedNs, res.Kernel, res.Name = ns, ch.String(), ch.String()
			if ch.kind == chLt {
				res.Name = "cuBLASLt " + dev.LtName(ch.algo)
			}
		}
	}
	return res, nil
}
