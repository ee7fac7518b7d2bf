package indexer

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testsupport"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/pkg/kvevent"
)

// newTestTable returns a table with its metrics on a fresh registry.
func newTestTable(tb testing.TB, cfg Config) (*SyncPrefixHashTable, *prometheus.Registry) {
	tb.Helper()
	reg := prometheus.NewRegistry()
	t, err := NewSyncPrefixHashTable(cfg, reg)
	if err != nil {
		tb.Fatalf("NewSyncPrefixHashTable: %v", err)
	}
	return t, reg
}

// newClockedTable returns a table with its metrics on a fresh registry and
// its time from a clock the test advances.
func newClockedTable(tb testing.TB, cfg Config) (*SyncPrefixHashTable, *prometheus.Registry, *testsupport.Clock) {
	tb.Helper()
	t, reg := newTestTable(tb, cfg)
	clock := testsupport.NewClock(time.Now())
	t.now = clock.Now
	return t, reg, clock
}

// tokenRange returns n consecutive token ids starting at from.
func tokenRange(from, n int) []uint32 {
	toks := make([]uint32, n)
	for i := range toks {
		toks[i] = uint32(from + i)
	}
	return toks
}

// stored builds a BlockStored event of GPU blocks in group 0 for the given
// engine hashes, chained from parent when parent is not nil.
func stored(hashes []uint64, parent *uint64, tokens []uint32, blockSize int) *kvevent.BlockStoredEvent {
	e := &kvevent.BlockStoredEvent{
		BlockHashes: hashes,
		TokenIDs:    tokens,
		BlockSize:   blockSize,
		Medium:      kvevent.MediumGPU,
		GroupIdx:    kvevent.NoGroup,
	}
	if parent != nil {
		e.ParentBlockHash, e.HasParent = *parent, true
	}
	return e
}

func removed(medium string, group int, hashes ...uint64) *kvevent.BlockRemovedEvent {
	return &kvevent.BlockRemovedEvent{BlockHashes: hashes, Medium: medium, GroupIdx: group}
}

func hashSeq(from uint64, n int) []uint64 {
	hs := make([]uint64, n)
	for i := range hs {
		hs[i] = from + uint64(i)
	}
	return hs
}

func ptr[T any](v T) *T { return &v }

// mustApply applies events as one batch of s and fails the test on error.
func mustApply(tb testing.TB, t *SyncPrefixHashTable, s Stream, events ...kvevent.KVEvent) {
	tb.Helper()
	if err := t.ApplyBatch(s, &kvevent.EventBatch{Events: events}); err != nil {
		tb.Fatalf("ApplyBatch(%v): %v", s, err)
	}
}

// match runs MatchPrefix and returns the any-medium and GPU blocks per pod.
func match(t *SyncPrefixHashTable, model, lora string, tokens []uint32, pods ...string) (blocks, gpu map[string]int) {
	var res MatchResult
	t.MatchPrefix(model, lora, tokens, pods, &res)
	blocks, gpu = map[string]int{}, map[string]int{}
	for _, p := range res.Pods {
		blocks[p.Pod], gpu[p.Pod] = p.Blocks, p.GPUBlocks
		if p.Tokens != p.Blocks*p.BlockSize || p.GPUTokens < p.GPUBlocks*p.BlockSize ||
			p.GPUTokens >= (p.GPUBlocks+1)*max(p.BlockSize, 1) || p.GPUTokens > p.Tokens {
			panic(fmt.Sprintf("tokens of %+v do not follow its block size", p))
		}
	}
	return blocks, gpu
}

// checkInvariants verifies, white-box, that the key tables, holder sets and
// lane maps of t agree exactly, and that every count matches what it counts.
func checkInvariants(t *SyncPrefixHashTable) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	var total int64
	for name, m := range *t.models.Load() {
		if err := m.checkInvariants(); err != nil {
			return fmt.Errorf("model %s: %w", name, err)
		}
		total += int64(m.keys.n)
	}
	if got := t.total.Load(); got != total {
		return fmt.Errorf("total count %d, want %d", got, total)
	}
	return nil
}

