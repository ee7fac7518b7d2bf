//go:build !race

package rawsock

// raceWrite and raceRead tell the race detector of a Conn's system calls
// in race builds (see race.go).
func raceWrite(uintptr, []byte, []byte) {}
func raceRead(uintptr, []byte)          {}
