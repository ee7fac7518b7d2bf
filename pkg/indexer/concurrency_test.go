package indexer

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kvgate/kvgate/pkg/kvevent"
)

// TestMatchesStayExactWhileEventsAndPurgesRun runs matches in several
// goroutines while one writer keeps storing, removing and purging pod A's
// blocks, growing and shrinking the key table, and another model evicts at
// capacity. Pod B's blocks never change, so every match must credit it
// exactly; pod A may be credited at most what it ever held.
func TestMatchesStayExactWhileEventsAndPurgesRun(t *testing.T) {
	idx, _ := newTestTable(t, Config{})
	other, _ := newTestTable(t, Config{MaxPrefixesPerContext: 256})
	toks := tokenRange(0, 16*32)
	const bBlocks = 12
	mustApply(t, idx, podB, stored(hashSeq(1, bBlocks), nil, toks[:16*bBlocks], 16))

	var stop atomic.Bool
	var wg sync.WaitGroup
	var matches atomic.Int64
	errs := make(chan string, 16)
	for r := 0; r < 3; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var res MatchResult
			pods := []string{"ns/a", "ns/b"}
			for !stop.Load() {
				idx.MatchPrefix("llama", "", toks, pods, &res)
				matches.Add(1)
				if res.Pods[1].Blocks != bBlocks || res.Pods[1].GPUBlocks != bBlocks {
					errs <- "pod B, which never changes, was credited wrongly"
					return
				}
				if res.Pods[0].Blocks > 32 {
					errs <- "pod A credited more blocks than the prompt has"
					return
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		// Statistics read what writers publish, taking no model lock.
		for !stop.Load() {
			for _, ms := range idx.Stats() {
				for _, ps := range ms.Pods {
					if ps.Pod == "ns/b" && (len(ps.Streams) != 1 || len(ps.Streams[0].Lanes) != 1 || ps.Streams[0].Lanes[0].Blocks != bBlocks) {
						errs <- "Stats reported pod B, which never changes, wrongly"
						return
					}
				}
			}
		}
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		s := Stream{Pod: "ns/x", Model: "other"}
		for i := 0; !stop.Load(); i++ {
			ev := stored(hashSeq(uint64(i*64), 64), nil, tokenRange(i*10000, 16*64), 16)
			if err := other.ProcessBlockStored(s, ev); err != nil {
				errs <- err.Error()
				return
			}
		}
	}()
	// A failing writer must not leave the readers running.
	stopped := false
	defer func() {
		if !stopped {
			stop.Store(true)
			wg.Wait()
		}
	}()
	for round := 0; round < 300; round++ {
		mustApply(t, idx, podA, stored(hashSeq(1, 32), nil, toks, 16))
		// Unrelated blocks make the key table grow and shrink.
		mustApply(t, idx, podA, stored(hashSeq(uint64(1000+round*100), 64), nil, tokenRange(1<<20+round*4096, 16*64), 16))
		switch round % 3 {
		case 0:
			for h := uint64(32); h > 16; h-- {
				mustApply(t, idx, podA, removed("GPU", 0, h))
			}
		case 1:
			mustApply(t, idx, podA, &kvevent.AllBlocksClearedEvent{})
		case 2:
			idx.PurgePod("ns/a")
		}
	}
	stop.Store(true)
	wg.Wait()
	stopped = true
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if matches.Load() == 0 {
		t.Fatal("no match ran while the writer did")
	}
	if err := checkInvariants(idx); err != nil {
		t.Fatal(err)
	}
	if err := checkInvariants(other); err != nil {
		t.Fatal(err)
	}
}
