package cuda

import (
	"encoding/hex"
	"fmt"
	"unsafe"
)

// cuBLASLt: the GEMMs prefill-autotune may choose by measurement. One
// GEMM shape has several algorithms (cublasLtMatmulAlgoGetHeuristic lists
// them, best guess first); an algorithm is an opaque 64-byte struct, kept
// as such (with the library version it came from) in tuning tables.

// Constants of cublasLt.h and library_types.h.
const (
	ltComputeF32   = 68 // CUBLAS_COMPUTE_32F (no TF32: that is _FAST_TF32)
	ltTypeF32      = 0  // CUDA_R_32F
	ltTypeBF16     = 14 // CUDA_R_16BF
	ltDescTransA   = 3  // CUBLASLT_MATMUL_DESC_TRANSA
	ltDescTransB   = 4  // CUBLASLT_MATMUL_DESC_TRANSB
	ltPrefMaxWS    = 1  // CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES
	ltConfigID     = 0  // CUBLASLT_ALGO_CONFIG_ID
	ltConfigTile   = 1  // CUBLASLT_ALGO_CONFIG_TILE_ID
	ltConfigSplitK = 2  // CUBLASLT_ALGO_CONFIG_SPLITK_NUM

	// LtWorkspace is the device workspace every cuBLASLt matmul may use.
	LtWorkspace = 32 << 20
)

// LtAlgo is one cuBLASLt algorithm: the opaque struct and what the
// heuristic said it needs.
type LtAlgo struct {
	Data      [8]uint64
	Workspace uint64
}

// heuristicResult mirrors cublasLtMatmulHeuristicResult_t.
type heuristicResult struct {
	algo      [8]uint64
	workspace uint64
	state     int32
	waves     float32
	reserved  [4]int32
}

// String is the algorithm's bytes in hex (what tuning tables store).
func (a LtAlgo) String() string {
	b := unsafe.Slice((*byte)(unsafe.Pointer(&a.Data[0])), 64)
	return hex.EncodeToString(b)
}

// ParseLtAlgo reads an algorithm from its hex form.
func ParseLtAlgo(s string) (LtAlgo, error) {
	var a LtAlgo
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != 64 {
		return a, fmt.Errorf("a cuBLASLt algorithm is 64 bytes in hex, got %q", s)
	}
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&a.Data[0])), 64), b)
	return a, nil
}

// LtSpec is one GEMM in row-major terms: C[M][N] (fp32) = A[M][K]·W[N][K]ᵀ
// with A and W both fp32 or both bf16 (BF16), leading dimensions in
// elements.
type LtSpec struct {
	M, N, K       int
	Lda, Ldw, Ldc int
	BF16          bool
}

// ltDescs are the descriptors of one spec.
type ltDescs struct {
	desc, a, w, c uintptr
	checked       map[[8]uint64]error
}

// ltFor returns (creating once) the descriptors of spec. Column-major
// view: Cᵀ[N×M] = op(W)·A where W is stored K×N (ld Ldw) and transposed, A
// stored K×M (ld Lda).
func (d *Device) ltFor(s LtSpec) (*ltDescs, error) {
	if l, ok := d.lt[s]; ok {
		return l, nil
	}
	b := d.blas
	typ := int32(ltTypeF32)
	if s.BF16 {
		typ = ltTypeBF16
	}
	l := &ltDescs{checked: map[[8]uint64]error{}}
	if r := b.ltDescCreate(&l.desc, ltComputeF32, ltTypeF32); r != 0 {
		return nil, fmt.Errorf("cuda: cublasLtMatmulDescCreate failed with status %d", r)
	}
	ta, tb := int32(1), int32(0) // W transposed, A not
	if r := b.ltDescSetAttr(l.desc, ltDescTransA, unsafe.Pointer(&ta), 4); r != 0 {
		return nil, fmt.Errorf("cuda: cublasLtMatmulDescSetAttribute(TRANSA) failed with status %d", r)
	}
	if r := b.ltDescSetAttr(l.desc, ltDescTransB, unsafe.Pointer(&tb), 4); r != 0 {
		return nil, fmt.Errorf("cuda: cublasLtMatmulDescSetAttribute(TRANSB) failed with status %d", r)
	}
	for _, x := range []struct {
		p          *uintptr
		typ        int32
		rows, cols int
		ld         int
	}{{&l.w, typ, s.K, s.N, s.Ldw}, {&l.a, typ, s.K, s.M, s.Lda}, {&l.c, ltTypeF32, s.N, s.M, s.Ldc}} {
		if r := b.ltLayoutCreate(x.p, x.typ, uint64(x.rows), uint64(x.cols), int64(x.ld)); r != 0 {
			return nil, fmt.Errorf("cuda: cublasLtMatrixLayoutCreate(%d×%d, ld %d) failed with status %d", x.rows, x.cols, x.ld, r)
		}
	}
	if d.lt == nil {
		d.lt = map[LtSpec]*ltDescs{}
	}
	d.lt[s] = l
	return l, nil
}

// EnsureLtWorkspace allocates the cuBLASLt workspace now: a program that
// will run cuBLASLt matmuls inside a CUDA graph capture must, since an
// allocation is not allowed there.
func (d *Device) EnsureLtWorkspace() error {
	_, err := d.ltWorkspace()
	return err
}

// LtWorkspaceBytes is the size of the cuBLASLt workspace while it is
// allocated, else 0 (safe outside Do: memory reports).
func (d *Device) LtWorkspaceBytes() int64 { return d.ltWSBytes.Load() }

