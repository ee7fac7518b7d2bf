package indexer

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/kvevent"
)

// The benchmark workload: 8 pods of one model, block size 16, prompts of
// 8,192 tokens (512 blocks), each resident on 2 pods, loaded through events
// of 16 blocks chained by their parents.
const (
	benchPods        = 8
	benchBlockSize   = 16
	benchPromptToks  = 8192
	benchEventBlocks = 16
)

var benchPodNames = func() []string {
	names := make([]string, benchPods)
	for i := range names {
		names[i] = fmt.Sprintf("ns/pod-%d", i)
	}
	return names
}()

func benchStream(pod int) Stream {
	return Stream{Pod: benchPodNames[pod], Model: "llama"}
}

// benchPrompt is prompt p of the workload: random token ids of a 128k vocab.
func benchPrompt(p int) []uint32 {
	rng := rand.New(rand.NewPCG(uint64(p), 1))
	toks := make([]uint32, benchPromptToks)
	for i := range toks {
		toks[i] = uint32(rng.IntN(128000))
	}
	return toks
}

// benchHash is the engine hash of block i of prompt p; engines of one model
// share their hash seed.
func benchHash(p, i int) uint64 { return uint64(p+1)<<32 | uint64(i) }

// benchEvents returns prompt p as 16-block BlockStored events.
func benchEvents(p int, toks []uint32) []*kvevent.BlockStoredEvent {
	var evs []*kvevent.BlockStoredEvent
	blocks := len(toks) / benchBlockSize
	for b := 0; b < blocks; b += benchEventBlocks {
		e := &kvevent.BlockStoredEvent{
			TokenIDs:  toks[b*benchBlockSize : (b+benchEventBlocks)*benchBlockSize],
			BlockSize: benchBlockSize, Medium: kvevent.MediumGPU, GroupIdx: 0,
		}
		for i := b; i < b+benchEventBlocks; i++ {
			e.BlockHashes = append(e.BlockHashes, benchHash(p, i))
		}
		if b > 0 {
			e.ParentBlockHash, e.HasParent = benchHash(p, b-1), true
		}
		evs = append(evs, e)
	}
	return evs
}

// loadWorkload stores prompts [0, prompts) on pods p%8 and (p+1)%8 and returns
// their tokens.
func loadWorkload(tb testing.TB, idx *SyncPrefixHashTable, prompts int) [][]uint32 {
	tb.Helper()
	all := make([][]uint32, prompts)
	for p := range all {
		all[p] = benchPrompt(p)
		for _, pod := range []int{p % benchPods, (p + 1) % benchPods} {
			for _, e := range benchEvents(p, all[p]) {
				if err := idx.ProcessBlockStored(benchStream(pod), e); err != nil {
					tb.Fatal(err)
				}
			}
		}
	}
	return all
}

var (
	benchOnce    sync.Once
	benchIdx     *SyncPrefixHashTable
	benchPrompts [][]uint32
)

// sharedWorkload is the 256-prompt workload, loaded once for the match
// benchmarks.
func sharedWorkload(b *testing.B) (*SyncPrefixHashTable, [][]uint32) {
	benchOnce.Do(func() {
		benchIdx, _ = newTestTable(b, Config{})
		benchPrompts = loadWorkload(b, benchIdx, 256)
	})
	return benchIdx, benchPrompts
}

func BenchmarkMatchPrefixFullHit(b *testing.B) {
	idx, prompts := sharedWorkload(b)
	var res MatchResult
	b.ReportAllocs()
	b.ResetTimer()
	cpu := cpuTime()
	for i := 0; i < b.N; i++ {
		p := i % len(prompts)
		idx.MatchPrefix("llama", "", prompts[p], benchPodNames, &res)
		if res.Pods[p%benchPods].Blocks != 512 {
			b.Fatalf("prompt %d: %+v", p, res.Pods)
		}
	}
	reportCPU(b, cpu)
}

