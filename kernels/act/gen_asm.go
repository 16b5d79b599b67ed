//go:build ignore

// gen_asm writes kernels_amd64.s and kernels_amd64.go: the SIMD
// elementwise kernels of package act, for AVX-512 and AVX2 (+FMA). Run it
// with `go generate` (or `go run gen_asm.go`) inside kernels/act.
//
// Every kernel processes nvec whole vectors (16 or 8 float32 lanes); the Go
// wrappers run a partial last vector through a padded buffer, so every
// element goes through the same instructions wherever it lies in a slice.
//
// The math (mirrored exactly by the pure-Go fallback in vec.go):
//
//	exp(x):      x clamped to [−104, 88.75] (NaN kept), n = round(x·log2e),
//	             r = x − n·ln2 (two-part ln2, FMAs), e^r by Cephes' degree-6
//	             polynomial, scaled by 2^⌊n/2⌋·2^(n−⌊n/2⌋) (two exact
//	             factors, so overflow gives +Inf and underflow rounds once
//	             into the subnormals)
//	sigmoid(x):  e = exp(−|x|), s = 1/(1+e); x ≥ 0 → s, else e·s (the sign
//	             bit selects, so −0 gives 0.5 and no branch overflows)
//	softplus(v): max(v, 0) + log1p(exp(−|v|)), log1p(u) for u ∈ [0, 1] as
//	             log(w) + (u − (w−1))/w with w = 1+u, log by Cephes' logf
//	             polynomial on w or w/2
package main

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"strings"
)

type isa struct {
	name string // avx512 | avx2
	vw   int    // float32 lanes per vector
	vr   string // register prefix
}

var (
	avx512 = isa{name: "avx512", vw: 16, vr: "Z"}
	avx2   = isa{name: "avx2", vw: 8, vr: "Y"}
)

// constants: name → value, each stored as 16 copies (a full zmm) so either
// ISA can use it as a memory operand.
var consts = []struct {
	name string
	v    float32
}{
	{"expHi", 88.75},
	{"expLo", -104},
	{"log2e", float32(math.Log2E)},
	{"ln2Hi", 0.693359375},
	{"ln2Lo", -2.12194440e-4},
	{"ep0", 1.9875691500e-4},
	{"ep1", 1.3981999507e-3},
	{"ep2", 8.3334519073e-3},
	{"ep3", 4.1665795894e-2},
	{"ep4", 1.6666665459e-1},
	{"ep5", 5.0000001201e-1},
	{"one", 1},
	{"half", 0.5},
	{"sqrt2", float32(math.Sqrt2)},
	{"lp0", 7.0376836292e-2},
	{"lp1", -1.1514610310e-1},
	{"lp2", 1.1676998740e-1},
	{"lp3", -1.2420140846e-1},
	{"lp4", 1.4249322787e-1},
	{"lp5", -1.6668057665e-1},
	{"lp6", 2.0000714765e-1},
	{"lp7", -2.4999993993e-1},
	{"lp8", 3.3333331174e-1},
	{"mhalf", -0.5},
}

// integer constants (16 copies of a 32-bit word)
var iconsts = []struct {
	name string
	v    uint32
}{
	{"signBit", 0x80000000},
	{"bias127", 127},
}

type gen struct {
	b  bytes.Buffer
	is isa
}

func (g *gen) p(format string, args ...any) {
	fmt.Fprintf(&g.b, format, args...)
	g.b.WriteByte('\n')
}

func (g *gen) i(format string, args ...any) {
	g.b.WriteByte('\t')
	g.p(format, args...)
}

// v names vector register n.
func (g *gen) v(n int) string { return fmt.Sprintf("%s%d", g.is.vr, n) }

func c(name string) string { return name + "<>(SB)" }

