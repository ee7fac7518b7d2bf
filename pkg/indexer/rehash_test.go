package indexer

import (
	"testing"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/kvevent"
)

// An engine that restarts with another hash seed while its stream goes on
// (the gateway did not see the restart) names the blocks it stores again by
// new hashes. The index keys them by their tokens, so they are blocks the
// lane already holds: the new hashes must name them too, so that the
// engine's later blocks find their parents, and the block stays resident
// until its last name is removed.
func TestARehashedEngineExtendsAndKeepsItsChainUntilItsLastNameGoes(t *testing.T) {
	toks := tokenRange(0, 4*16)
	seedA, seedB := hashSeq(1, 3), hashSeq(101, 3)
	for _, tc := range []struct {
		name string
		// drop removes the prefix's blocks by all their names, in some
		// order, checking what is left after the first half.
		drop func(t *testing.T, idx *SyncPrefixHashTable)
	}{
		{"old names removed first", func(t *testing.T, idx *SyncPrefixHashTable) {
			mustApply(t, idx, podA, removed("GPU", 0, seedA...))
			wantRun(t, idx, toks, 4, "after the old names went")
			mustApply(t, idx, podA, removed("GPU", 0, seedB...))
		}},
		{"new names removed first", func(t *testing.T, idx *SyncPrefixHashTable) {
			mustApply(t, idx, podA, removed("GPU", 0, seedB...))
			// The extension's parent went with its last name but one:
			// the prefix stays, under the old names.
			wantRun(t, idx, toks, 4, "after the new names went")
			mustApply(t, idx, podA, removed("GPU", 0, seedA...))
		}},
		{"names removed alternately, twice each", func(t *testing.T, idx *SyncPrefixHashTable) {
			for i := range seedA {
				mustApply(t, idx, podA, removed("GPU", 0, seedA[i], seedA[i]))
			}
			wantRun(t, idx, toks, 4, "after the old names went")
			for i := range seedB {
				mustApply(t, idx, podA, removed("GPU", 0, seedB[i], seedB[i]))
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			idx, reg := newTestTable(t, Config{})
			mustApply(t, idx, podA, stored(seedA, nil, toks[:48], 16))
			// The restarted engine recomputes the prompt and extends it.
			mustApply(t, idx, podA, stored(seedB, nil, toks[:48], 16))
			mustApply(t, idx, podA, stored([]uint64{104}, ptr[uint64](103), toks[48:], 16))
			if got := testsupport.MetricValue(t, reg, "kvgate_indexer_parent_misses_total", nil); got != 0 {
				t.Errorf("parent misses = %v, want 0", got)
			}
			wantRun(t, idx, toks, 4, "after the extension under a new name")
			st := idx.Stats()[0]
			if st.Entries != 4 || st.Pods[0].Streams[0].Lanes[0].Blocks != 4 {
				t.Fatalf("stats %+v, want 4 entries and 4 resident blocks", st)
			}
			tc.drop(t, idx)
			wantRun(t, idx, toks, 0, "after every name of the prefix went")
			if st := idx.Stats()[0]; st.Entries != 1 || st.Pods[0].Streams[0].Lanes[0].Blocks != 1 {
				t.Fatalf("stats %+v, want the extension's entry and block alone", st)
			}
			mustApply(t, idx, podA, removed("GPU", 0, 104))
			if st := idx.Stats()[0]; st.Entries != 0 {
				t.Fatalf("entries = %d after every block went, want 0", st.Entries)
			}
			if err := checkInvariants(idx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A lane's blocks named twice leave the index whole however the lane goes:
// cleared, eviction, a reset looking its keys up or sweeping for them.
func TestRehashedBlocksLeaveWithTheirLane(t *testing.T) {
	toks := tokenRange(0, 3*16)
	for _, tc := range []struct {
		name       string
		sweepRatio int
		drop       func(idx *SyncPrefixHashTable)
	}{
		{"cleared, keys looked up", 0, func(idx *SyncPrefixHashTable) {
			mustApply(t, idx, podA, &kvevent.AllBlocksClearedEvent{})
		}},
		{"cleared, slots swept", 1 << 30, func(idx *SyncPrefixHashTable) {
			mustApply(t, idx, podA, &kvevent.AllBlocksClearedEvent{})
		}},
		{"reset, keys looked up", 0, func(idx *SyncPrefixHashTable) { idx.ResetStream(podA) }},
		{"reset, slots swept", 1 << 30, func(idx *SyncPrefixHashTable) { idx.ResetStream(podA) }},
		{"block size changed", 0, func(idx *SyncPrefixHashTable) {
			mustApply(t, idx, podA, stored([]uint64{900}, nil, tokenRange(500, 8), 8))
			mustApply(t, idx, podA, removed("GPU", 0, 900))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			idx, _ := newTestTable(t, Config{})
			idx.sweepRatio = tc.sweepRatio
			mustApply(t, idx, podA, stored(hashSeq(1, 3), nil, toks, 16))
			mustApply(t, idx, podA, stored(hashSeq(101, 3), nil, toks, 16))
			mustApply(t, idx, podB, stored(hashSeq(1, 1), nil, toks[:16], 16))
			tc.drop(idx)
			if err := checkInvariants(idx); err != nil {
				t.Fatal(err)
			}
			st := idx.Stats()[0]
			if st.Entries != 1 {
				t.Fatalf("entries = %d, want pod B's one", st.Entries)
			}
			blocks, _ := match(idx, "llama", "", toks, "ns/a", "ns/b")
			if blocks["ns/a"] != 0 || blocks["ns/b"] != 1 {
				t.Fatalf("a=%d b=%d, want 0 1", blocks["ns/a"], blocks["ns/b"])
			}
		})
	}
}

// wantRun checks how many leading blocks of toks pod A is credited with.
func wantRun(t *testing.T, idx *SyncPrefixHashTable, toks []uint32, want int, when string) {
	t.Helper()
	if blocks, _ := match(idx, "llama", "", toks, "ns/a"); blocks["ns/a"] != want {
		t.Fatalf("%s: pod credited with %d blocks, want %d", when, blocks["ns/a"], want)
	}
	if err := checkInvariants(idx); err != nil {
		t.Fatalf("%s: %v", when, err)
	}
}

// A lane names a block by at most maxNamesPerBlock engine hashes, so that an
// engine storing the same content under ever new hashes cannot grow it
// without bound; further names are skipped and counted.
func TestABlockTakesAtMostMaxNamesPerBlockNames(t *testing.T) {
	idx, reg := newTestTable(t, Config{})
	toks := tokenRange(0, 16)
	const tries = maxNamesPerBlock + 3
	for i := range tries {
		mustApply(t, idx, podA, stored([]uint64{uint64(1000 + i)}, nil, toks, 16))
	}
	skipped := testsupport.MetricValue(t, reg, "kvgate_indexer_skipped_blocks_total", map[string]string{"reason": reasonNameLimit})
	if skipped != tries-maxNamesPerBlock {
		t.Fatalf("name_limit skips = %v, want %d", skipped, tries-maxNamesPerBlock)
	}
	ln := idx.pods["ns/a"].streams[0].lanes[0]
	if ln.m.n != maxNamesPerBlock || ln.m.blocks() != 1 {
		t.Fatalf("lane has %d names of %d blocks, want %d of 1", ln.m.n, ln.m.blocks(), maxNamesPerBlock)
	}
	// A child of a skipped name is an unknown parent.
	mustApply(t, idx, podA, stored([]uint64{2000}, ptr[uint64](1000+tries-1), tokenRange(16, 16), 16))
	if got := testsupport.MetricValue(t, reg, "kvgate_indexer_parent_misses_total", nil); got != 1 {
		t.Fatalf("parent misses = %v, want 1", got)
	}
	for i := range maxNamesPerBlock {
		wantRun(t, idx, toks, 1, "while the block has a name")
		mustApply(t, idx, podA, removed("GPU", 0, uint64(1000+i)))
	}
	wantRun(t, idx, toks, 0, "after every kept name went")
	if st := idx.Stats()[0]; st.Entries != 0 {
		t.Fatalf("entries = %d, want 0", st.Entries)
	}
}
