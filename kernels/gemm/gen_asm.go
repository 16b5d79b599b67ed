//go:build ignore

// gen_asm writes kernels_amd64.s and kernels_amd64.go: the register-blocked
// SIMD microkernels of package gemm. Run it with `go generate` (or
// `go run gen_asm.go`) inside kernels/gemm.
//
// Every microkernel computes an R×C tile of dot products
//
//	dst[i*ldd + j] = Σ_k x_i[k] · w[j*ldw + k]   (i < R, j < C)
//
// in dot-product form: one vector accumulator per output, vectorized over k
// (weights are [N][K] row-major and are read in place), a masked tail for
// K mod VW, then a horizontal reduction. Each accumulator sees the k-chunks
// in the same order and is reduced with the same tree whatever R and C are,
// so an output does not depend on the tile it falls in (nor on T, N or
// Params). bf16 weights are widened exactly in registers (zero-extend to 32
// bits, shift left 16).
//
// The R activation rows are packed vector by vector (x_i[v*VW+l] at
// x[(v*R+i)*VW+l]; for R = 1 that is the plain row), so they are one
// sequential stream whatever K is (rows K·4 bytes apart alias in L1 when K
// is a multiple of 1024).
package main

import (
	"bytes"
	"fmt"
	"os"
	"strings"
)

type isa struct {
	name string // avx512 | avx2
	vw   int    // fp32 lanes per vector
	nreg int    // vector registers
	vr   string // vector register prefix for full width
}

var (
	avx512 = isa{name: "avx512", vw: 16, nreg: 32, vr: "Z"}
	avx2   = isa{name: "avx2", vw: 8, nreg: 16, vr: "Y"}
)

// shapes lists, per ISA, the row-tile heights R with the widest C generated
// for each; every C from 1 to that maximum is generated so that column edges
// need no special casing.
var shapes = map[string][][2]int{
	"avx512": {{1, 8}, {2, 8}, {4, 6}},
	"avx2":   {{1, 8}, {2, 6}, {4, 2}},
}

// Weight row addressing: rows 0-3 are (B0), (B0)(L*1), (B0)(L*2),
// (B0)(L3*1); rows 4-7 the same from B4 = B0+4·L. The bases advance by one
// vector per iteration. Registers: SI walks the packed activations; w uses
// R8, R9, R10, R11; DI walks the prefetched tile; CX counts iterations; AX
// and R12 are scratch; R13 holds the AVX2 mask table.
type rows struct{ b0, b4, l, l3 string }

var wrows = rows{"R8", "R9", "R10", "R11"}

func (r rows) addr(i, disp int) string {
	b := r.b0
	if i >= 4 {
		b, i = r.b4, i-4
	}
	d := ""
	if disp != 0 {
		d = fmt.Sprint(disp)
	}
	switch i {
	case 0:
		return fmt.Sprintf("%s(%s)", d, b)
	case 1:
		return fmt.Sprintf("%s(%s)(%s*1)", d, b, r.l)
	case 2:
		return fmt.Sprintf("%s(%s)(%s*2)", d, b, r.l)
	default:
		return fmt.Sprintf("%s(%s)(%s*1)", d, b, r.l3)
	}
}

// setup loads base pointer and stride of n rows.
func (g *gen) setup(r rows, n int, base, ld string) {
	g.i("MOVQ %s, %s", base, r.b0)
	if n > 1 {
		g.i("MOVQ %s, %s", ld, r.l)
	}
	if n > 3 {
		g.i("LEAQ (%s)(%s*2), %s", r.l, r.l, r.l3)
	}
	if n > 4 {
		g.i("LEAQ (%s)(%s*4), %s", r.b0, r.l, r.b4)
	}
}

type gen struct {
	b bytes.Buffer
}

func (g *gen) p(format string, args ...any) {
	fmt.Fprintf(&g.b, format, args...)
	g.b.WriteByte('\n')
}

func (g *gen) i(format string, args ...any) {
	g.b.WriteByte('\t')
	g.p(format, args...)
}

func kname(is isa, dt string, r, c int) string {
	return fmt.Sprintf("%s_%s_r%dc%d", dt, is.name, r, c)
}

const sig = "(x, w, dst unsafe.Pointer, ldw, ldd, nvec, tail, flags uintptr)"