// exp replaces register x with e^x; t1..t3 are scratch.
func (g *gen) exp(x, t1, t2, t3 string) {
	// clamp with x as the second source operand: a NaN x is kept
	g.i("VMOVUPS %s, %s", c("expHi"), t1)
	g.i("VMINPS %s, %s, %s", x, t1, x)
	g.i("VMOVUPS %s, %s", c("expLo"), t1)
	g.i("VMAXPS %s, %s, %s", x, t1, x)
	g.i("VMULPS %s, %s, %s", c("log2e"), x, t1)
	if g.is.name == "avx512" {
		g.i("VRNDSCALEPS $8, %s, %s", t1, t1)
	} else {
		g.i("VROUNDPS $8, %s, %s", t1, t1)
	}
	g.i("VFNMADD231PS %s, %s, %s", c("ln2Hi"), t1, x)
	g.i("VFNMADD231PS %s, %s, %s", c("ln2Lo"), t1, x)
	g.i("VMOVUPS %s, %s", c("ep0"), t2)
	for _, k := range []string{"ep1", "ep2", "ep3", "ep4", "ep5"} {
		g.i("VFMADD213PS %s, %s, %s", c(k), x, t2)
	}
	g.i("VMULPS %s, %s, %s", x, x, t3)
	g.i("VFMADD213PS %s, %s, %s", x, t3, t2) // t2 = t3·t2 + x
	g.i("VADDPS %s, %s, %s", c("one"), t2, t2)
	// 2^n as two exact factors 2^n1 · 2^n2, n1 = n>>1, n2 = n − n1
	g.i("VCVTPS2DQ %s, %s", t1, t1)
	g.i("VPSRAD $1, %s, %s", t1, t3)
	g.i("VPSUBD %s, %s, %s", t3, t1, t1)
	g.i("VPADDD %s, %s, %s", c("bias127"), t3, t3)
	g.i("VPSLLD $23, %s, %s", t3, t3)
	g.i("VPADDD %s, %s, %s", c("bias127"), t1, t1)
	g.i("VPSLLD $23, %s, %s", t1, t1)
	g.i("VMULPS %s, %s, %s", t3, t2, t2)
	g.i("VMULPS %s, %s, %s", t1, t2, x)
}

// sigmoid replaces x with 1/(1+e^−x); t1..t5 are scratch.
func (g *gen) sigmoid(x, t1, t2, t3, t4, t5 string) {
	g.i("VORPS %s, %s, %s", c("signBit"), x, t4) // −|x|
	g.exp(t4, t1, t2, t3)                        // e = exp(−|x|)
	g.i("VADDPS %s, %s, %s", c("one"), t4, t1)
	g.i("VMOVUPS %s, %s", c("one"), t5)
	g.i("VDIVPS %s, %s, %s", t1, t5, t5) // s = 1/(1+e)
	g.i("VMULPS %s, %s, %s", t5, t4, t4) // e·s
	// x's sign bit picks e·s
	if g.is.name == "avx512" {
		g.i("VPMOVD2M %s, K1", x)
		g.i("VBLENDMPS %s, %s, K1, %s", t4, t5, x)
	} else {
		g.i("VBLENDVPS %s, %s, %s, %s", x, t4, t5, x)
	}
}

// softplus replaces x with log(1+e^x); t1..t6 are scratch.
func (g *gen) softplus(x, t1, t2, t3, t4, t5, t6 string) {
	g.i("VORPS %s, %s, %s", c("signBit"), x, t4) // −|x|
	g.exp(t4, t1, t2, t3)                        // u = exp(−|x|) ∈ [0, 1]
	g.i("VADDPS %s, %s, %s", c("one"), t4, t5)   // w = 1+u
	g.i("VSUBPS %s, %s, %s", c("one"), t5, t1)   // w−1 (exact)
	g.i("VSUBPS %s, %s, %s", t1, t4, t4)         // u − (w−1)
	g.i("VDIVPS %s, %s, %s", t5, t4, t4)         // corr = (u − (w−1))/w
	// big = w > √2: m = w/2 (exponent 1), else m = w (exponent 0)
	g.i("VMULPS %s, %s, %s", c("half"), t5, t1)
	if g.is.name == "avx512" {
		g.i("VCMPPS $14, %s, %s, K1", c("sqrt2"), t5)
		g.i("VBLENDMPS %s, %s, K1, %s", t1, t5, t5)
		g.i("VMOVUPS.Z %s, K1, %s", c("one"), t6) // e ∈ {0, 1}
	} else {
		g.i("VCMPPS $14, %s, %s, %s", c("sqrt2"), t5, t6)
		g.i("VBLENDVPS %s, %s, %s, %s", t6, t1, t5, t5)
		g.i("VANDPS %s, %s, %s", c("one"), t6, t6)
	}
	g.i("VSUBPS %s, %s, %s", c("one"), t5, t5) // f = m − 1 (exact)
	g.i("VMOVUPS %s, %s", c("lp0"), t1)
	for _, k := range []string{"lp1", "lp2", "lp3", "lp4", "lp5", "lp6", "lp7", "lp8"} {
		g.i("VFMADD213PS %s, %s, %s", c(k), t5, t1)
	}
	g.i("VMULPS %s, %s, %s", t5, t5, t2)              // z = f²
	g.i("VMULPS %s, %s, %s", t5, t1, t1)              // P·f
	g.i("VMULPS %s, %s, %s", t2, t1, t1)              // y = P·f·z
	g.i("VFMADD231PS %s, %s, %s", c("ln2Lo"), t6, t1) // y += e·ln2Lo
	g.i("VFMADD231PS %s, %s, %s", c("mhalf"), t2, t1) // y −= z/2
	g.i("VADDPS %s, %s, %s", t5, t1, t1)              // f + y
	g.i("VFMADD231PS %s, %s, %s", c("ln2Hi"), t6, t1) // += e·ln2Hi
	g.i("VADDPS %s, %s, %s", t4, t1, t1)              // + corr
	g.i("VXORPS %s, %s, %s", t2, t2, t2)
	g.i("VMAXPS %s, %s, %s", x, t2, x) // max(x, 0), NaN kept
	g.i("VADDPS %s, %s, %s", t1, x, x)
}

