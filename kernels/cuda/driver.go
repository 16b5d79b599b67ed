package cuda

import (
	"fmt"
	"os"
	"unsafe"

	"github.com/ebitengine/purego"
)

// EmulatorEnv names a shared library that stands in for the driver,
// cuBLAS and cuBLASLt (bin/libglmflash-cudaemu.so, built by `make
// cudaemu`): the kernels' CUDA C sources compiled for the CPU. Tests use it
// to run the CUDA backend where there is no GPU.
const EmulatorEnv = "GLMFLASH_CUDA_EMULATOR"

// PDLEnv set to "0" turns programmatic dependent launch off (Device.PDL),
// e.g. to measure what it buys.
const PDLEnv = "GLMFLASH_CUDA_PDL"

// driver holds the CUDA driver API entry points glmflash calls.
type driver struct {
	cuInit                    func(flags uint32) int32
	cuDeviceGetCount          func(n *int32) int32
	cuDeviceGet               func(d *int32, ordinal int32) int32
	cuDeviceGetName           func(name *byte, n int32, d int32) int32
	cuDeviceGetAttribute      func(v *int32, attr int32, d int32) int32
	cuDeviceTotalMem          func(b *uint64, d int32) int32
	cuDevicePrimaryCtxRetain  func(ctx *uintptr, d int32) int32
	cuDevicePrimaryCtxRelease func(d int32) int32
	cuCtxSetCurrent           func(ctx uintptr) int32
	cuModuleLoadData          func(mod *uintptr, image *byte) int32
	cuModuleUnload            func(mod uintptr) int32
	cuModuleGetFunction       func(f *uintptr, mod uintptr, name *byte) int32
	cuMemAlloc                func(p *uint64, n uint64) int32
	cuMemFree                 func(p uint64) int32
	cuMemGetInfo              func(free, total *uint64) int32
	cuMemcpyHtoDAsync         func(dst uint64, src unsafe.Pointer, n uint64, s uintptr) int32
	cuMemcpyDtoHAsync         func(dst unsafe.Pointer, src uint64, n uint64, s uintptr) int32
	cuMemcpyDtoDAsync         func(dst, src uint64, n uint64, s uintptr) int32
	cuMemsetD32Async          func(dst uint64, v uint32, n uint64, s uintptr) int32
	cuLaunchKernel            func(f uintptr, gx, gy, gz, bx, by, bz, smem uint32, s uintptr, params, extra unsafe.Pointer) int32
	// cuLaunchKernelEx (CUDA 12+; nil where the library lacks it: the
	// emulator) launches with attributes (programmatic dependent launch).
	cuLaunchKernelEx            func(cfg *launchConfig, f uintptr, params, extra unsafe.Pointer) int32
	cuStreamCreate              func(s *uintptr, flags uint32) int32
	cuStreamDestroy             func(s uintptr) int32
	cuStreamSynchronize         func(s uintptr) int32
	cuStreamWaitEvent           func(s, e uintptr, flags uint32) int32
	cuEventCreate               func(e *uintptr, flags uint32) int32
	cuEventDestroy              func(e uintptr) int32
	cuEventRecord               func(e, s uintptr) int32
	cuEventSynchronize          func(e uintptr) int32
	cuEventElapsedTime          func(ms *float32, a, b uintptr) int32
	cuStreamBeginCapture        func(s uintptr, mode int32) int32
	cuStreamEndCapture          func(s uintptr, g *uintptr) int32
	cuGraphInstantiateWithFlags func(exec *uintptr, g uintptr, flags uint64) int32
	cuGraphLaunch               func(exec, s uintptr) int32
	cuGraphExecDestroy          func(exec uintptr) int32
	cuGraphDestroy              func(g uintptr) int32
	cuGetErrorName              func(r int32, s **byte) int32
	cuGetErrorString            func(r int32, s **byte) int32
	emulated                    bool
}

