// Package cuda drives NVIDIA GPUs from pure Go: the driver API, cuBLAS and
// cuBLASLt loaded at run time through purego (no cgo, no toolkit needed to
// build), glmflash's kernels as PTX generated from src/*.cu and embedded,
// and typed launchers for them. It knows nothing of graphs; the CUDA
// backend (core/backend/cuda) binds ops to these kernels.
package cuda

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Device is one GPU with a context, a stream, glmflash's module and a
// cuBLAS handle. All calls that touch the device run inside Do, which holds
// the device's lock on a locked OS thread with the context current (a CUDA
// context is current per OS thread; goroutines migrate).
type Device struct {
	drv    *driver
	blas   *cublasLib
	idx    int32
	dev    int32
	ctx    uintptr
	stream uintptr
	// side is the second stream (Fork, OnSide, Join): work the graph
	// marks as a side branch runs there beside the main stream's; cur is
	// the stream launches, copies and library calls go to now; forked says
	// the side stream has work the main stream has not joined.
	side, cur      uintptr
	evFork, evJoin uintptr
	forked         bool
	mod            uintptr
	funcs          map[string]kernelFn
	blasH          uintptr
	ltH            uintptr

	Name        string
	CC          [2]int // compute capability
	SMs         int
	TotalMemory int64
	Emulated    bool
	// PDL: kernels launch with programmatic dependent launch (compute 9.0+,
	// a driver with cuLaunchKernelEx, and PDLEnv not "0"): a kernel's
	// launch and prologue overlap the end of the one before it, and every
	// kernel waits for its predecessor before reading anything
	// (griddepcontrol.wait), so results are unchanged.
	PDL bool
	// pdlCfg is the launch configuration PDL launches reuse.
	pdlCfg  launchConfig
	pdlAttr launchAttribute

	mu       sync.Mutex
	closed   bool
	launches atomic.Int64
	syncs    atomic.Int64
	live     atomic.Int64 // bytes allocated through Alloc

	// runs counts executions by kernel (and cuBLAS call) index, graph
	// replays included; only touched inside Do.
	kernelIdx map[string]int
	names     []string
	runs      []int64

	// cuBLASLt descriptors by GEMM spec, and the matmuls' workspace
	lt   map[LtSpec]*ltDescs
	ltWS DevicePtr
	// ltWSBytes mirrors ltWS's size for readers outside Do.
	ltWSBytes atomic.Int64
}

// kernelIndex returns the counter index of a kernel or library call,
// adding it on first use (inside Do).
func (d *Device) kernelIndex(name string) int {
	if i, ok := d.kernelIdx[name]; ok {
		return i
	}
	if d.kernelIdx == nil {
		d.kernelIdx = map[string]int{}
	}
	i := len(d.names)
	d.kernelIdx[name] = i
	d.names = append(d.names, name)
	d.runs = append(d.runs, 0)
	return i
}

// counted records one launch call of a kernel or library routine.
func (d *Device) counted(name string) {
	d.launches.Add(1)
	d.runs[d.kernelIndex(name)]++
}

// KernelRuns copies the executions by kernel index into dst (grown as
// needed) and returns it; KernelName names an index. Inside Do.
func (d *Device) KernelRuns(dst []int64) []int64 {
	dst = append(dst[:0], d.runs...)
	return dst
}

// KernelName names a kernel index of KernelRuns.
func (d *Device) KernelName(i int) string { return d.names[i] }

// Open initialises GPU index idx: it fails at once, naming what is missing
// (driver, GPU, cuBLAS), when the machine cannot run CUDA.
func Open(idx int) (*Device, error) {
	drv, err := loadDriver()
	if err != nil {
		return nil, err
	}
	if err := drv.check("cuInit", drv.cuInit(0)); err != nil {
		return nil, fmt.Errorf("no usable GPU: %w", err)
	}
	var n int32
	if err := drv.check("cuDeviceGetCount", drv.cuDeviceGetCount(&n)); err != nil {
		return nil, fmt.Errorf("no usable GPU: %w", err)
	}
	if n == 0 {
		return nil, fmt.Errorf("no GPU: the NVIDIA driver sees no device")
	}
	if idx < 0 || int32(idx) >= n {
		return nil, fmt.Errorf("no GPU %d: the driver sees %d device(s)", idx, n)
	}
	blas, err := loadCublas()
	if err != nil {
		return nil, err
	}
	d := &Device{drv: drv, blas: blas, idx: int32(idx), funcs: map[string]kernelFn{}, Emulated: drv.emulated}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := d.init(); err != nil {
		d.release()
		return nil, err
	}
	return d, nil
}