// kernel emits one R×C microkernel. dt is "f32" or "bf16" (weights only;
// x is always fp32).
func (g *gen) kernel(is isa, dt string, R, C int) {
	name := kname(is, dt, R, C)
	V := is.vr
	wsz := 4
	if dt == "bf16" {
		wsz = 2
	}
	vb := is.vw * 4 // bytes of one fp32 vector
	wstep := is.vw * wsz
	xres := R <= C // x rows resident in registers, w streamed
	acc := func(i, j int) string { return fmt.Sprintf("%s%d", V, i*C+j) }
	nacc := R * C
	xn, wn, next := residentRegs(R, C, xres)
	vreg := func(ns []int) (r []string) {
		for _, n := range ns {
			r = append(r, fmt.Sprintf("%s%d", V, n))
		}
		return r
	}
	xr, wr := vreg(xn), vreg(wn)
	tmp := fmt.Sprintf("%s%d", V, next)
	next++
	mask := fmt.Sprintf("%s%d", V, next) // AVX2 tail mask
	if is.name == "avx2" {
		next++
	}
	if next > is.nreg {
		panic(fmt.Sprintf("%s: needs %d vector registers", name, next))
	}
	xm := func(i int) string { return fmt.Sprintf("%d(SI)", i*vb) }
	wm := func(j int) string { return wrows.addr(j, 0) }

	g.p("")
	g.p("// func %s%s", name, sig)
	g.p("TEXT ·%s(SB), NOSPLIT, $0-64", name)
	g.i("MOVQ x+0(FP), SI")
	g.setup(wrows, C, "w+8(FP)", "ldw+24(FP)")
	for k := 0; k < nacc; k++ {
		r := fmt.Sprintf("%s%d", V, k)
		if is.name == "avx512" {
			g.i("VPXORD %s, %s, %s", r, r, r)
		} else {
			g.i("VXORPS %s, %s, %s", r, r, r)
		}
	}
	g.i("MOVQ nvec+40(FP), CX")
	g.i("TESTQ CX, CX")
	g.i("JZ tail")
	g.i("MOVQ flags+56(FP), AX")
	g.i("TESTQ $1, AX")
	g.i("JNZ pstart")
	g.p("loop:")

	// loadW converts/loads weight row j (at memory operand m) into register r.
	loadW := func(j int, r string, masked bool) {
		m := wm(j)
		switch {
		case dt == "f32" && masked && is.name == "avx512":
			g.i("VMOVUPS.Z %s, K1, %s", m, r)
		case dt == "f32" && masked:
			g.i("VMASKMOVPS %s, %s, %s", m, mask, r)
		case dt == "f32":
			g.i("VMOVUPS %s, %s", m, r)
		case masked && is.name == "avx512":
			g.i("VPMOVZXWD.Z %s, K1, %s", m, r)
			g.i("VPSLLD $16, %s, %s", r, r)
		case masked: // AVX2 bf16 tail: insert the remaining words one by one
			x := "X" + strings.TrimPrefix(r, "Y")
			g.i("VPXOR %s, %s, %s", x, x, x)
			lbl := fmt.Sprintf("ins%d", j)
			for e := 0; e < is.vw-1; e++ {
				g.i("CMPQ AX, $%d", e+1)
				g.i("JLT %s", lbl)
				g.i("VPINSRW $%d, %s, %s, %s", e, wrows.addr(j, 2*e), x, x)
			}
			g.p("%s:", lbl)
			g.i("VPMOVZXWD %s, %s", x, r)
			g.i("VPSLLD $16, %s, %s", r, r)
		default:
			g.i("VPMOVZXWD %s, %s", m, r)
			g.i("VPSLLD $16, %s, %s", r, r)
		}
	}
	loadX := func(i int, r string, masked bool) {
		m := xm(i)
		switch {
		case masked && is.name == "avx512":
			g.i("VMOVUPS.Z %s, K1, %s", m, r)
		case masked:
			g.i("VMASKMOVPS %s, %s, %s", m, mask, r)
		default:
			g.i("VMOVUPS %s, %s", m, r)
		}
	}
	body := func(masked bool) {
		if xres {
			for i := 0; i < R; i++ {
				loadX(i, xr[i], masked)
			}
			for j := 0; j < C; j++ {
				if R == 1 && dt == "f32" && !masked {
					g.i("VFMADD231PS %s, %s, %s", wm(j), xr[0], acc(0, j))
					continue
				}
				loadW(j, tmp, masked)
				for i := 0; i < R; i++ {
					g.i("VFMADD231PS %s, %s, %s", tmp, xr[i], acc(i, j))
				}
			}
		} else {
			for j := 0; j < C; j++ {
				loadW(j, wr[j], masked)
			}
			for i := 0; i < R; i++ {
				if C == 1 && !masked {
					g.i("VFMADD231PS %s, %s, %s", xm(i), wr[0], acc(i, 0))
					continue
				}
				loadX(i, tmp, masked)
				for j := 0; j < C; j++ {
					g.i("VFMADD231PS %s, %s, %s", tmp, wr[j], acc(i, j))
				}
			}
		}
	}
	bump := func() {
		g.i("ADDQ $%d, SI", R*vb)
		g.i("ADDQ $%d, %s", wstep, wrows.b0)
		if C > 4 {
			g.i("ADDQ $%d, %s", wstep, wrows.b4)
		}
	}
	mask512 := func() { g.i("KMOVW AX, K1") }
	if is.name != "avx512" {
		mask512 = func() {
			// mask = first AX lanes set: 8 dwords at maskTab+32-4·AX.
			g.i("LEAQ maskTab<>+32(SB), R13")
			g.i("NEGQ AX")
			g.i("VMOVDQU (R13)(AX*4), %s", mask)
			g.i("NEGQ AX")
		}
	}
	g.loops(is, R, C, body, bump, C*wstep, mask512, acc, nacc)
}

