//go:build amd64 && !purego

#include "textflag.h"

// func dequantFP8AVX512(dst *float32, src *byte, n uintptr, s float32)
//
// dst[i] = e4m3(src[i]) · s for i < n (n a multiple of 16): the code's
// exponent and mantissa bits are placed at float32 bits 20…26 with the
// sign at bit 31, which is the value times 2^−120 exactly (subnormal codes
// become float32 subnormals), so one multiplication by 2^120 gives the
// exact value and one by s the product Go computes; codes 0x7f and 0xff
// (NaN) become NaN.
TEXT ·dequantFP8AVX512(SB), NOSPLIT, $0-28
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $4, CX
	JZ   done
	VBROADCASTSS s+24(FP), Z31
	MOVL $0x7b800000, AX // 2^120
	VPBROADCASTD AX, Z30
	MOVL $0x80000000, AX
	VPBROADCASTD AX, Z29
	MOVL $0x7f, AX
	VPBROADCASTD AX, Z28
	MOVL $0x07f00000, AX // 0x7f << 20: the NaN codes' magnitude
	VPBROADCASTD AX, Z27
	MOVL $0x7fc00000, AX
	VPBROADCASTD AX, Z26

loop:
	VPMOVZXBD (SI), Z0
	VPSLLD    $24, Z0, Z1
	VPANDD    Z29, Z1, Z1
	VPANDD    Z28, Z0, Z2
	VPSLLD    $20, Z2, Z2
	VPCMPEQD  Z27, Z2, K1
	VPORD     Z1, Z2, Z2
	VMULPS    Z30, Z2, Z2
	VMULPS    Z31, Z2, Z2
	VMOVDQU32 Z26, K1, Z2
	VMOVUPS   Z2, (DI)
	ADDQ      $16, SI
	ADDQ      $64, DI
	DECQ      CX
	JNZ       loop

done:
	VZEROUPPER
	RET