func (m *modelTable) checkInvariants() error {
	m.lock()
	defer m.unlock()
	holders := map[uint64]map[int]bool{}
	for id, ln := range m.lanes {
		if ln == nil {
			continue
		}
		if ln.id != id {
			return fmt.Errorf("lane at %d has id %d", id, ln.id)
		}
		n, names := 0, map[uint64]int32{}
		for i := range ln.m.slots() {
			k := ln.m.key(i)
			if k == 0 {
				continue
			}
			n++
			if got, ok := ln.m.get(ln.m.hash(i)); !ok || got != k {
				return fmt.Errorf("lane %d: hash %d unreachable", id, ln.m.hash(i))
			}
			if holders[k] == nil {
				holders[k] = map[int]bool{}
			}
			holders[k][id] = true
			names[k]++
		}
		if n != ln.m.n {
			return fmt.Errorf("lane %d counts %d entries, has %d", id, ln.m.n, n)
		}
		extra := 0
		for k, c := range names {
			if c > 1 && ln.m.aliases[k] != c-1 {
				return fmt.Errorf("lane %d names key %x %d times, counts %d more names", id, k, c, ln.m.aliases[k])
			}
			extra += int(c - 1)
		}
		if extra != ln.m.extra || len(ln.m.aliases) > len(names) {
			return fmt.Errorf("lane %d counts %d extra names of %d keys, has %d", id, ln.m.extra, len(ln.m.aliases), extra)
		}
	}
	isLive := func(id int) bool { return m.lanes[id] != nil }
	for id := range len(m.lanes) {
		w, b := id>>6, uint64(1)<<(id&63)
		if inMask := w < len(m.keys.live) && m.keys.live[w]&b != 0; inMask != isLive(id) {
			return fmt.Errorf("holder %d live in the mask: %v, has a lane: %v", id, inMask, isLive(id))
		}
	}
	keys := 0
	for s := range m.keys.shards {
		sh := &m.keys.shards[s]
		a := sh.arr.Load()
		n, dead := 0, 0
		for i := range a.slots {
			k := a.slots[i].key
			if k == emptyKey {
				continue
			}
			if k == deadKey || !m.keys.held(a, i) {
				// A tombstone, or a key whose holders were all released.
				dead++
				if k != deadKey && len(holders[k]) != 0 {
					return fmt.Errorf("key %x has no live holder, lanes hold it", k)
				}
			} else {
				n++
				if j, ok := a.find(k); !ok || j != i {
					return fmt.Errorf("key %x unreachable", k)
				}
			}
			want := holders[k]
			for w := range a.width() {
				for b := 0; b < 64; b++ {
					id := w*64 + b
					got := *a.word(w, i)&(1<<b) != 0
					switch {
					case id < len(m.lanes) && isLive(id):
						if k != deadKey && got != want[id] {
							return fmt.Errorf("key %x: holder %d is %v, lanes say %v", k, id, got, want[id])
						}
						if k == deadKey && got {
							return fmt.Errorf("tombstone with live holder %d", id)
						}
					case got && m.keys.stale[id]&(1<<s) == 0:
						return fmt.Errorf("key %x has a bit of holder %d, which is neither live nor stale in shard %d", k, id, s)
					}
				}
			}
			if k != deadKey {
				delete(holders, k)
			}
		}
		if n != sh.n || dead != sh.dead {
			return fmt.Errorf("shard %d counts %d keys and %d dead slots, has %d and %d", s, sh.n, sh.dead, n, dead)
		}
		keys += n
	}
	if len(holders) != 0 {
		return fmt.Errorf("%d keys held by lanes are missing from the key table", len(holders))
	}
	if keys != m.keys.n || int64(keys) != m.keys.count.Load() {
		return fmt.Errorf("key table counts %d (%d), has %d", m.keys.n, m.keys.count.Load(), keys)
	}
	if keys > m.t.cfg.MaxPrefixesPerContext {
		return fmt.Errorf("%d keys exceed MaxPrefixesPerContext %d", keys, m.t.cfg.MaxPrefixesPerContext)
	}
	return nil
}

// msgpackExtras encodes one block's extra keys as vLLM does: the adapter name
// when there is one, then a multimodal item [identifier, offset] when img is
// set; nil when there is neither.
func msgpackExtras(lora, img string) []byte {
	var elems [][]byte
	if lora != "" {
		elems = append(elems, msgpackStr(lora))
	}
	if img != "" {
		elems = append(elems, append(append([]byte{0x92}, msgpackStr(img)...), 0x00))
	}
	if len(elems) == 0 {
		return nil
	}
	out := []byte{0x90 | byte(len(elems))}
	for _, e := range elems {
		out = append(out, e...)
	}
	return out
}

func msgpackStr(s string) []byte {
	if len(s) > 31 {
		panic("msgpackStr: long strings are not needed by the tests")
	}
	return append([]byte{0xa0 | byte(len(s))}, s...)
}

func itoa(i int) string { return strconv.Itoa(i) }