// f8Shapes are the FP8 kernels' row-tile heights with their widest C:
// those of the fp32 kernels and 8×3, so that 8 rows (a decode batch) take
// one strip and dequantize each weight vector once.
var f8Shapes = [][2]int{{1, 8}, {2, 8}, {4, 6}, {8, 3}}

const sigF8 = "(x, w, dst, sc, tsc unsafe.Pointer, ldw, ldd, nvec, tail, vpb, flags uintptr)"

// kernelF8 emits one R×C AVX-512 microkernel on FP8 e4m3 weights (one byte
// per value, rows ldw bytes apart) whose C rows share one row of block
// scales: the K vectors go in blocks of vpb (BlockCols/16), block b scaled
// by sc[b] (tsc is the scale of the masked tail vector). It is the fp32
// kernel with each weight vector dequantized in registers: the codes are
// sign-extended to 16 bits and shifted so that exponent and mantissa land
// in an fp16's (sign kept in bit 15), VCVTPH2PS widens them exactly (fp16
// subnormals included: e4m3 subnormals map to them) to the code's value
// times 2^−8, and one multiplication by scale·2^8 (exact: a power of two)
// rounds the same real product as code value × scale. The accumulation and
// reduction are the fp32 kernel's, so results equal it on the dequantized
// weights bit for bit. NaN codes (0x7f, 0xff) come out finite: callers
// keep weights with NaN codes off these kernels.
func (g *gen) kernelF8(R, C int) {
	is := avx512
	name := kname(is, "f8", R, C)
	const vb = 64
	const wstep = 16
	xres := R <= C
	z := func(n int) string { return fmt.Sprintf("Z%d", n) }
	y := func(n int) string { return fmt.Sprintf("Y%d", n) }
	acc := func(i, j int) string { return z(i*C + j) }
	nacc := R * C
	xr, wr, next := residentRegs(R, C, xres)
	tmp, sreg, mreg := next, next+1, next+2
	next += 3
	if next > is.nreg {
		panic(fmt.Sprintf("%s: needs %d vector registers", name, next))
	}
	xm := func(i int) string { return fmt.Sprintf("%d(SI)", i*vb) }
	wm := func(j int) string { return wrows.addr(j, 0) }

	g.p("")
	g.p("// func %s%s", name, sigF8)
	g.p("TEXT ·%s(SB), NOSPLIT, $0-88", name)
	g.i("MOVQ x+0(FP), SI")
	g.setup(wrows, C, "w+8(FP)", "ldw+40(FP)")
	for k := 0; k < nacc; k++ {
		g.i("VPXORD Z%d, Z%d, Z%d", k, k, k)
	}
	g.i("MOVL $0xbf80, AX")
	g.i("VPBROADCASTW AX, %s", y(mreg))
	g.i("MOVQ sc+24(FP), DX")
	g.i("MOVQ nvec+56(FP), CX")
	g.i("MOVQ vpb+72(FP), BX")
	loadS := func(m string) {
		g.i("VMOVSS %s, X%d", m, sreg)
		g.i("VMULSS f8scale<>(SB), X%d, X%d", sreg, sreg)
		g.i("VBROADCASTSS X%d, %s", sreg, z(sreg))
	}
	loadW := func(j, r int, masked bool) {
		if masked {
			g.i("VPMOVSXBW.Z %s, K1, %s", wm(j), y(r))
		} else {
			g.i("VPMOVSXBW %s, %s", wm(j), y(r))
		}
		g.i("VPSLLW $7, %s, %s", y(r), y(r))
		g.i("VPANDD %s, %s, %s", y(mreg), y(r), y(r))
		g.i("VCVTPH2PS %s, %s", y(r), z(r))
		g.i("VMULPS %s, %s, %s", z(sreg), z(r), z(r))
	}
	loadX := func(i, r int, masked bool) {
		if masked {
			g.i("VMOVUPS.Z %s, K1, %s", xm(i), z(r))
		} else {
			g.i("VMOVUPS %s, %s", xm(i), z(r))
		}
	}
	body := func(masked bool) {
		if xres {
			for i := 0; i < R; i++ {
				loadX(i, xr[i], masked)
			}
			for j := 0; j < C; j++ {
				loadW(j, tmp, masked)
				for i := 0; i < R; i++ {
					g.i("VFMADD231PS %s, %s, %s", z(tmp), z(xr[i]), acc(i, j))
				}
			}
		} else {
			for j := 0; j < C; j++ {
				loadW(j, wr[j], masked)
			}
			for i := 0; i < R; i++ {
				loadX(i, tmp, masked)
				for j := 0; j < C; j++ {
					g.i("VFMADD231PS %s, %s, %s", z(tmp), z(wr[j]), acc(i, j))
				}
			}
		}
	}
	bump := func() {
		g.i("ADDQ $%d, SI", R*vb)
		g.i("ADDQ $%d, %s", wstep, wrows.b0)
		if C > 4 {
			g.i("ADDQ $%d, %s", wstep, wrows.b4)
		}
	}
	// blocks emits the block loop (label prefix p); pf adds the prefetch of
	// the next tile (the next C rows: C·16 contiguous bytes per step).
	blocks := func(p string, pf bool) {
		g.p("%sblock:", p)
		g.i("TESTQ CX, CX")
		g.i("JZ tail")
		loadS("(DX)")
		g.i("ADDQ $4, DX")
		g.i("MOVQ BX, R13")
		g.i("CMPQ CX, BX")
		g.i("CMOVQLT CX, R13")
		g.i("SUBQ R13, CX")
		g.p("%sloop:", p)
		body(false)
		if pf {
			for m := 0; m < (C*wstep+63)/64; m++ {
				g.i("PREFETCHT1 %d(DI)", 64*m)
			}
			g.i("ADDQ $%d, DI", C*wstep)
		}
		bump()
		g.i("DECQ R13")
		g.i("JNZ %sloop", p)
		g.i("JMP %sblock", p)
	}
	g.i("MOVQ flags+80(FP), AX")
	g.i("TESTQ $1, AX")
	g.i("JNZ pstart")
	blocks("", false)
	g.p("pstart:")
	g.i("MOVQ ldw+40(FP), DI")
	g.i("IMULQ $%d, DI", C)
	g.i("ADDQ %s, DI", wrows.b0)
	blocks("p", true)
	g.p("tail:")
	g.i("MOVQ tail+64(FP), AX")
	g.i("TESTQ AX, AX")
	g.i("JZ done")
	g.i("MOVQ tsc+32(FP), DX")
	loadS("(DX)")
	g.i("KMOVW AX, K1")
	body(true)
	g.p("done:")
	g.i("MOVQ dst+16(FP), AX")
	g.i("MOVQ ldd+48(FP), R12")
	g.reduce(is, R, C, acc, nacc)
	g.i("VZEROUPPER")
	g.i("RET")
}