func (d *Device) init() error {
	drv := d.drv
	if err := drv.check("cuDeviceGet", drv.cuDeviceGet(&d.dev, d.idx)); err != nil {
		return err
	}
	name := make([]byte, 256)
	if err := drv.check("cuDeviceGetName", drv.cuDeviceGetName(&name[0], int32(len(name)), d.dev)); err != nil {
		return err
	}
	d.Name = cString(&name[0])
	var major, minor, sms int32
	drv.cuDeviceGetAttribute(&major, 75, d.dev)
	drv.cuDeviceGetAttribute(&minor, 76, d.dev)
	drv.cuDeviceGetAttribute(&sms, 16, d.dev)
	d.CC, d.SMs = [2]int{int(major), int(minor)}, int(sms)
	var total uint64
	if err := drv.check("cuDeviceTotalMem", drv.cuDeviceTotalMem(&total, d.dev)); err != nil {
		return err
	}
	d.TotalMemory = int64(total)
	if err := drv.check("cuDevicePrimaryCtxRetain", drv.cuDevicePrimaryCtxRetain(&d.ctx, d.dev)); err != nil {
		return err
	}
	if err := drv.check("cuCtxSetCurrent", drv.cuCtxSetCurrent(d.ctx)); err != nil {
		return err
	}
	if err := drv.check("cuStreamCreate", drv.cuStreamCreate(&d.stream, 0)); err != nil {
		return err
	}
	if err := drv.check("cuStreamCreate", drv.cuStreamCreate(&d.side, 0)); err != nil {
		return err
	}
	d.cur = d.stream
	// CU_EVENT_DISABLE_TIMING: ordering only
	for _, e := range []*uintptr{&d.evFork, &d.evJoin} {
		if err := drv.check("cuEventCreate", drv.cuEventCreate(e, 2)); err != nil {
			return err
		}
	}
	d.PDL = drv.cuLaunchKernelEx != nil && !drv.emulated && d.CC[0] >= 9 && os.Getenv(PDLEnv) != "0"
	d.pdlAttr.id = attrProgrammaticStreamSerialization
	d.pdlAttr.value[0] = 1 // programmaticStreamSerializationAllowed
	d.pdlCfg.stream, d.pdlCfg.attrs, d.pdlCfg.numAttrs = d.stream, &d.pdlAttr, 1
	if err := d.loadModule(); err != nil {
		return err
	}
	if r := d.blas.create(&d.blasH); r != 0 {
		return fmt.Errorf("cuda: cublasCreate failed with status %d", r)
	}
	if r := d.blas.setStream(d.blasH, d.stream); r != 0 {
		return fmt.Errorf("cuda: cublasSetStream failed with status %d", r)
	}
	// CUBLAS_PEDANTIC_MATH: fp32 GEMMs in fp32, never TF32.
	if r := d.blas.setMath(d.blasH, 2); r != 0 {
		return fmt.Errorf("cuda: cublasSetMathMode failed with status %d", r)
	}
	if r := d.blas.ltCreate(&d.ltH); r != 0 {
		return fmt.Errorf("cuda: cublasLtCreate failed with status %d", r)
	}
	return nil
}

func (d *Device) loadModule() error {
	ptx, err := PTXFor(d.CC[0], d.CC[1])
	if err != nil {
		return err
	}
	img := append([]byte(ptx), 0)
	if err := d.drv.check("cuModuleLoadData", d.drv.cuModuleLoadData(&d.mod, &img[0])); err != nil {
		return fmt.Errorf("loading glmflash's PTX on %s (compute %d.%d): %w", d.Name, d.CC[0], d.CC[1], err)
	}
	runtime.KeepAlive(img)
	for _, k := range EntryNames(ptx) { // the loaded PTX's kernels (a PTXDirEnv file may have more than the embedded)
		name := append([]byte(k), 0)
		var f uintptr
		if err := d.drv.check("cuModuleGetFunction("+k+")", d.drv.cuModuleGetFunction(&f, d.mod, &name[0])); err != nil {
			return err
		}
		d.funcs[k] = kernelFn{f: f, idx: d.kernelIndex(k)}
	}
	return nil
}

