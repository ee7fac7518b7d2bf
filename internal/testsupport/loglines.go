package testsupport

import (
	"strings"
	"sync"
)

// LogLines captures the lines of a funcr logger: pass its Add to
// funcr.New. It is safe for concurrent use.
type LogLines struct {
	mu    sync.Mutex
	lines []string
}

// Add records one line: its key-value pairs, without the logger's name.
func (l *LogLines) Add(prefix, args string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, args)
}

// Containing returns the lines recorded so far that contain s.
func (l *LogLines) Containing(s string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			out = append(out, line)
		}
	}
	return out
}