// vdpbf16ps encodes VDPBF16PS zmm(src3), zmm(src2), zmm(dst) (Go operand
// order: dst += pairwise bf16 products of src2 and src3) as bytes: the Go
// assembler does not know the instruction. EVEX.512.F3.0F38.W0 52 /r with
// register operands: P0 = R̄ X̄ B̄ R̄' 0 0 1 0, P1 = 0 v̄v̄v̄v̄ 1 1 0,
// P2 = 0 1 0 0 V̄' 0 0 0, ModRM = 11 reg rm.
func vdpbf16ps(src3, src2, dst int) string {
	bit := func(v, b int) int { return (v >> b) & 1 }
	p0 := (1-bit(dst, 3))<<7 | (1-bit(src3, 4))<<6 | (1-bit(src3, 3))<<5 | (1-bit(dst, 4))<<4 | 0x2
	p1 := (^src2&15)<<3 | 0x6
	p2 := 0x40 | (1-bit(src2, 4))<<3
	modrm := 0xc0 | (dst&7)<<3 | src3&7
	return fmt.Sprintf("BYTE $0x62; BYTE $0x%02x; BYTE $0x%02x; BYTE $0x%02x; BYTE $0x52; BYTE $0x%02x // VDPBF16PS Z%d, Z%d, Z%d",
		p0, p1, p2, modrm, src3, src2, dst)
}

// residentRegs numbers the vector registers an R×C microkernel keeps
// after its R·C accumulators: one per x row when x rows stay resident
// (xres), else one per streamed w column; next is the first free one.
func residentRegs(R, C int, xres bool) (xr, wr []int, next int) {
	next = R * C
	n := C
	if xres {
		n = R
	}
	for k := 0; k < n; k++ {
		if xres {
			xr = append(xr, next)
		} else {
			wr = append(wr, next)
		}
		next++
	}
	return xr, wr, next
}

