package indexer

import (
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testsupport"
)

// returnsWhileLocked runs fn while a writer holds m's lock, as one applying
// a huge batch does, and fails unless fn returns before the writer lets go.
// It then releases the lock, which runs the work fn left for the writer.
func returnsWhileLocked(t *testing.T, m *modelTable, what string, fn func()) {
	t.Helper()
	m.lock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
		m.unlock()
	case <-time.After(30 * time.Second):
		m.unlock()
		<-done
		t.Fatalf("%s waited for the model's writer", what)
	}
}

func TestStatsMetricsAndTheSweepNeverWaitForAWriter(t *testing.T) {
	idx, reg, clock := newClockedTable(t, Config{EvictionDuration: time.Minute})
	idle := Stream{Pod: "ns/idle", Model: "llama"}
	mustApply(t, idx, idle, stored(hashSeq(1, 3), nil, tokenRange(0, 48), 16))
	clock.Advance(2 * time.Minute)
	mustApply(t, idx, podA, stored(hashSeq(1, 2), nil, tokenRange(0, 32), 16))
	m := idx.model("llama")

	returnsWhileLocked(t, m, "Stats, a scrape and the idle sweep", func() {
		st := idx.Stats()
		if len(st) != 1 || st[0].Entries != 3 || len(st[0].Pods) != 2 {
			t.Errorf("Stats while a writer runs = %+v, want both pods and 3 entries", st)
		}
		if _, err := reg.Gather(); err != nil {
			t.Errorf("Gather: %v", err)
		}
		idx.sweep(clock.Now())
	})
	// The writer released the idle pod's stream before letting go.
	if got := testsupport.MetricValue(t, reg, "kvgate_indexer_evicted_blocks_total", map[string]string{"reason": reasonIdle}); got != 3 {
		t.Errorf("idle evictions after the writer let go = %v, want 3", got)
	}
	blocks, _ := match(idx, "llama", "", tokenRange(0, 48), "ns/idle", "ns/a")
	if blocks["ns/idle"] != 0 || blocks["ns/a"] != 2 {
		t.Errorf("after the sweep: %v, want the idle pod purged and pod a kept", blocks)
	}
	if err := checkInvariants(idx); err != nil {
		t.Fatal(err)
	}
}

func TestDroppingABusyModelDoesNotWaitForItsWriter(t *testing.T) {
	idx, reg, clock := newClockedTable(t, Config{MaxContexts: 1})
	storePrompt(t, idx, podA, 0, 4)
	clock.Advance(time.Second)
	m := idx.model("llama")
	other := Stream{Pod: "ns/b", Model: "mistral"}
	returnsWhileLocked(t, m, "a batch of another model past MaxContexts", func() {
		storePrompt(t, idx, other, 1, 2)
		if _, ok := idx.BlockSize("llama"); ok {
			t.Error("the dropped model is still indexed")
		}
	})
	if got := testsupport.MetricValue(t, reg, "kvgate_indexer_evicted_blocks_total", map[string]string{"reason": reasonContext}); got != 4 {
		t.Errorf("context_capacity evictions = %v, want 4", got)
	}
	if err := checkInvariants(idx); err != nil {
		t.Fatal(err)
	}
	if n := idx.total.Load(); n != 2 {
		t.Errorf("total keys = %d, want the new model's 2", n)
	}
}

// TestWorkLeftForAWriterAlwaysRuns races work left with later against
// writers that take and release the lock: once every goroutine has
// returned, every piece of work has run, each under the lock.
func TestWorkLeftForAWriterAlwaysRuns(t *testing.T) {
	idx, _ := newTestTable(t, Config{})
	storePrompt(t, idx, podA, 0, 1)
	m := idx.model("llama")
	const writers, leavers, each = 4, 4, 2000
	ran := 0 // guarded by m.mu
	var wg sync.WaitGroup
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				m.lock()
				m.unlock()
			}
		}()
	}
	for range leavers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				m.later(func() { ran++ })
			}
		}()
	}
	wg.Wait()
	m.lock()
	defer m.unlock()
	if ran != leavers*each {
		t.Fatalf("%d pieces of work ran, want %d", ran, leavers*each)
	}
}