// kernelFn is a loaded kernel and its counter index (one lookup a launch).
type kernelFn struct {
	f   uintptr
	idx int
}

// release frees what init made (called with the context current).
func (d *Device) release() {
	d.releaseLt()
	if d.ltH != 0 {
		d.blas.ltDestroy(d.ltH)
	}
	if d.blasH != 0 {
		d.blas.destroy(d.blasH)
	}
	if d.mod != 0 {
		d.drv.cuModuleUnload(d.mod)
	}
	for _, e := range []uintptr{d.evFork, d.evJoin} {
		if e != 0 {
			d.drv.cuEventDestroy(e)
		}
	}
	if d.side != 0 {
		d.drv.cuStreamDestroy(d.side)
	}
	if d.stream != 0 {
		d.drv.cuStreamDestroy(d.stream)
	}
	if d.ctx != 0 {
		d.drv.cuDevicePrimaryCtxRelease(d.dev)
	}
}

// Close releases the context; memory allocated through the device must be
// freed first (Live reports what is left).
func (d *Device) Close() error {
	return d.do(func() error {
		if d.closed {
			return nil
		}
		d.release()
		d.closed = true
		return nil
	}, true)
}

// Do runs fn with the device locked and its context current on this OS
// thread. Device methods other than Do, Close and the counters must be
// called inside fn.
func (d *Device) Do(fn func() error) error { return d.do(fn, false) }

func (d *Device) do(fn func() error, closing bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		if closing {
			return nil
		}
		return fmt.Errorf("cuda: device %s is closed", d.Name)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := d.drv.check("cuCtxSetCurrent", d.drv.cuCtxSetCurrent(d.ctx)); err != nil {
		return err
	}
	return fn()
}

// Launches is the number of kernel launches so far; Syncs the number of
// times the host waited for the device.
func (d *Device) Launches() int64 { return d.launches.Load() }

// Syncs counts host waits for the device.
func (d *Device) Syncs() int64 { return d.syncs.Load() }

// Live is the device memory currently allocated through Alloc.
func (d *Device) Live() int64 { return d.live.Load() }

// MemInfo is the device memory free for allocation and in all, as the
// driver sees it (cuMemGetInfo: every process's allocations, this one's
// pools and graphs included). It must be called on the device's thread
// (Do), as every driver call.
func (d *Device) MemInfo() (free, total int64, err error) {
	var f, t uint64
	if err := d.drv.check("cuMemGetInfo", d.drv.cuMemGetInfo(&f, &t)); err != nil {
		return 0, 0, err
	}
	return int64(f), int64(t), nil
}

// Alloc allocates n bytes of device memory (at least 1).
func (d *Device) Alloc(n int64) (DevicePtr, error) {
	if n < 1 {
		n = 1
	}
	var p uint64
	if err := d.drv.check(fmt.Sprintf("cuMemAlloc(%d bytes)", n), d.drv.cuMemAlloc(&p, uint64(n))); err != nil {
		return 0, err
	}
	d.live.Add(n)
	return DevicePtr(p), nil
}

// Free releases memory from Alloc (n: its size, for the accounting).
func (d *Device) Free(p DevicePtr, n int64) error {
	if p == 0 {
		return nil
	}
	if n < 1 {
		n = 1
	}
	d.live.Add(-n)
	return d.drv.check("cuMemFree", d.drv.cuMemFree(uint64(p)))
}

// Upload copies n bytes from host memory at src to dst (stream-ordered;
// src may be reused when it returns).
func (d *Device) Upload(dst DevicePtr, src unsafe.Pointer, n int64) error {
	if n == 0 {
		return nil
	}
	err := d.drv.check("cuMemcpyHtoDAsync", d.drv.cuMemcpyHtoDAsync(uint64(dst), src, uint64(n), d.cur))
	return err
}