// kernelBB emits one R×C AVX-512 BF16 microkernel: bf16 activations × bf16
// weights with VDPBF16PS (each fp32 lane accumulates the products of a pair
// of bf16 elements, so a vector covers 32 k). The activations are packed
// bf16 vector by vector like the fp32 kernels' (x_i[v*32+l] at
// x[(v*R+i)*32+l], zero past K, so they need no tail mask); the weights are
// read in place, the K mod 32 tail with a 32-bit word mask (tail).
func (g *gen) kernelBB(R, C int) {
	is := avx512
	name := kname(is, "bb", R, C)
	const vb = 64 // bytes of one vector (32 bf16)
	xres := R <= C
	acc := func(i, j int) string { return fmt.Sprintf("Z%d", i*C+j) }
	accN := func(i, j int) int { return i*C + j }
	nacc := R * C
	xr, wr, next := residentRegs(R, C, xres)
	tmp := next
	next++
	if next > is.nreg {
		panic(fmt.Sprintf("%s: needs %d vector registers", name, next))
	}
	z := func(n int) string { return fmt.Sprintf("Z%d", n) }
	xm := func(i int) string { return fmt.Sprintf("%d(SI)", i*vb) }
	wm := func(j int) string { return wrows.addr(j, 0) }

	g.p("")
	g.p("// func %s%s", name, sig)
	g.p("TEXT ·%s(SB), NOSPLIT, $0-64", name)
	g.i("MOVQ x+0(FP), SI")
	g.setup(wrows, C, "w+8(FP)", "ldw+24(FP)")
	for k := 0; k < nacc; k++ {
		g.i("VPXORD Z%d, Z%d, Z%d", k, k, k)
	}
	g.i("MOVQ nvec+40(FP), CX")
	g.i("TESTQ CX, CX")
	g.i("JZ tail")
	g.i("MOVQ flags+56(FP), AX")
	g.i("TESTQ $1, AX")
	g.i("JNZ pstart")
	g.p("loop:")
	loadW := func(j, r int, masked bool) {
		if masked {
			g.i("VMOVDQU16.Z %s, K1, %s", wm(j), z(r))
		} else {
			g.i("VMOVDQU32 %s, %s", wm(j), z(r))
		}
	}
	body := func(masked bool) {
		if xres {
			for i := 0; i < R; i++ {
				g.i("VMOVDQU32 %s, %s", xm(i), z(xr[i]))
			}
			for j := 0; j < C; j++ {
				loadW(j, tmp, masked)
				for i := 0; i < R; i++ {
					g.i(vdpbf16ps(tmp, xr[i], accN(i, j)))
				}
			}
		} else {
			for j := 0; j < C; j++ {
				loadW(j, wr[j], masked)
			}
			for i := 0; i < R; i++ {
				g.i("VMOVDQU32 %s, %s", xm(i), z(tmp))
				for j := 0; j < C; j++ {
					g.i(vdpbf16ps(wr[j], tmp, accN(i, j)))
				}
			}
		}
	}
	bump := func() {
		g.i("ADDQ $%d, SI", R*vb)
		g.i("ADDQ $%d, %s", vb, wrows.b0)
		if C > 4 {
			g.i("ADDQ $%d, %s", vb, wrows.b4)
		}
	}
	g.loops(is, R, C, body, bump, C*vb, func() { g.i("KMOVD AX, K1") }, acc, nacc)
}

// loops emits what follows a kernel's "loop:" label once its k-step is
// defined: the loop's end; its copy that also prefetches the next tile (the
// next C weight rows, step contiguous bytes) into L2, sweeping it linearly
// at the pace the current tile is consumed (every strip of a tile
// prefetches: measured better than only the first); the masked tail
// (setMask turns the tail count in AX into the mask); and the reduction.
// body(masked) is one k-step, bump advances the pointers after it.
func (g *gen) loops(is isa, R, C int, body func(masked bool), bump func(), step int, setMask func(), acc func(i, j int) string, nacc int) {
	body(false)
	bump()
	g.i("DECQ CX")
	g.i("JNZ loop")
	g.i("JMP tail")
	g.p("pstart:")
	g.i("MOVQ ldw+24(FP), DI")
	g.i("IMULQ $%d, DI", C)
	g.i("ADDQ %s, DI", wrows.b0)
	g.p("ploop:")
	body(false)
	for m := 0; m < (step+63)/64; m++ {
		g.i("PREFETCHT1 %d(DI)", 64*m)
	}
	bump()
	g.i("ADDQ $%d, DI", step)
	g.i("DECQ CX")
	g.i("JNZ ploop")
	g.p("tail:")
	g.i("MOVQ tail+48(FP), AX")
	g.i("TESTQ AX, AX")
	g.i("JZ done")
	setMask()
	body(true)
	g.p("done:")
	g.i("MOVQ dst+16(FP), AX")
	g.i("MOVQ ldd+32(FP), R12")
	g.reduce(is, R, C, acc, nacc)
	g.i("VZEROUPPER")
	g.i("RET")
}