// ltWorkspace allocates the shared cuBLASLt workspace once.
func (d *Device) ltWorkspace() (DevicePtr, error) {
	if d.ltWS == 0 {
		p, err := d.Alloc(LtWorkspace)
		if err != nil {
			return 0, err
		}
		d.ltWS = p
		d.ltWSBytes.Store(LtWorkspace)
	}
	return d.ltWS, nil
}

// LtAlgos lists up to max cuBLASLt algorithms for spec, the heuristic's
// best guess first.
func (d *Device) LtAlgos(s LtSpec, max int) ([]LtAlgo, error) {
	l, err := d.ltFor(s)
	if err != nil {
		return nil, err
	}
	b := d.blas
	var pref uintptr
	if r := b.ltPrefCreate(&pref); r != 0 {
		return nil, fmt.Errorf("cuda: cublasLtMatmulPreferenceCreate failed with status %d", r)
	}
	defer b.ltPrefDestroy(pref)
	ws := uint64(LtWorkspace)
	if r := b.ltPrefSetAttr(pref, ltPrefMaxWS, unsafe.Pointer(&ws), 8); r != 0 {
		return nil, fmt.Errorf("cuda: cublasLtMatmulPreferenceSetAttribute failed with status %d", r)
	}
	res := make([]heuristicResult, max)
	var n int32
	if r := b.ltHeuristic(d.ltH, l.desc, l.w, l.a, l.c, l.c, pref, int32(max), unsafe.Pointer(&res[0]), &n); r != 0 {
		return nil, fmt.Errorf("cuda: cublasLtMatmulAlgoGetHeuristic(%d×%d×%d) failed with status %d", s.M, s.N, s.K, r)
	}
	var out []LtAlgo
	for _, h := range res[:n] {
		if h.state == 0 {
			out = append(out, LtAlgo{Data: h.algo, Workspace: h.workspace})
		}
	}
	return out, nil
}

// LtCheck says whether algo runs spec (cublasLtMatmulAlgoCheck; cached): a
// tuned algorithm is measured at its bucket's row count, and another count
// may not suit it.
func (d *Device) LtCheck(s LtSpec, a LtAlgo) error {
	l, err := d.ltFor(s)
	if err != nil {
		return err
	}
	if err, ok := l.checked[a.Data]; ok {
		return err
	}
	var res heuristicResult
	if r := d.blas.ltAlgoCheck(d.ltH, l.desc, l.w, l.a, l.c, l.c, unsafe.Pointer(&a.Data[0]), unsafe.Pointer(&res)); r != 0 {
		err = fmt.Errorf("cuda: cuBLASLt algorithm %s does not run %d×%d×%d (status %d)", d.LtName(a), s.M, s.N, s.K, r)
	} else if res.workspace > LtWorkspace {
		err = fmt.Errorf("cuda: cuBLASLt algorithm %s needs %d bytes of workspace", d.LtName(a), res.workspace)
	}
	l.checked[a.Data] = err
	return err
}

// LtName describes an algorithm for reports ("algo 21 tile 18 split-k 1").
func (d *Device) LtName(a LtAlgo) string {
	get := func(attr int32) (int32, bool) {
		var v int32
		var n uint64
		r := d.blas.ltAlgoConfigGetter(unsafe.Pointer(&a.Data[0]), attr, unsafe.Pointer(&v), 4, &n)
		return v, r == 0
	}
	id, ok := get(ltConfigID)
	if !ok {
		return "cuBLASLt algorithm"
	}
	tile, _ := get(ltConfigTile)
	split, _ := get(ltConfigSplitK)
	return fmt.Sprintf("algo %d tile %d split-k %d", id, tile, split)
}

// LtMatmul runs spec with algorithm a: C = A·Wᵀ.
func (d *Device) LtMatmul(s LtSpec, a LtAlgo, A, W, C DevicePtr) error {
	l, err := d.ltFor(s)
	if err != nil {
		return err
	}
	ws, err := d.ltWorkspace()
	if err != nil {
		return err
	}
	one, zero := float32(1), float32(0)
	d.counted("cublasLtMatmul")
	r := d.blas.ltMatmul(d.ltH, l.desc, unsafe.Pointer(&one), uint64(W), l.w, uint64(A), l.a, unsafe.Pointer(&zero), uint64(C), l.c, uint64(C), l.c,
		unsafe.Pointer(&a.Data[0]), uint64(ws), LtWorkspace, d.cur)
	if r != 0 {
		return fmt.Errorf("cuda: cublasLtMatmul(%d×%d×%d, %s) failed with status %d", s.M, s.N, s.K, d.LtName(a), r)
	}
	return nil
}

// LtVersion is the loaded cuBLASLt's version (tuning tables record it: an
// algorithm struct belongs to the library that made it).
func (d *Device) LtVersion() uint64 { return d.blas.ltVersion() }

// releaseLt frees the descriptors and the workspace (inside Do).
func (d *Device) releaseLt() {
	for _, l := range d.lt {
		d.blas.ltLayoutDestroy(l.a)
		d.blas.ltLayoutDestroy(l.w)
		d.blas.ltLayoutDestroy(l.c)
		d.blas.ltDescDestroy(l.desc)
	}
	d.lt = nil
	if d.ltWS != 0 {
		d.Free(d.ltWS, LtWorkspace)
		d.ltWS = 0
		d.ltWSBytes.Store(0)
	}
}
