#include "textflag.h"

// func prefetchSlots(slots []*keySlot), documented in prefetch.go.
TEXT ·prefetchSlots(SB), NOSPLIT, $0-24
	MOVD slots_base+0(FP), R0
	MOVD slots_len+8(FP), R1
	CBZ R1, done
loop:
	MOVD.P 8(R0), R2
	PRFM (R2), PLDL1KEEP
	ADD $64, R2, R3
	PRFM (R3), PLDL1KEEP
	SUB $1, R1, R1
	CBNZ R1, loop
done:
	RET