// reduce sums each accumulator horizontally and stores row i's C results at
// AX + i*R12. Free vector registers start at index free.
func (g *gen) reduce(is isa, R, C int, acc func(i, j int) string, free int) {
	V := is.vr
	t1 := fmt.Sprintf("%s%d", V, free)
	t2 := fmt.Sprintf("%s%d", V, free+1)
	idx := fmt.Sprintf("%s%d", V, free+2)
	if is.name == "avx512" {
		if free+3 > is.nreg {
			panic("reduce: out of registers")
		}
		g.i("VPMOVZXBD permIdx<>(SB), %s", idx)
	} else if free+2 > is.nreg {
		panic("reduce: out of registers")
	}
	x := func(r string) string { return "X" + r[1:] }
	y := func(r string) string { return "Y" + r[1:] }
	for i := 0; i < R; i++ {
		for g0 := 0; g0 < C; g0 += 4 {
			n := min(4, C-g0)
			a := acc(i, g0)
			var b, c, d string
			if n > 1 {
				b = acc(i, g0+1)
			}
			if n > 2 {
				c = acc(i, g0+2)
			}
			if n > 3 {
				d = acc(i, g0+3)
			}
			var res string
			if is.name == "avx512" {
				// pairs (a,b) and (c,d): 512→256 folds side by side.
				pair := func(p, q string) {
					g.i("VSHUFF64X2 $0x44, %s, %s, %s", q, p, t1)
					g.i("VSHUFF64X2 $0xEE, %s, %s, %s", q, p, t2)
					g.i("VADDPS %s, %s, %s", t2, t1, p)
				}
				if b == "" {
					b = a
				}
				pair(a, b)
				cd := a
				if c != "" {
					if d == "" {
						d = c
					}
					pair(c, d)
					cd = c
				}
				// [a8.lo b8.lo c8.lo d8.lo] + [a8.hi b8.hi c8.hi d8.hi]
				g.i("VSHUFF32X4 $0x88, %s, %s, %s", cd, a, t1)
				g.i("VSHUFF32X4 $0xDD, %s, %s, %s", cd, a, t2)
				g.i("VADDPS %s, %s, %s", t2, t1, a)
				// within each 128-bit lane: (e0+e1)+(e2+e3)
				g.i("VSHUFPS $0xB1, %s, %s, %s", a, a, t1)
				g.i("VADDPS %s, %s, %s", t1, a, a)
				g.i("VSHUFPS $0x4E, %s, %s, %s", a, a, t1)
				g.i("VADDPS %s, %s, %s", t1, a, a)
				g.i("VPERMPS %s, %s, %s", a, idx, t1)
				res = x(t1)
			} else {
				// pairs (a,c) and (b,d): 256→128 folds side by side.
				pair := func(p, q string) {
					g.i("VPERM2F128 $0x20, %s, %s, %s", q, p, t1)
					g.i("VPERM2F128 $0x31, %s, %s, %s", q, p, t2)
					g.i("VADDPS %s, %s, %s", t2, t1, p)
				}
				if c == "" {
					c = a
				}
				pair(a, c)
				bd := a
				if b != "" {
					if d == "" {
						d = b
					}
					pair(b, d)
					bd = b
				}
				g.i("VHADDPS %s, %s, %s", y(bd), y(a), y(a))
				g.i("VEXTRACTF128 $1, %s, %s", y(a), x(t1))
				g.i("VHADDPS %s, %s, %s", x(t1), x(a), x(a))
				res = x(a)
			}
			off := 4 * g0
			switch n {
			case 4:
				g.i("VMOVUPS %s, %d(AX)", res, off)
			case 3:
				g.i("VMOVSD %s, %d(AX)", res, off)
				g.i("VEXTRACTPS $2, %s, %d(AX)", res, off+8)
			case 2:
				g.i("VMOVSD %s, %d(AX)", res, off)
			case 1:
				g.i("VMOVSS %s, %d(AX)", res, off)
			}
		}
		if i < R-1 {
			g.i("ADDQ R12, AX")
		}
	}
}