func BenchmarkMatchPrefixMissAtBlock0(b *testing.B) {
	idx, _ := sharedWorkload(b)
	miss := benchPrompt(100000)
	var res MatchResult
	b.ReportAllocs()
	b.ResetTimer()
	cpu := cpuTime()
	for i := 0; i < b.N; i++ {
		idx.MatchPrefix("llama", "", miss, benchPodNames, &res)
		if res.Pods[0].Blocks != 0 {
			b.Fatal("miss matched")
		}
	}
	reportCPU(b, cpu)
}

// BenchmarkBlockKey is the cost of keying one 16-token block, the part of a
// miss at block 0 that is hashing.
func BenchmarkBlockKey(b *testing.B) {
	toks := benchPrompt(1)[:benchBlockSize]
	kr := newKeyer(1)
	k := uint64(1)
	for i := 0; i < b.N; i++ {
		k = kr.block(k, toks, 0)
	}
	sinkKey = k
}

var sinkKey uint64

// cpuTime is the CPU time the process has used. The benchmarks report it per
// operation beside the wall time, which a machine shared with other work
// inflates.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the CPU time per operation since start.
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
}

// BenchmarkProcessBlockStored stores new 16-block events (chains of 512
// blocks, as prefills of 8k-token prompts arrive) into an index that already
// holds the workload, and removes as many blocks as it stores, as an engine
// at steady state does, so the index keeps its size.
func BenchmarkProcessBlockStored(b *testing.B) {
	idx, _ := newTestTable(b, Config{})
	loadWorkload(b, idx, 256)
	s := benchStream(0)
	const pool = 64
	events := make([][]*kvevent.BlockStoredEvent, pool)
	for p := range events {
		events[p] = benchEvents(1000+p, benchPrompt(1000+p))
	}
	removals := make([]*kvevent.BlockRemovedEvent, 0, 32)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p, e := (i/32)%pool, i%32
		if err := idx.ProcessBlockStored(s, events[p][e]); err != nil {
			b.Fatal(err)
		}
		if e == 31 {
			// The engine evicts the prompt before it comes again.
			b.StopTimer()
			removals = removals[:0]
			for _, ev := range events[p] {
				removals = append(removals, removed("GPU", 0, ev.BlockHashes...))
			}
			for _, r := range removals {
				if err := idx.ProcessBlockRemoved(s, r); err != nil {
					b.Fatal(err)
				}
			}
			b.StartTimer()
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N*benchEventBlocks)/b.Elapsed().Seconds(), "blocks/s")
}

// BenchmarkProcessBlockRemoved removes 16-block runs of 512-block chains
// from an index that holds the workload, as an engine evicting a prompt
// does, and stores each chain again untimed once it is gone, so the index
// keeps its size.
func BenchmarkProcessBlockRemoved(b *testing.B) {
	idx, _ := newTestTable(b, Config{})
	loadWorkload(b, idx, 256)
	s := benchStream(0)
	const pool = 64
	events := make([][]*kvevent.BlockStoredEvent, pool)
	removals := make([][]*kvevent.BlockRemovedEvent, pool)
	for p := range events {
		events[p] = benchEvents(1000+p, benchPrompt(1000+p))
		for _, ev := range events[p] {
			if err := idx.ProcessBlockStored(s, ev); err != nil {
				b.Fatal(err)
			}
			removals[p] = append(removals[p], removed("GPU", 0, ev.BlockHashes...))
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p, e := (i/32)%pool, i%32
		if err := idx.ProcessBlockRemoved(s, removals[p][e]); err != nil {
			b.Fatal(err)
		}
		if e == 31 {
			b.StopTimer()
			for _, ev := range events[p] {
				if err := idx.ProcessBlockStored(s, ev); err != nil {
					b.Fatal(err)
				}
			}
			b.StartTimer()
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N*benchEventBlocks)/b.Elapsed().Seconds(), "blocks/s")
}

// BenchmarkMemoryPerResidency loads 1,000,000 (block, pod) residencies and
// reports the heap they take, measured after garbage collection; "churned"
// then replaces a third of the prompts, as engines evicting and storing do,
// so that the tables carry tombstones.
func BenchmarkMemoryPerResidency(b *testing.B) {
	for _, tc := range []struct {
		name           string
		prompts, churn int
	}{{"262144", 256, 0}, {"1000448", 977, 0}, {"1000448-churned", 977, 326}} {
		b.Run(tc.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				before := heapInUse()
				idx, _ := newTestTable(b, Config{})
				loadWorkloadKeyed(b, idx, tc.prompts)
				churnWorkload(b, idx, tc.prompts, tc.churn)
				after := heapInUse()
				residencies := tc.prompts * 512 * 2
				b.ReportMetric(float64(after-before)/float64(residencies), "B/residency")
				runtime.KeepAlive(idx)
			}
		})
	}
}