// kernel describes one generated function.
type kernel struct {
	name  string
	ptrs  []string // pointer arguments after dst (each advanced a vector per iteration)
	scal  []string // float32 arguments after nvec
	body  func(g *gen)
	doc   string
	setup func(g *gen)
}

// Registers: V0 the value, V1 a second input, V2..V9 scratch, V10+
// broadcast scalar arguments.
var kernels = []kernel{
	{name: "exp", ptrs: []string{"src"}, doc: "dst = e^src",
		body: func(g *gen) { g.exp(g.v(0), g.v(2), g.v(3), g.v(4)) }},
	{name: "sigmoid", ptrs: []string{"src"}, doc: "dst = 1/(1+e^−src)",
		body: func(g *gen) { g.sigmoid(g.v(0), g.v(2), g.v(3), g.v(4), g.v(5), g.v(6)) }},
	{name: "silu", ptrs: []string{"src"}, doc: "dst = src·sigmoid(src)",
		body: func(g *gen) {
			g.i("VMOVAPS %s, %s", g.v(0), g.v(1))
			g.sigmoid(g.v(0), g.v(2), g.v(3), g.v(4), g.v(5), g.v(6))
			g.i("VMULPS %s, %s, %s", g.v(1), g.v(0), g.v(0))
		}},
	{name: "softplus", ptrs: []string{"src"}, doc: "dst = log(1+e^src)",
		body: func(g *gen) { g.softplus(g.v(0), g.v(2), g.v(3), g.v(4), g.v(5), g.v(6), g.v(7)) }},
	{name: "swiglu", ptrs: []string{"gate", "up"}, scal: []string{"limit"},
		doc: "dst = silu(min(gate, limit)) · clamp(up, −limit, limit) (limit +Inf: no clamp)",
		setup: func(g *gen) {
			g.i("VXORPS %s, %s, %s", g.v(11), g.v(11), g.v(11))
			g.i("VSUBPS %s, %s, %s", g.v(10), g.v(11), g.v(11)) // −limit
		},
		body: func(g *gen) {
			g.i("VMINPS %s, %s, %s", g.v(0), g.v(10), g.v(0))
			g.i("VMINPS %s, %s, %s", g.v(1), g.v(10), g.v(1))
			g.i("VMAXPS %s, %s, %s", g.v(1), g.v(11), g.v(1))
			g.i("VMOVAPS %s, %s", g.v(0), g.v(8))
			g.sigmoid(g.v(0), g.v(2), g.v(3), g.v(4), g.v(5), g.v(6))
			g.i("VMULPS %s, %s, %s", g.v(8), g.v(0), g.v(0))
			g.i("VMULPS %s, %s, %s", g.v(1), g.v(0), g.v(0))
		}},
	{name: "gatesig", ptrs: []string{"z", "bias"}, scal: []string{"rate", "lb"},
		doc: "dst = lb · sigmoid(rate · (z + bias))",
		body: func(g *gen) {
			g.i("VADDPS %s, %s, %s", g.v(1), g.v(0), g.v(0))
			g.i("VMULPS %s, %s, %s", g.v(10), g.v(0), g.v(0))
			g.sigmoid(g.v(0), g.v(2), g.v(3), g.v(4), g.v(5), g.v(6))
			g.i("VMULPS %s, %s, %s", g.v(11), g.v(0), g.v(0))
		}},
	{name: "gatesp", ptrs: []string{"z", "bias"}, scal: []string{"negRate"},
		doc: "dst = negRate · softplus(z + bias)",
		body: func(g *gen) {
			g.i("VADDPS %s, %s, %s", g.v(1), g.v(0), g.v(0))
			g.softplus(g.v(0), g.v(2), g.v(3), g.v(4), g.v(5), g.v(6), g.v(7))
			g.i("VMULPS %s, %s, %s", g.v(10), g.v(0), g.v(0))
		}},
}

