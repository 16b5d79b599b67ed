//go:build amd64 && !purego

#include "textflag.h"

// func dequantFP8AVX512(dst *float32, src *byte, n uintptr, s float32)
//
// dst[i] = e4m3(src[i]) · s for i < n (n a multiple of 16), without
// arithmetic on subnormal floats (which would take microcode assists): a
// normal code's exponent and mantissa bits go to float32 bits 20…26 and
// its exponent is rebased by adding 120 to the exponent field (exact); a
// subnormal code (exponent 0) is its mantissa converted to float32 times
// 2^−9 (exact); the sign is ORed in, then one multiplication by s gives
// the product Go computes. Codes 0x7f and 0xff (NaN) become NaN.
TEXT ·dequantFP8AVX512(SB), NOSPLIT, $0-28
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $4, CX
	JZ   done
	VBROADCASTSS s+24(FP), Z31
	MOVL $0x80000000, AX
	VPBROADCASTD AX, Z29
	MOVL $0x7f, AX
	VPBROADCASTD AX, Z28
	MOVL $0x7fc00000, AX
	VPBROADCASTD AX, Z26
	MOVL $8, AX
	VPBROADCASTD AX, Z24
	MOVL $0x3c000000, AX // 120 << 23
	VPBROADCASTD AX, Z23
	MOVL $0x3b000000, AX // 2^-9
	VPBROADCASTD AX, Z22

loop:
	VPMOVZXBD (SI), Z0
	VPANDD    Z28, Z0, Z2
	VPCMPEQD  Z28, Z2, K1
	VPCMPUD   $1, Z24, Z2, K2
	VPSLLD    $20, Z2, Z3
	VPADDD    Z23, Z3, Z3
	VCVTDQ2PS Z2, Z4
	VMULPS    Z22, Z4, Z4
	VMOVAPS   Z4, K2, Z3
	VPSLLD    $24, Z0, Z1
	VPANDD    Z29, Z1, Z1
	VPORD     Z1, Z3, Z3
	VMULPS    Z31, Z3, Z3
	VMOVDQU32 Z26, K1, Z3
	VMOVUPS   Z3, (DI)
	ADDQ      $16, SI
	ADDQ      $64, DI
	DECQ      CX
	JNZ       loop

done:
	VZEROUPPER
	RET

// func dequantFP8FastAVX512(dst *float32, src *byte, n uintptr, s float32)
//
// dst[i] = e4m3(src[i]) · s for i < n (n a multiple of 16) for codes that
// are not NaN and s·2^8 finite where s is: each code is sign-extended to 16
// bits and shifted so that its exponent and mantissa fill an fp16's (the
// sign kept in bit 15, bit 14 cleared); VCVTPH2PS widens that exactly to
// the code's value × 2^−8 (e4m3 subnormals are fp16 subnormals, converted
// without assists), and one multiplication by s·2^8 (exact) rounds the same
// real product as value × s.
TEXT ·dequantFP8FastAVX512(SB), NOSPLIT, $0-28
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $4, CX
	JZ   fdone
	VMOVSS s+24(FP), X31
	MOVL $0x43800000, AX // 2^8
	VMOVD AX, X30
	VMULSS X30, X31, X31
	VBROADCASTSS X31, Z31
	MOVL $0xbf80, AX
	VPBROADCASTW AX, Y30
	SHRQ $1, CX
	JZ   fone

fpair:
	VPMOVSXBW (SI), Y0
	VPMOVSXBW 16(SI), Y1
	VPSLLW    $7, Y0, Y0
	VPSLLW    $7, Y1, Y1
	VPANDD    Y30, Y0, Y0
	VPANDD    Y30, Y1, Y1
	VCVTPH2PS Y0, Z0
	VCVTPH2PS Y1, Z1
	VMULPS    Z31, Z0, Z0
	VMULPS    Z31, Z1, Z1
	VMOVUPS   Z0, (DI)
	VMOVUPS   Z1, 64(DI)
	ADDQ      $32, SI
	ADDQ      $128, DI
	DECQ      CX
	JNZ       fpair

fone:
	MOVQ n+16(FP), CX
	TESTQ $16, CX
	JZ   fdone
	VPMOVSXBW (SI), Y0
	VPSLLW    $7, Y0, Y0
	VPANDD    Y30, Y0, Y0
	VCVTPH2PS Y0, Z0
	VMULPS    Z31, Z0, Z0
	VMOVUPS   Z0, (DI)

fdone:
	VZEROUPPER
	RET

// func dequantFP8RowAVX512(dst *float32, src *byte, sc *float32, nvec, vpb uintptr)
//
// dequantFP8FastAVX512 over nvec vectors of 16 codes whose scales change
// every vpb vectors: vector v is scaled by sc[v/vpb] (a row of an FP8
// weight whose BlockCols is 16·vpb), in one call.
TEXT ·dequantFP8RowAVX512(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ sc+16(FP), DX
	MOVQ nvec+24(FP), CX
	MOVQ vpb+32(FP), BX
	MOVL $0x43800000, AX // 2^8
	VMOVD AX, X30
	MOVL $0xbf80, AX
	VPBROADCASTW AX, Y29

rblock:
	TESTQ CX, CX
	JZ    rdone
	VMULSS (DX), X30, X31
	VBROADCASTSS X31, Z31
	ADDQ  $4, DX
	MOVQ  BX, R8
	CMPQ  CX, BX
	CMOVQLT CX, R8
	SUBQ  R8, CX

rloop:
	VPMOVSXBW (SI), Y0
	VPSLLW    $7, Y0, Y0
	VPANDD    Y29, Y0, Y0
	VCVTPH2PS Y0, Z0
	VMULPS    Z31, Z0, Z0
	VMOVUPS   Z0, (DI)
	ADDQ      $16, SI
	ADDQ      $64, DI
	DECQ      R8
	JNZ       rloop
	JMP       rblock

rdone:
	VZEROUPPER
	RET