// loadWorkloadKeyed loads the workload without keeping the prompts' tokens,
// so that only the index is on the heap.
func loadWorkloadKeyed(tb testing.TB, idx *SyncPrefixHashTable, prompts int) {
	for p := 0; p < prompts; p++ {
		toks := benchPrompt(p)
		for _, pod := range []int{p % benchPods, (p + 1) % benchPods} {
			for _, e := range benchEvents(p, toks) {
				if err := idx.ProcessBlockStored(benchStream(pod), e); err != nil {
					tb.Fatal(err)
				}
			}
		}
	}
}

// churnWorkload removes prompts [0, n) from their pods and stores prompts
// [loaded, loaded+n) in their place.
func churnWorkload(tb testing.TB, idx *SyncPrefixHashTable, loaded, n int) {
	for p := 0; p < n; p++ {
		for _, pod := range []int{p % benchPods, (p + 1) % benchPods} {
			for b := 0; b < benchPromptToks/benchBlockSize; b += benchEventBlocks {
				r := removed("GPU", 0)
				for i := b; i < b+benchEventBlocks; i++ {
					r.BlockHashes = append(r.BlockHashes, benchHash(p, i))
				}
				if err := idx.ProcessBlockRemoved(benchStream(pod), r); err != nil {
					tb.Fatal(err)
				}
			}
		}
	}
	for p := loaded; p < loaded+n; p++ {
		toks := benchPrompt(p)
		for _, pod := range []int{p % benchPods, (p + 1) % benchPods} {
			for _, e := range benchEvents(p, toks) {
				if err := idx.ProcessBlockStored(benchStream(pod), e); err != nil {
					tb.Fatal(err)
				}
			}
		}
	}
}

