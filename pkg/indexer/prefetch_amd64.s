#include "textflag.h"

// func prefetchSlots(slots []*keySlot), documented in prefetch.go.
TEXT ·prefetchSlots(SB), NOSPLIT, $0-24
	MOVQ slots_base+0(FP), SI
	MOVQ slots_len+8(FP), CX
	TESTQ CX, CX
	JEQ done
loop:
	MOVQ (SI), AX
	PREFETCHT0 (AX)
	PREFETCHT0 64(AX)
	ADDQ $8, SI
	DECQ CX
	JNE loop
done:
	RET
