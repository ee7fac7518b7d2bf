//go:build race

package rawsock

import (
	"runtime"
	"syscall"
	"unsafe"
)

// The race detector learns of the net package's reads and writes from
// package syscall: the bytes a read fills are written, those a write sends
// are read, and every write happens before every read that returns after
// it, across connections, which is how it sees one goroutine's request
// reach another's handler. Raw system calls tell it nothing, so in race
// builds a Conn tells it the same, the ordering through a read and a write
// of no bytes, which package syscall annotates and the kernel answers at
// once.

// raceWrite precedes a write of a and b to fd.
func raceWrite(fd uintptr, a, b []byte) {
	_, _ = syscall.Write(int(fd), nil)
	for _, p := range [2][]byte{a, b} {
		if len(p) > 0 {
			runtime.RaceReadRange(unsafe.Pointer(&p[0]), len(p))
		}
	}
}

// raceRead follows a read from fd that filled p.
func raceRead(fd uintptr, p []byte) {
	if len(p) > 0 {
		runtime.RaceWriteRange(unsafe.Pointer(&p[0]), len(p))
	}
	_, _ = syscall.Read(int(fd), nil)
}