// axpy emits y += a·x over n elements (len(x) ≥ n).
func (g *gen) axpy(is isa) {
	V := is.vr
	name := "axpy_" + is.name
	vb := is.vw * 4
	g.p("")
	g.p("// func %s(y, x unsafe.Pointer, n uintptr, a float32)", name)
	g.p("TEXT ·%s(SB), NOSPLIT, $0-28", name)
	g.i("MOVQ y+0(FP), DI")
	g.i("MOVQ x+8(FP), SI")
	g.i("MOVQ n+16(FP), CX")
	g.i("VBROADCASTSS a+24(FP), %s0", V)
	g.i("XORQ AX, AX")
	g.i("MOVQ CX, DX")
	g.i("ANDQ $-%d, DX", 4*is.vw)
	g.i("SHLQ $2, DX")
	g.i("JZ one")
	g.p("four:")
	for u := 0; u < 4; u++ {
		g.i("VMOVUPS %d(DI)(AX*1), %s%d", u*vb, V, u+1)
	}
	for u := 0; u < 4; u++ {
		g.i("VFMADD231PS %d(SI)(AX*1), %s0, %s%d", u*vb, V, V, u+1)
	}
	for u := 0; u < 4; u++ {
		g.i("VMOVUPS %s%d, %d(DI)(AX*1)", V, u+1, u*vb)
	}
	g.i("ADDQ $%d, AX", 4*vb)
	g.i("CMPQ AX, DX")
	g.i("JNE four")
	g.p("one:")
	g.i("MOVQ CX, DX")
	g.i("ANDQ $-%d, DX", is.vw)
	g.i("SHLQ $2, DX")
	g.i("CMPQ AX, DX")
	g.i("JEQ tail")
	g.p("oneloop:")
	g.i("VMOVUPS (DI)(AX*1), %s1", V)
	g.i("VFMADD231PS (SI)(AX*1), %s0, %s1", V, V)
	g.i("VMOVUPS %s1, (DI)(AX*1)", V)
	g.i("ADDQ $%d, AX", vb)
	g.i("CMPQ AX, DX")
	g.i("JNE oneloop")
	g.p("tail:")
	g.i("ANDQ $%d, CX", is.vw-1)
	g.i("JZ done")
	if is.name == "avx512" {
		g.i("MOVL $1, DX")
		g.i("SHLL CX, DX")
		g.i("DECL DX")
		g.i("KMOVW DX, K1")
		g.i("VMOVUPS.Z (DI)(AX*1), K1, Z1")
		g.i("VMOVUPS.Z (SI)(AX*1), K1, Z2")
		g.i("VFMADD231PS Z2, Z0, Z1")
		g.i("VMOVUPS Z1, K1, (DI)(AX*1)")
	} else {
		g.i("LEAQ maskTab<>+32(SB), DX")
		g.i("NEGQ CX")
		g.i("VMOVDQU (DX)(CX*4), Y3")
		g.i("VMASKMOVPS (DI)(AX*1), Y3, Y1")
		g.i("VMASKMOVPS (SI)(AX*1), Y3, Y2")
		g.i("VFMADD231PS Y2, Y0, Y1")
		g.i("VMASKMOVPS Y1, Y3, (DI)(AX*1)")
	}
	g.p("done:")
	g.i("VZEROUPPER")
	g.i("RET")
}

// pack emits the activation packer: for v < nv, i < r: copy vector v of
// row i (x + i·ldx + v·VW) to dst, consecutively.
func (g *gen) pack(is isa) {
	V := is.vr
	vb := is.vw * 4
	g.p("")
	g.p("// func pack_%s(dst, x unsafe.Pointer, ldx, nv, r uintptr)", is.name)
	g.p("TEXT ·pack_%s(SB), NOSPLIT, $0-40", is.name)
	g.i("MOVQ dst+0(FP), DI")
	g.i("MOVQ x+8(FP), SI")
	g.i("MOVQ ldx+16(FP), DX")
	g.i("MOVQ nv+24(FP), CX")
	g.i("MOVQ r+32(FP), BX")
	g.i("TESTQ CX, CX")
	g.i("JZ done")
	g.p("vloop:")
	g.i("MOVQ SI, AX")
	g.i("MOVQ BX, R8")
	g.p("rloop:")
	g.i("VMOVUPS (AX), %s0", V)
	g.i("VMOVUPS %s0, (DI)", V)
	g.i("ADDQ $%d, DI", vb)
	g.i("ADDQ DX, AX")
	g.i("DECQ R8")
	g.i("JNZ rloop")
	g.i("ADDQ $%d, SI", vb)
	g.i("DECQ CX")
	g.i("JNZ vloop")
	g.p("done:")
	g.i("VZEROUPPER")
	g.i("RET")
}