// cublasLib holds the cuBLAS and cuBLASLt entry points.
type cublasLib struct {
	create     func(h *uintptr) int32
	destroy    func(h uintptr) int32
	setStream  func(h, s uintptr) int32
	setMath    func(h uintptr, mode int32) int32
	sgemm      func(h uintptr, ta, tb int32, m, n, k int32, alpha *float32, a uint64, lda int32, b uint64, ldb int32, beta *float32, c uint64, ldc int32) int32
	gemmEx     func(h uintptr, ta, tb int32, m, n, k int32, alpha *float32, a uint64, atype int32, lda int32, b uint64, btype int32, ldb int32, beta *float32, c uint64, ctype int32, ldc int32, compute int32, algo int32) int32
	ltCreate   func(h *uintptr) int32
	ltDestroy  func(h uintptr) int32
	ltVersion  func() uint64
	cublasName string

	// cuBLASLt matmul (prefill-autotune chooses among its algorithms)
	ltDescCreate       func(d *uintptr, compute int32, scale int32) int32
	ltDescDestroy      func(d uintptr) int32
	ltDescSetAttr      func(d uintptr, attr int32, buf unsafe.Pointer, size uint64) int32
	ltLayoutCreate     func(l *uintptr, dtype int32, rows, cols uint64, ld int64) int32
	ltLayoutDestroy    func(l uintptr) int32
	ltPrefCreate       func(p *uintptr) int32
	ltPrefDestroy      func(p uintptr) int32
	ltPrefSetAttr      func(p uintptr, attr int32, buf unsafe.Pointer, size uint64) int32
	ltHeuristic        func(h, desc, a, b, c, d, pref uintptr, requested int32, results unsafe.Pointer, returned *int32) int32
	ltAlgoCheck        func(h, desc, a, b, c, d uintptr, algo unsafe.Pointer, result unsafe.Pointer) int32
	ltAlgoConfigGetter func(algo unsafe.Pointer, attr int32, buf unsafe.Pointer, size uint64, written *uint64) int32
	ltMatmul           func(h, desc uintptr, alpha unsafe.Pointer, a uint64, adesc uintptr, b uint64, bdesc uintptr, beta unsafe.Pointer, c uint64, cdesc uintptr, d uint64, ddesc uintptr, algo unsafe.Pointer, ws uint64, wsSize uint64, stream uintptr) int32
}

// Names of the libraries, in the order tried.
var (
	driverNames   = []string{"libcuda.so.1", "libcuda.so"}
	cublasNames   = []string{"libcublas.so.13", "libcublas.so.12", "libcublas.so"}
	cublasLtNames = []string{"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"}
)