// Download waits for the stream and copies n bytes from src to host dst.
func (d *Device) Download(dst unsafe.Pointer, src DevicePtr, n int64) error {
	if err := d.Sync(); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	return d.drv.check("cuMemcpyDtoHAsync", d.drv.cuMemcpyDtoHAsync(dst, uint64(src), uint64(n), d.stream))
}

// Copy copies n bytes between device buffers (stream-ordered).
func (d *Device) Copy(dst, src DevicePtr, n int64) error {
	if n == 0 {
		return nil
	}
	return d.drv.check("cuMemcpyDtoDAsync", d.drv.cuMemcpyDtoDAsync(uint64(dst), uint64(src), uint64(n), d.cur))
}

// Zero sets n 32-bit words at p to zero (stream-ordered).
func (d *Device) Zero(p DevicePtr, words int64) error {
	if words == 0 {
		return nil
	}
	return d.drv.check("cuMemsetD32Async", d.drv.cuMemsetD32Async(uint64(p), 0, uint64(words), d.cur))
}

// Sync waits until the stream's work is done (one host sync).
func (d *Device) Sync() error {
	d.syncs.Add(1)
	if d.forked { // an open side branch finishes too
		if err := d.drv.check("cuStreamSynchronize", d.drv.cuStreamSynchronize(d.side)); err != nil {
			return err
		}
	}
	return d.drv.check("cuStreamSynchronize", d.drv.cuStreamSynchronize(d.stream))
}

// Fork opens a side branch: the side stream waits for everything issued
// on the main stream so far, and launches go to it (OnSide(true)) until
// OnSide(false) or Join. Inside a Capture the side stream joins the
// capture, and the branch becomes parallel nodes of the graph.
func (d *Device) Fork() error {
	if d.forked {
		return fmt.Errorf("cuda: Fork: the side stream is already forked")
	}
	if err := d.drv.check("cuEventRecord", d.drv.cuEventRecord(d.evFork, d.stream)); err != nil {
		return err
	}
	if err := d.drv.check("cuStreamWaitEvent", d.drv.cuStreamWaitEvent(d.side, d.evFork, 0)); err != nil {
		return err
	}
	d.forked = true
	return d.OnSide(true)
}

// OnSide sends the following launches to the side stream (true, only
// while forked) or the main one.
func (d *Device) OnSide(side bool) error {
	if side && !d.forked {
		return fmt.Errorf("cuda: OnSide: the side stream is not forked")
	}
	s := d.stream
	if side {
		s = d.side
	}
	if s == d.cur {
		return nil
	}
	d.cur = s
	if r := d.blas.setStream(d.blasH, s); r != 0 {
		return fmt.Errorf("cuda: cublasSetStream failed with status %d", r)
	}
	return nil
}

// Join closes the side branch: the main stream waits for everything
// issued on the side stream, and launches go to the main stream.
func (d *Device) Join() error {
	if !d.forked {
		return d.OnSide(false)
	}
	if err := d.drv.check("cuEventRecord", d.drv.cuEventRecord(d.evJoin, d.side)); err != nil {
		return err
	}
	if err := d.drv.check("cuStreamWaitEvent", d.drv.cuStreamWaitEvent(d.stream, d.evJoin, 0)); err != nil {
		return err
	}
	d.forked = false
	return d.OnSide(false)
}

// Dim3 is a launch dimension.
type Dim3 struct{ X, Y, Z uint32 }

// launch starts kernel name with the argument struct at args (through
// the typed launchers of args_gen.go, which pass each kernel its own struct).
func (d *Device) launch(name string, grid, block Dim3, smem int, args unsafe.Pointer) error {
	k, ok := d.funcs[name]
	if !ok {
		return fmt.Errorf("cuda: no kernel %s in the module", name)
	}
	if grid.Y == 0 {
		grid.Y = 1
	}
	if grid.Z == 0 {
		grid.Z = 1
	}
	if block.Y == 0 {
		block.Y = 1
	}
	if block.Z == 0 {
		block.Z = 1
	}
	if grid.X == 0 {
		return nil // nothing to do
	}
	params := [1]unsafe.Pointer{args}
	var r int32
	if d.PDL {
		c := &d.pdlCfg
		c.stream = d.cur
		c.gridX, c.gridY, c.gridZ, c.blockX, c.blockY, c.blockZ, c.smem = grid.X, grid.Y, grid.Z, block.X, block.Y, block.Z, uint32(smem)
		r = d.drv.cuLaunchKernelEx(c, k.f, unsafe.Pointer(&params[0]), nil)
	} else {
		r = d.drv.cuLaunchKernel(k.f, grid.X, grid.Y, grid.Z, block.X, block.Y, block.Z, uint32(smem), d.cur, unsafe.Pointer(&params[0]), nil)
	}
	runtime.KeepAlive(args)
	d.launches.Add(1)
	d.runs[k.idx]++
	if r != 0 {
		return d.drv.check("cuLaunchKernel("+name+")", r)
	}
	return nil
}