func main() {
	var s, d gen
	s.p("// Code generated by gen_asm.go; DO NOT EDIT.")
	s.p("")
	s.p("//go:build amd64 && !purego")
	s.p("")
	s.p("#include \"textflag.h\"")
	s.p("")
	s.p("// permIdx picks lane 0 of each 128-bit lane (VPMOVZXBD-expanded).")
	s.p("DATA permIdx<>+0(SB)/8, $0x0c080400")
	s.p("DATA permIdx<>+8(SB)/8, $0")
	s.p("GLOBL permIdx<>(SB), RODATA|NOPTR, $16")
	s.p("")
	s.p("// maskTab: 8 all-ones dwords then 8 zero dwords (AVX2 tail masks).")
	for k := 0; k < 4; k++ {
		s.p("DATA maskTab<>+%d(SB)/8, $-1", 8*k)
	}
	for k := 4; k < 8; k++ {
		s.p("DATA maskTab<>+%d(SB)/8, $0", 8*k)
	}
	s.p("GLOBL maskTab<>(SB), RODATA|NOPTR, $64")
	s.p("")
	s.p("// f8scale is 2^8 (float32): FP8 kernels widen codes to value·2^−8.")
	s.p("DATA f8scale<>+0(SB)/4, $0x43800000")
	s.p("GLOBL f8scale<>(SB), RODATA|NOPTR, $4")

	d.p("// Code generated by gen_asm.go; DO NOT EDIT.")
	d.p("")
	d.p("//go:build amd64 && !purego")
	d.p("")
	d.p("package gemm")
	d.p("")
	d.p("import \"unsafe\"")
	for _, is := range []isa{avx2, avx512} {
		for _, dt := range []string{"f32", "bf16"} {
			d.p("")
			d.p("var %s_%s = kernelSet{", dt, is.name)
			for _, rc := range shapes[is.name] {
				r := rc[0]
				d.p("\t%d: {", r)
				for c := 1; c <= rc[1]; c++ {
					d.p("\t\t%d: %s,", c, kname(is, dt, r, c))
				}
				d.p("\t},")
			}
			d.p("}")
			for _, rc := range shapes[is.name] {
				for c := 1; c <= rc[1]; c++ {
					s.kernel(is, dt, rc[0], c)
					d.p("")
					d.p("//go:noescape")
					d.p("func %s%s", kname(is, dt, rc[0], c), sig)
				}
			}
		}
		if is.name == "avx512" {
			d.p("")
			d.p("// bb_avx512 are the AVX-512 BF16 kernels (bf16 activations × bf16")
			d.p("// weights, VDPBF16PS).")
			d.p("var bb_avx512 = kernelSet{")
			for _, rc := range shapes[is.name] {
				d.p("\t%d: {", rc[0])
				for c := 1; c <= rc[1]; c++ {
					d.p("\t\t%d: %s,", c, kname(is, "bb", rc[0], c))
				}
				d.p("\t},")
			}
			d.p("}")
			for _, rc := range shapes[is.name] {
				for c := 1; c <= rc[1]; c++ {
					s.kernelBB(rc[0], c)
					d.p("")
					d.p("//go:noescape")
					d.p("func %s%s", kname(is, "bb", rc[0], c), sig)
				}
			}
			d.p("")
			d.p("// f8_avx512 are the FP8 e4m3 weight kernels (see kernelF8 in")
			d.p("// gen_asm.go).")
			d.p("var f8_avx512 = f8KernelSet{")
			for _, rc := range f8Shapes {
				d.p("\t%d: {", rc[0])
				for c := 1; c <= rc[1]; c++ {
					d.p("\t\t%d: %s,", c, kname(is, "f8", rc[0], c))
				}
				d.p("\t},")
			}
			d.p("}")
			for _, rc := range f8Shapes {
				for c := 1; c <= rc[1]; c++ {
					s.kernelF8(rc[0], c)
					d.p("")
					d.p("//go:noescape")
					d.p("func %s%s", kname(is, "f8", rc[0], c), sigF8)
				}
			}
		}
		s.axpy(is)
		s.pack(is)
		d.p("")
		d.p("//go:noescape")
		d.p("func pack_%s(dst, x unsafe.Pointer, ldx, nv, r uintptr)", is.name)
		d.p("")
		d.p("//go:noescape")
		d.p("func axpy_%s(y, x unsafe.Pointer, n uintptr, a float32)", is.name)
	}
	if err := os.WriteFile("kernels_amd64.s", s.b.Bytes(), 0o644); err != nil {
		panic(err)
	}
	if err := os.WriteFile("kernels_amd64.go", d.b.Bytes(), 0o644); err != nil {
		panic(err)
	}
}