func dlopenAny(names []string) (uintptr, string, error) {
	var errs []string
	for _, n := range names {
		h, err := purego.Dlopen(n, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err == nil {
			return h, n, nil
		}
		errs = append(errs, err.Error())
	}
	return 0, "", fmt.Errorf("%v", errs)
}

// bind registers every function field of fns (pointers to func variables)
// from lib, failing with the first missing symbol.
func bind(lib uintptr, what string, fns map[string]any) error {
	for name, fp := range fns {
		sym, err := purego.Dlsym(lib, name)
		if err != nil {
			return fmt.Errorf("%s has no symbol %s (too old?): %w", what, name, err)
		}
		purego.RegisterFunc(fp, sym)
	}
	return nil
}

func loadDriver() (*driver, error) {
	d := &driver{}
	names := driverNames
	if emu := os.Getenv(EmulatorEnv); emu != "" {
		names = []string{emu}
		d.emulated = true
	}
	lib, _, err := dlopenAny(names)
	if err != nil {
		if d.emulated {
			return nil, fmt.Errorf("the CUDA emulator %s (from %s) could not be loaded: %v", names[0], EmulatorEnv, err)
		}
		return nil, fmt.Errorf("no NVIDIA driver: libcuda.so.1 could not be loaded (%v); install the NVIDIA driver or use --device cpu", err)
	}
	err = bind(lib, "the NVIDIA driver (libcuda)", map[string]any{
		"cuInit": &d.cuInit, "cuDeviceGetCount": &d.cuDeviceGetCount,
		"cuDeviceGet": &d.cuDeviceGet, "cuDeviceGetName": &d.cuDeviceGetName, "cuDeviceGetAttribute": &d.cuDeviceGetAttribute,
		"cuDeviceTotalMem_v2": &d.cuDeviceTotalMem, "cuDevicePrimaryCtxRetain": &d.cuDevicePrimaryCtxRetain,
		"cuDevicePrimaryCtxRelease_v2": &d.cuDevicePrimaryCtxRelease, "cuCtxSetCurrent": &d.cuCtxSetCurrent,
		"cuModuleLoadData": &d.cuModuleLoadData, "cuModuleUnload": &d.cuModuleUnload,
		"cuModuleGetFunction": &d.cuModuleGetFunction,
		"cuMemAlloc_v2":       &d.cuMemAlloc, "cuMemFree_v2": &d.cuMemFree, "cuMemGetInfo_v2": &d.cuMemGetInfo,
		"cuMemcpyHtoDAsync_v2": &d.cuMemcpyHtoDAsync, "cuMemcpyDtoHAsync_v2": &d.cuMemcpyDtoHAsync,
		"cuMemcpyDtoDAsync_v2": &d.cuMemcpyDtoDAsync, "cuMemsetD32Async": &d.cuMemsetD32Async,
		"cuLaunchKernel": &d.cuLaunchKernel, "cuStreamCreate": &d.cuStreamCreate, "cuStreamDestroy_v2": &d.cuStreamDestroy,
		"cuStreamSynchronize": &d.cuStreamSynchronize, "cuStreamWaitEvent": &d.cuStreamWaitEvent, "cuEventCreate": &d.cuEventCreate, "cuEventDestroy_v2": &d.cuEventDestroy,
		"cuEventRecord": &d.cuEventRecord, "cuEventSynchronize": &d.cuEventSynchronize, "cuEventElapsedTime": &d.cuEventElapsedTime,
		"cuGetErrorName": &d.cuGetErrorName, "cuGetErrorString": &d.cuGetErrorString,
		"cuStreamBeginCapture_v2": &d.cuStreamBeginCapture, "cuStreamEndCapture": &d.cuStreamEndCapture,
		"cuGraphInstantiateWithFlags": &d.cuGraphInstantiateWithFlags, "cuGraphLaunch": &d.cuGraphLaunch,
		"cuGraphExecDestroy": &d.cuGraphExecDestroy, "cuGraphDestroy": &d.cuGraphDestroy,
	})
	if err != nil {
		return nil, err
	}
	if sym, err := purego.Dlsym(lib, "cuLaunchKernelEx"); err == nil {
		purego.RegisterFunc(&d.cuLaunchKernelEx, sym)
	}
	return d, nil
}

// launchAttribute mirrors CUlaunchAttribute: an id, padding to 8 bytes, and
// a 64-byte value union.
type launchAttribute struct {
	id    uint32
	_     uint32
	value [64]byte
}

// launchConfig mirrors CUlaunchConfig (cuda.h, CUDA 12+).
type launchConfig struct {
	gridX, gridY, gridZ, blockX, blockY, blockZ, smem uint32
	_                                                 uint32
	stream                                            uintptr
	attrs                                             *launchAttribute
	numAttrs                                          uint32
	_                                                 uint32
}

// attrProgrammaticStreamSerialization is
// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: the launch may
// begin before the previous kernel in the stream ends; the kernel waits for
// it itself (griddepcontrol.wait, pdl_enter in common.cuh).
const attrProgrammaticStreamSerialization = 6

func loadCublas() (*cublasLib, error) {
	c := &cublasLib{}
	names, ltNames := cublasNames, cublasLtNames
	if emu := os.Getenv(EmulatorEnv); emu != "" {
		names, ltNames = []string{emu}, []string{emu}
	}
	lib, name, err := dlopenAny(names)
	if err != nil {
		return nil, fmt.Errorf("no cuBLAS: %s could not be loaded (%v); install the CUDA toolkit's cuBLAS (or the nvidia-cublas package) and put it on the loader path", names[0], err)
	}
	c.cublasName = name
	if err := bind(lib, "cuBLAS ("+name+")", map[string]any{
		"cublasCreate_v2": &c.create, "cublasDestroy_v2": &c.destroy, "cublasSetStream_v2": &c.setStream,
		"cublasSetMathMode": &c.setMath, "cublasSgemm_v2": &c.sgemm, "cublasGemmEx": &c.gemmEx,
	}); err != nil {
		return nil, err
	}
	lt, ltName, err := dlopenAny(ltNames)
	if err != nil {
		return nil, fmt.Errorf("no cuBLASLt: %s could not be loaded (%v); it ships with cuBLAS", ltNames[0], err)
	}
	if err := bind(lt, "cuBLASLt ("+ltName+")", map[string]any{
		"cublasLtCreate": &c.ltCreate, "cublasLtDestroy": &c.ltDestroy, "cublasLtGetVersion": &c.ltVersion,
		"cublasLtMatmulDescCreate": &c.ltDescCreate, "cublasLtMatmulDescDestroy": &c.ltDescDestroy,
		"cublasLtMatmulDescSetAttribute": &c.ltDescSetAttr, "cublasLtMatrixLayoutCreate": &c.ltLayoutCreate,
		"cublasLtMatrixLayoutDestroy": &c.ltLayoutDestroy, "cublasLtMatmulPreferenceCreate": &c.ltPrefCreate,
		"cublasLtMatmulPreferenceDestroy": &c.ltPrefDestroy, "cublasLtMatmulPreferenceSetAttribute": &c.ltPrefSetAttr,
		"cublasLtMatmulAlgoGetHeuristic": &c.ltHeuristic, "cublasLtMatmulAlgoCheck": &c.ltAlgoCheck,
		"cublasLtMatmulAlgoConfigGetAttribute": &c.ltAlgoConfigGetter, "cublasLtMatmul": &c.ltMatmul,
	}); err != nil {
		return nil, err
	}
	return c, nil
}

func cString(p *byte) string {
	if p == nil {
		return ""
	}
	var b []byte
	for q := unsafe.Pointer(p); *(*byte)(q) != 0; q = unsafe.Add(q, 1) {
		b = append(b, *(*byte)(q))
	}
	return string(b)
}

// Error is a failed CUDA call.
type Error struct {
	Call string
	Code int32
	Name string
	Msg  string
}

func (e *Error) Error() string {
	return fmt.Sprintf("cuda: %s: %s (%d: %s)", e.Call, e.Name, e.Code, e.Msg)
}

func (d *driver) check(call string, r int32) error {
	if r == 0 {
		return nil
	}
	e := &Error{Call: call, Code: r}
	var n, s *byte
	if d.cuGetErrorName(r, &n) == 0 {
		e.Name = cString(n)
	}
	if d.cuGetErrorString(r, &s) == 0 {
		e.Msg = cString(s)
	}
	return e
}
