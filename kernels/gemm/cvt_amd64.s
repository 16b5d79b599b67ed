//go:build amd64 && !purego

#include "textflag.h"

// func roundBF16AVX512(dst *uint16, src *float32, n uintptr)
//
// dst[i] = Float32ToBF16(src[i]) for i < n (n a multiple of 16): round to
// nearest even by integer arithmetic on the bits (u + 0x7fff + lsb, high
// half), NaNs quieted ((u >> 16) | 0x40) like the Go function.
TEXT ·roundBF16AVX512(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $4, CX
	JZ   done
	MOVL $1, AX
	VPBROADCASTD AX, Z31
	MOVL $0x7fff, AX
	VPBROADCASTD AX, Z30
	MOVL $0x7fffffff, AX
	VPBROADCASTD AX, Z29
	MOVL $0x7f800000, AX
	VPBROADCASTD AX, Z28
	MOVL $0x40, AX
	VPBROADCASTD AX, Z27

loop:
	VMOVDQU32 (SI), Z0
	VPSRLD    $16, Z0, Z1
	VPANDD    Z31, Z1, Z2
	VPADDD    Z0, Z2, Z2
	VPADDD    Z30, Z2, Z2
	VPSRLD    $16, Z2, Z2
	VPANDD    Z29, Z0, Z3
	VPCMPUD   $6, Z28, Z3, K1
	VPORD     Z27, Z1, K1, Z2
	VPMOVDW   Z2, (DI)
	ADDQ      $64, SI
	ADDQ      $32, DI
	DECQ      CX
	JNZ       loop

done:
	VZEROUPPER
	RET
