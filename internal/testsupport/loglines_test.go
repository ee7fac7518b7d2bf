package testsupport

import (
	"slices"
	"sync"
	"testing"

	"github.com/go-logr/logr/funcr"
)

func TestLogLinesKeepsWhatALoggerWrites(t *testing.T) {
	var logs LogLines
	log := funcr.New(logs.Add, funcr.Options{}).WithName("cache")
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() { log.Info("scraped", "pod", "ns/p", "n", i) })
	}
	wg.Wait()
	log.Info("stopped", "pod", "ns/q")
	if got := logs.Containing(`"msg"="scraped"`); len(got) != 4 {
		t.Fatalf("lines with scraped: %q, want 4", got)
	}
	if got, want := logs.Containing("ns/q"), []string{`"level"=0 "msg"="stopped" "pod"="ns/q"`}; !slices.Equal(got, want) {
		t.Fatalf("lines with ns/q: %q, want %q", got, want)
	}
	if got := logs.Containing("nothing logged"); got != nil {
		t.Fatalf("lines with what was not logged: %q", got)
	}
}