func heapInUse() uint64 {
	var ms runtime.MemStats
	for i := 0; i < 3; i++ {
		runtime.GC()
	}
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkPurgePod100kWhileMatching purges a pod holding 102,400 blocks
// (200 prompts, each shared with another pod) while a goroutine keeps
// matching. It reports the purge time, the slowest match seen during the
// purges, and the slowest match seen in as long a time without purges.
func BenchmarkPurgePod100kWhileMatching(b *testing.B) {
	idx, _ := newTestTable(b, Config{})
	const prompts = 200
	toks := make([][]uint32, prompts)
	var evs [][]*kvevent.BlockStoredEvent
	for p := range toks {
		toks[p] = benchPrompt(p)
		evs = append(evs, benchEvents(p, toks[p]))
	}
	load := func(pod int) {
		for p := range evs {
			for _, e := range evs[p] {
				if err := idx.ProcessBlockStored(benchStream(pod), e); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	load(1)
	var stop atomic.Bool
	var slowest atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		var res MatchResult
		for i := 0; !stop.Load(); i++ {
			t0 := time.Now()
			idx.MatchPrefix("llama", "", toks[i%prompts], benchPodNames, &res)
			if d := int64(time.Since(t0)); d > slowest.Load() {
				slowest.Store(d)
			}
		}
	}()
	var purge time.Duration
	var during int64
	for i := 0; i < b.N; i++ {
		load(0)
		// Collect the reload's garbage now, so that a collection it
		// triggers does not pause the matcher during the purge.
		runtime.GC()
		slowest.Store(0)
		t0 := time.Now()
		idx.PurgePod(benchPodNames[0])
		purge += time.Since(t0)
		during = max(during, slowest.Load())
	}
	slowest.Store(0)
	time.Sleep(purge)
	baseline := slowest.Load()
	stop.Store(true)
	<-done
	b.ReportMetric(float64(purge.Nanoseconds())/float64(b.N)/1e6, "ms/purge")
	b.ReportMetric(float64(during)/1e3, "us-slowest-match-purging")
	b.ReportMetric(float64(baseline)/1e3, "us-slowest-match-idle")
}

// BenchmarkPurgePodOneOfEight purges a pod of the 8-pod workload at half a
// million keys (977 prompts, each on two pods): the pod holds 125,000 blocks,
// a quarter of the table, as one pod of a fleet does. The pod comes back
// holderReuseDelay after each purge, as a fleet replaces its pods, so that
// the table's holder ids stay under 64 as they do in a fleet of this size;
// a table that churns through more ids within the delay widens its holder
// sets, and its purges sweep a second array. It reports the mean purge time
// and the fastest, which other work on a shared machine delays least.
func BenchmarkPurgePodOneOfEight(b *testing.B) {
	idx, _, clock := newClockedTable(b, Config{})
	const prompts = 977
	loadWorkloadKeyed(b, idx, prompts)
	var evs []*kvevent.BlockStoredEvent
	for p := 0; p < prompts; p++ {
		if p%benchPods == 0 || (p+1)%benchPods == 0 {
			evs = append(evs, benchEvents(p, benchPrompt(p))...)
		}
	}
	var purge, fastest time.Duration
	for i := 0; i < b.N; i++ {
		runtime.GC()
		t0 := time.Now()
		idx.PurgePod(benchPodNames[0])
		d := time.Since(t0)
		purge += d
		if fastest == 0 || d < fastest {
			fastest = d
		}
		b.StopTimer()
		clock.Advance(holderReuseDelay)
		for _, e := range evs {
			if err := idx.ProcessBlockStored(benchStream(0), e); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(purge.Nanoseconds())/float64(b.N)/1e6, "ms/purge")
	b.ReportMetric(float64(fastest.Nanoseconds())/1e6, "ms/fastest-purge")
	b.ReportMetric(float64(len(evs)*benchEventBlocks), "blocks/pod")
}

// BenchmarkMatchParallelUnderIngest runs matches in parallel while 16-block
// events are stored and removed at 1,000,000 blocks/s. The matching
// goroutines take turns at the ingest when it is due, so that it keeps its
// pace on a machine with few cores, where a goroutine of its own would wait
// for a matcher's preemption after each pause. It reports the match
// throughput, the ingest rate reached and the CPU time per match (ingest
// included).
func BenchmarkMatchParallelUnderIngest(b *testing.B) {
	idx, prompts := sharedWorkload(b)
	const pool = 64
	events := make([][]*kvevent.BlockStoredEvent, pool)
	removals := make([][]*kvevent.BlockRemovedEvent, pool)
	for p := range events {
		events[p] = benchEvents(2000+p, benchPrompt(2000+p))
		for _, ev := range events[p] {
			removals[p] = append(removals[p], removed("GPU", 0, ev.BlockHashes...))
		}
	}
	s := benchStream(3)
	var (
		mu       sync.Mutex // held by the goroutine ingesting
		next     int        // the next event; guarded by mu
		ingested atomic.Int64
	)
	t0 := time.Now()
	// ingest applies the events due by now, unless another goroutine is.
	// Block n is due n µs after t0.
	ingest := func() {
		if ingested.Load() >= time.Since(t0).Microseconds() || !mu.TryLock() {
			return
		}
		defer mu.Unlock()
		for ingested.Load() < time.Since(t0).Microseconds() {
			p, e := (next/32)%pool, next%32
			if e == 0 {
				for _, r := range removals[p] {
					_ = idx.ProcessBlockRemoved(s, r)
				}
			}
			_ = idx.ProcessBlockStored(s, events[p][e])
			ingested.Add(benchEventBlocks)
			next++
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	cpu := cpuTime()
	m0 := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		var res MatchResult
		i := 0
		for pb.Next() {
			ingest()
			idx.MatchPrefix("llama", "", prompts[i%len(prompts)], benchPodNames, &res)
			i++
		}
	})
	elapsed := time.Since(m0)
	reportCPU(b, cpu)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "matches/s")
	b.ReportMetric(float64(ingested.Load())/time.Since(t0).Seconds(), "ingested-blocks/s")
}

// floodBatch is one batch of events of pod's stream storing n new blocks in
// one chain, 512 blocks an event; every event repeats the same tokens, which
// the chain keys apart.
func floodBatch(pod, n int) *kvevent.EventBatch {
	const per = 512
	toks := benchPrompt(1<<20 + pod)[:per*benchBlockSize]
	hashes := make([]uint64, n)
	for i := range hashes {
		hashes[i] = uint64(pod+1)<<40 | uint64(i)
	}
	batch := &kvevent.EventBatch{}
	for from := 0; from < n; from += per {
		to := min(from+per, n)
		e := &kvevent.BlockStoredEvent{
			BlockHashes: hashes[from:to], TokenIDs: toks[:(to-from)*benchBlockSize],
			BlockSize: benchBlockSize, Medium: kvevent.MediumGPU, GroupIdx: kvevent.NoGroup,
		}
		if from > 0 {
			e.ParentBlockHash, e.HasParent = hashes[from-1], true
		}
		batch.Events = append(batch.Events, e)
	}
	return batch
}

// BenchmarkEvictionFlood applies one batch of 1.5 times a model's key bound,
// from one pod, to a model whose 7 other pods hold a sixteenth of the bound
// each, at bounds up to the default. An operation is the whole batch: it
// stores 1.5 times the bound and, "evicting", evicts half of it and more;
// "fitting" stores the same batch under a bound it does not reach, which is
// the cost of storing alone. Eviction costs what it evicts when the two
// stay a constant time per block apart as the bound grows.
func BenchmarkEvictionFlood(b *testing.B) {
	for _, bound := range []int{20000, 100000, 1 << 20, DefaultMaxPrefixesPerContext} {
		flood := floodBatch(0, bound*3/2)
		for _, tc := range []struct {
			name  string
			bound int
		}{{"evicting", bound}, {"fitting", 4 * bound}} {
			b.Run(fmt.Sprintf("bound=%d/%s", bound, tc.name), func(b *testing.B) {
				benchFlood(b, tc.bound, bound/16, flood)
			})
		}
	}
}

// benchFlood applies flood from pod 0 to a fresh index of the given bound
// whose 7 other pods hold others blocks each, once per operation.
func benchFlood(b *testing.B, bound, others int, flood *kvevent.EventBatch) {
	var evicted, stored int
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		idx, _ := newTestTable(b, Config{MaxPrefixesPerContext: bound})
		held := 0
		for pod := 1; pod < benchPods; pod++ {
			if err := idx.ApplyBatch(benchStream(pod), floodBatch(pod, others)); err != nil {
				b.Fatal(err)
			}
			held += others
		}
		runtime.GC()
		b.StartTimer()
		if err := idx.ApplyBatch(benchStream(0), flood); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		for _, e := range flood.Events {
			n := len(e.(*kvevent.BlockStoredEvent).BlockHashes)
			held, stored = held+n, stored+n
		}
		for _, ln := range idx.model("llama").lanes {
			if ln != nil {
				held -= ln.m.n
			}
		}
		evicted += held
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(stored), "ns/block")
	b.ReportMetric(float64(evicted)/float64(b.N), "evicted/op")
}