// Sgemm runs cuBLAS's fp32 GEMM (pedantic math: no TF32) on row-major
// matrices: C[M][N] = A[M][K]·W[N][K]ᵀ, with leading dimensions lda, ldc.
func (d *Device) Sgemm(M, N, K int, A DevicePtr, lda int, W DevicePtr, C DevicePtr, ldc int) error {
	one, zero := float32(1), float32(0)
	if r := d.blas.setMath(d.blasH, 2); r != 0 { // CUBLAS_PEDANTIC_MATH
		return fmt.Errorf("cuda: cublasSetMathMode failed with status %d", r)
	}
	// column-major view: Cᵀ[N][M] = W[N][K] · Aᵀ
	d.counted("cublasSgemm")
	r := d.blas.sgemm(d.blasH, 1, 0, int32(N), int32(M), int32(K), &one, uint64(W), int32(K), uint64(A), int32(lda), &zero, uint64(C), int32(ldc))
	if r != 0 {
		return fmt.Errorf("cuda: cublasSgemm(%d×%d×%d) failed with status %d", M, N, K, r)
	}
	return nil
}

// GemmBF16 runs cuBLAS's bf16 GEMM with fp32 accumulation (tensor cores)
// on row-major matrices: C[M][N] (fp32) = A[M][K]·W[N][K]ᵀ with A and W
// bf16, leading dimensions in elements.
func (d *Device) GemmBF16(M, N, K int, A DevicePtr, lda int, W DevicePtr, ldw int, C DevicePtr, ldc int) error {
	const (
		bf16, f32       = 14, 0 // CUDA_R_16BF, CUDA_R_32F
		compute32F      = 68    // CUBLAS_COMPUTE_32F
		algoDefault     = -1    // CUBLAS_GEMM_DEFAULT
		defaultMathMode = 0     // CUBLAS_DEFAULT_MATH: tensor cores allowed
	)
	if r := d.blas.setMath(d.blasH, defaultMathMode); r != 0 {
		return fmt.Errorf("cuda: cublasSetMathMode failed with status %d", r)
	}
	one, zero := float32(1), float32(0)
	d.counted("cublasGemmEx")
	r := d.blas.gemmEx(d.blasH, 1, 0, int32(N), int32(M), int32(K), &one, uint64(W), bf16, int32(ldw), uint64(A), bf16, int32(lda), &zero, uint64(C), f32, int32(ldc), compute32F, algoDefault)
	if r != 0 {
		return fmt.Errorf("cuda: cublasGemmEx(bf16, %d×%d×%d) failed with status %d", M, N, K, r)
	}
	return nil
}

// BlasVersion describes the loaded cuBLAS.
func (d *Device) BlasVersion() string {
	return fmt.Sprintf("%s, cuBLASLt %d", d.blas.cublasName, d.blas.ltVersion())
}

// Event is a device timestamp.
type Event uintptr

// Record records an event on the stream.
func (d *Device) Record() (Event, error) {
	var e uintptr
	if err := d.drv.check("cuEventCreate", d.drv.cuEventCreate(&e, 0)); err != nil {
		return 0, err
	}
	return Event(e), d.drv.check("cuEventRecord", d.drv.cuEventRecord(e, d.stream))
}

// NewEvent creates an event to record again and again (RecordEvent,
// ElapsedKeep); DestroyEvent frees it.
func (d *Device) NewEvent() (Event, error) {
	var e uintptr
	err := d.drv.check("cuEventCreate", d.drv.cuEventCreate(&e, 0))
	return Event(e), err
}