var ptrRegs = []string{"SI", "DX"}

func (g *gen) kernel(k kernel) {
	fn := k.name + "_" + g.is.name
	off := 8 * (len(k.ptrs) + 2)
	args := 8*(len(k.ptrs)+2) + 4*len(k.scal)
	g.p("// func %s(%s)", fn, sig(k))
	g.p("TEXT ·%s(SB), NOSPLIT, $0-%d", fn, args)
	g.i("MOVQ dst+0(FP), DI")
	for i, p := range k.ptrs {
		g.i("MOVQ %s+%d(FP), %s", p, 8*(i+1), ptrRegs[i])
	}
	g.i("MOVQ nvec+%d(FP), CX", 8*(len(k.ptrs)+1))
	for i, s := range k.scal {
		g.i("VBROADCASTSS %s+%d(FP), %s", s, off+4*i, g.v(10+i))
	}
	if k.setup != nil {
		k.setup(g)
	}
	g.i("TESTQ CX, CX")
	g.i("JZ done")
	g.p("loop:")
	for i := range k.ptrs {
		g.i("VMOVUPS (%s), %s", ptrRegs[i], g.v(i))
	}
	k.body(g)
	g.i("VMOVUPS %s, (DI)", g.v(0))
	vb := g.is.vw * 4
	g.i("ADDQ $%d, DI", vb)
	for i := range k.ptrs {
		g.i("ADDQ $%d, %s", vb, ptrRegs[i])
	}
	g.i("DECQ CX")
	g.i("JNZ loop")
	g.p("done:")
	g.i("VZEROUPPER")
	g.i("RET")
	g.p("")
}

func sig(k kernel) string {
	s := "dst"
	for _, p := range k.ptrs {
		s += ", " + p
	}
	s += " unsafe.Pointer, nvec uintptr"
	if len(k.scal) > 0 {
		s += ", " + strings.Join(k.scal, ", ") + " float32"
	}
	return s
}

func main() {
	var s gen
	s.p("// Code generated by gen_asm.go; DO NOT EDIT.")
	s.p("")
	s.p("//go:build amd64 && !purego")
	s.p("")
	s.p("#include \"textflag.h\"")
	s.p("")
	for _, k := range consts {
		bits := math.Float32bits(k.v)
		for j := 0; j < 8; j++ {
			s.p("DATA %s<>+%d(SB)/8, $0x%08x%08x", k.name, 8*j, bits, bits)
		}
		s.p("GLOBL %s<>(SB), RODATA|NOPTR, $64", k.name)
		s.p("")
	}
	for _, k := range iconsts {
		for j := 0; j < 8; j++ {
			s.p("DATA %s<>+%d(SB)/8, $0x%08x%08x", k.name, 8*j, k.v, k.v)
		}
		s.p("GLOBL %s<>(SB), RODATA|NOPTR, $64", k.name)
		s.p("")
	}
	var d gen
	d.p("// Code generated by gen_asm.go; DO NOT EDIT.")
	d.p("")
	d.p("//go:build amd64 && !purego")
	d.p("")
	d.p("package act")
	d.p("")
	d.p("import \"unsafe\"")
	for _, is := range []isa{avx512, avx2} {
		s.is = is
		for _, k := range kernels {
			s.kernel(k)
			d.p("")
			d.p("// %s_%s computes, over nvec whole vectors of %d lanes, %s.", k.name, is.name, is.vw, k.doc)
			d.p("//")
			d.p("//go:noescape")
			d.p("func %s_%s(%s)", k.name, is.name, sig(k))
		}
	}
	if err := os.WriteFile("kernels_amd64.s", s.b.Bytes(), 0o644); err != nil {
		panic(err)
	}
	if err := os.WriteFile("kernels_amd64.go", d.b.Bytes(), 0o644); err != nil {
		panic(err)
	}
}