// RecordEvent records e on the stream (outside a capture).
func (d *Device) RecordEvent(e Event) error {
	return d.drv.check("cuEventRecord", d.drv.cuEventRecord(uintptr(e), d.stream))
}

// DestroyEvent frees an event from NewEvent.
func (d *Device) DestroyEvent(e Event) {
	if e != 0 {
		d.drv.cuEventDestroy(uintptr(e))
	}
}

// ElapsedKeep returns the milliseconds from a to b (waiting for b), keeping
// both events. Not counted as a host sync: callers use it once the stream
// has been synchronized anyway.
func (d *Device) ElapsedKeep(a, b Event) (float64, error) {
	if err := d.drv.check("cuEventSynchronize", d.drv.cuEventSynchronize(uintptr(b))); err != nil {
		return 0, err
	}
	var ms float32
	err := d.drv.check("cuEventElapsedTime", d.drv.cuEventElapsedTime(&ms, uintptr(a), uintptr(b)))
	return float64(ms), err
}

// Elapsed waits for b and returns the milliseconds from a to b, then
// destroys both events.
func (d *Device) Elapsed(a, b Event) (float64, error) {
	defer d.drv.cuEventDestroy(uintptr(a))
	defer d.drv.cuEventDestroy(uintptr(b))
	if err := d.drv.check("cuEventSynchronize", d.drv.cuEventSynchronize(uintptr(b))); err != nil {
		return 0, err
	}
	var ms float32
	err := d.drv.check("cuEventElapsedTime", d.drv.cuEventElapsedTime(&ms, uintptr(a), uintptr(b)))
	return float64(ms), err
}

// Graph is an instantiated CUDA graph: a recorded sequence of launches
// replayed with one call.
type Graph struct {
	exec, g uintptr
	// perKernel is what one replay runs, by kernel index.
	perKernel []int64
}

// Capture records the launches fn makes on the device's stream into a
// graph instead of running them (nothing runs until Replay). fn must only
// launch kernels: copies and syncs during a capture are errors.
func (d *Device) Capture(fn func() error) (*Graph, error) {
	// CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: other threads' unsafe calls are
	// not affected; this thread must not make any.
	if err := d.drv.check("cuStreamBeginCapture", d.drv.cuStreamBeginCapture(d.stream, 1)); err != nil {
		return nil, err
	}
	l0 := d.launches.Load()
	r0 := append([]int64(nil), d.runs...)
	ferr := fn()
	if d.forked && ferr == nil {
		ferr = fmt.Errorf("cuda: Capture: the side stream was forked and never joined")
	}
	if d.forked {
		ferr = errors.Join(ferr, d.Join())
	}
	var g uintptr
	eerr := d.drv.check("cuStreamEndCapture", d.drv.cuStreamEndCapture(d.stream, &g))
	kernels := d.launches.Load() - l0
	d.launches.Add(-kernels) // recorded, not launched
	per := make([]int64, len(d.runs))
	for i := range d.runs {
		if i < len(r0) {
			per[i] = d.runs[i] - r0[i]
			d.runs[i] = r0[i]
		} else {
			per[i], d.runs[i] = d.runs[i], 0
		}
	}
	if ferr != nil || eerr != nil {
		if g != 0 {
			d.drv.cuGraphDestroy(g)
		}
		if ferr != nil {
			return nil, ferr
		}
		return nil, eerr
	}
	var exec uintptr
	if err := d.drv.check("cuGraphInstantiate", d.drv.cuGraphInstantiateWithFlags(&exec, g, 0)); err != nil {
		d.drv.cuGraphDestroy(g)
		return nil, err
	}
	return &Graph{exec: exec, g: g, perKernel: per}, nil
}

// Replay launches a graph on the stream.
func (d *Device) Replay(gr *Graph) error {
	d.launches.Add(1)
	for i, n := range gr.perKernel {
		d.runs[i] += n
	}
	return d.drv.check("cuGraphLaunch", d.drv.cuGraphLaunch(gr.exec, d.stream))
}

// Destroy frees a graph.
func (d *Device) Destroy(gr *Graph) {
	if gr == nil {
		return
	}
	d.drv.cuGraphExecDestroy(gr.exec)
	d.drv.cuGraphDestroy(gr.g)
}
