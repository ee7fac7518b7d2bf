package indexer

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/kvevent"
)

// The model-based test drives the index with random interleavings of stored,
// removed, cleared, reset and purge events across pods, ranks, media, groups,
// models, adapters and block sizes, and after every step compares it with a
// reference that just remembers, per lane, which engine hash names which
// content. Engines send a parent hash of 0 for some first blocks, name some
// adapters by id only, which the reference knows the index's policies for,
// and restart with another hash seed unseen, naming content they stored
// before by new hashes. Under a small bound, the index may also evict: the
// test checks that it never invents a residency and that only the streams
// that held the most lost blocks, then lets the reference forget what the
// index evicted.

// refPrompt is a prompt of the pool engines store and routers ask about.
// Prompts are derived from each other so that they share prefixes; img is
// the token carrying a multimodal item, -1 for none.
type refPrompt struct {
	tokens []uint32
	img    int
}

// refModel is a model of the pool. Its prompts are whole blocks of unit
// tokens; each pod's engines use a block size that divides unit.
type refModel struct {
	name    string
	unit    int
	bs      map[string]int // by pod
	pods    []string
	ranks   int
	prompts []refPrompt
}

type laneID struct {
	pod    string
	rank   int
	medium string
	group  int
}

// reference is the model of what each lane holds: engine hash -> content,
// where content is a readable string naming model, adapter, block size,
// tokens and multimodal items of the whole prefix.
type reference struct {
	lanes map[laneID]map[uint64]string
	model map[string]*refModel // by pod
}

func (r *reference) streamLanes(pod string, rank int) []laneID {
	var out []laneID
	for id := range r.lanes {
		if id.pod == pod && id.rank == rank {
			out = append(out, id)
		}
	}
	return out
}

// content names the prefix toks, keyed at block size bs, of a prompt whose
// multimodal item is token img (-1 for none, as a router's prompt has).
func content(m *refModel, bs int, lora string, toks []uint32, img int) string {
	s := fmt.Sprintf("%s|%s|%d|%v", m.name, lora, bs, toks)
	if img >= 0 && img < len(toks) {
		s += fmt.Sprintf("|img@%d", img)
	}
	return s
}

// engineHash is how an engine with a given seed names content.
func engineHash(seed uint64, content string) uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%s", seed, content)
	return h.Sum64()
}

func newRefModel(rng *rand.Rand, name string, unit, ranks int, pods ...string) *refModel {
	m := &refModel{name: name, unit: unit, bs: map[string]int{}, pods: pods, ranks: ranks}
	for _, p := range pods {
		m.bs[p] = unit
	}
	for i := 0; i < 24; i++ {
		nb := 2 + rng.IntN(7)
		if rng.IntN(4) == 0 {
			// Long enough for a match to walk several batches.
			nb += rng.IntN(40)
		}
		toks := make([]uint32, 0, nb*unit)
		img, cut := -1, 0
		if i > 0 && rng.IntN(4) > 0 {
			parent := m.prompts[rng.IntN(len(m.prompts))]
			cut = rng.IntN(min(nb, len(parent.tokens)/unit) + 1)
			toks = append(toks, parent.tokens[:cut*unit]...)
			if parent.img < cut*unit {
				img = parent.img
			}
		}
		for len(toks) < nb*unit {
			toks = append(toks, uint32(rng.IntN(50)))
		}
		if img < 0 && cut < nb && rng.IntN(5) == 0 {
			img = cut*unit + rng.IntN((nb-cut)*unit)
		}
		m.prompts = append(m.prompts, refPrompt{toks, img})
	}
	return m
}

func TestModelBasedRandomInterleavings(t *testing.T) {
	for _, bound := range []int{0, 40} {
		for _, sharedSeed := range []bool{true, false} {
			for _, release := range []struct {
				name  string
				ratio int
			}{{"lookup", 0}, {"sweep", math.MaxInt32}} {
				seeds := uint64(6)
				if bound > 0 {
					seeds = 3
				}
				for seed := uint64(1); seed <= seeds; seed++ {
					name := fmt.Sprintf("bound=%d/sharedEngineSeed=%v/release=%s/seed=%d", bound, sharedSeed, release.name, seed)
					t.Run(name, func(t *testing.T) {
						runModelBased(t, seed, sharedSeed, release.ratio, bound, 600)
					})
				}
			}
		}
	}
}

// runModelBased runs steps random steps against a reference; sweepRatio
// makes releases look up each key (0) or sweep the tables (MaxInt32); a
// bound other than 0 is the models' MaxPrefixesPerContext.
func runModelBased(t *testing.T, seed uint64, sharedSeed bool, sweepRatio, bound, steps int) {
	rng := rand.New(rand.NewPCG(seed, 42))
	idx, _ := newTestTable(t, Config{MaxPrefixesPerContext: bound})
	idx.sweepRatio = sweepRatio
	clock := testsupport.NewClock(time.Now())
	idx.now = clock.Now
	m1 := newRefModel(rng, "m1", 8, 2, "ns/p0", "ns/p1", "ns/p2")
	// One engine of m1 was configured with a smaller block size.
	m1.bs["ns/p1"] = 4
	models := []*refModel{m1, newRefModel(rng, "m2", 8, 1, "ns/p3", "ns/p4")}
	ref := &reference{lanes: map[laneID]map[uint64]string{}, model: map[string]*refModel{}}
	for _, m := range models {
		for _, p := range m.pods {
			ref.model[p] = m
		}
	}
	// restarts counts the unseen restarts of each engine, which change
	// its hash seed.
	restarts := map[[2]any]uint64{}
	engineSeed := func(pod string, rank int) uint64 {
		if sharedSeed {
			return 7 + restarts[[2]any{pod, rank}]
		}
		return engineHash(uint64(rank)+restarts[[2]any{pod, rank}]<<8, pod)
	}
	loras := []string{"", "", "a1", "a2"}
	for step := 0; step < steps; step++ {
		if rng.IntN(3) == 0 {
			clock.Advance(time.Second)
		}
		m := models[rng.IntN(len(models))]
		pod := m.pods[rng.IntN(len(m.pods))]
		rank := rng.IntN(m.ranks)
		s := Stream{Pod: pod, Rank: rank, Model: m.name}
		var desc string
		switch op := rng.IntN(100); {
		case op < 55:
			desc = stepStore(t, rng, idx, ref, m, s, engineSeed(pod, rank), loras[rng.IntN(len(loras))])
		case op < 85:
			desc = stepRemove(t, rng, idx, ref, s)
		case op < 92:
			desc = "clear " + pod
			mustApply(t, idx, s, &kvevent.AllBlocksClearedEvent{})
			for _, id := range ref.streamLanes(pod, rank) {
				ref.lanes[id] = map[uint64]string{}
			}
		case op < 94:
			// The engine restarted with another hash seed, and its stream
			// went on: the blocks it stores again get second names.
			desc = "rehash " + pod
			restarts[[2]any{pod, rank}]++
		case op < 97:
			desc = "reset " + pod
			idx.ResetStream(s)
			for _, id := range ref.streamLanes(pod, rank) {
				delete(ref.lanes, id)
			}
		default:
			desc = "purge " + pod
			idx.PurgePod(pod)
			for id := range ref.lanes {
				if id.pod == pod {
					delete(ref.lanes, id)
				}
			}
		}
		if err := checkInvariants(idx); err != nil {
			t.Fatalf("step %d (%s): %v", step, desc, err)
		}
		if bound > 0 {
			if err := checkEvictions(idx, ref, models, s); err != nil {
				t.Fatalf("step %d (%s): %v", step, desc, err)
			}
		}
		if err := compareLanes(idx, ref); err != nil {
			t.Fatalf("step %d (%s): %v", step, desc, err)
		}
		for q := 0; q < 3; q++ {
			if err := compareMatch(rng, idx, ref, models[rng.IntN(len(models))], loras[rng.IntN(len(loras))]); err != nil {
				t.Fatalf("step %d (%s): %v", step, desc, err)
			}
		}
	}
}

// stepStore stores a random run of blocks of a pool prompt: from the root,
// from a parent the stream may or may not hold, or from an unknown parent.
func stepStore(t *testing.T, rng *rand.Rand, idx *SyncPrefixHashTable, ref *reference, m *refModel, s Stream, eseed uint64, lora string) string {
	p := m.prompts[rng.IntN(len(m.prompts))]
	bs := m.bs[s.Pod]
	nb := len(p.tokens) / bs
	start := 0
	if rng.IntN(5) > 1 {
		start = rng.IntN(nb)
	}
	n := 1 + rng.IntN(nb-start)
	media := []string{"GPU", "GPU", "CPU", ""}
	id := laneID{s.Pod, s.Rank, normMedium(media[rng.IntN(len(media))]), 0}
	group := kvevent.NoGroup
	if rng.IntN(5) == 0 {
		id.group, group = 1, 1
	}
	loraID := 0
	if lora == "" && rng.IntN(8) == 0 {
		loraID = 5
	}
	ev := &kvevent.BlockStoredEvent{
		TokenIDs: p.tokens[start*bs : (start+n)*bs], BlockSize: bs,
		Medium: id.medium, GroupIdx: group, LoraName: lora, LoraID: loraID,
	}
	if rng.IntN(4) == 0 {
		id.medium, ev.Medium = "GPU", ""
	}
	for i := start; i < start+n; i++ {
		ev.BlockHashes = append(ev.BlockHashes, engineHash(eseed, content(m, bs, lora, p.tokens[:(i+1)*bs], p.img)))
		img := ""
		if p.img >= i*bs && p.img < (i+1)*bs {
			img = fmt.Sprintf("img-%d-%d", p.img, p.tokens[p.img])
		}
		ev.ExtraKeys = append(ev.ExtraKeys, msgpackExtras(lora, img))
	}
	parentKnown := true
	switch {
	case start > 0:
		ev.HasParent = true
		ev.ParentBlockHash = engineHash(eseed, content(m, bs, lora, p.tokens[:start*bs], p.img))
		if rng.IntN(10) == 0 {
			ev.ParentBlockHash = rng.Uint64()
		}
		parentKnown = false
		for _, l := range ref.streamLanes(s.Pod, s.Rank) {
			if _, ok := ref.lanes[l][ev.ParentBlockHash]; ok {
				parentKnown = true
			}
		}
	case rng.IntN(4) == 0:
		// Some engines send parent 0 rather than none for a first block.
		ev.HasParent = true
	}
	mustApply(t, idx, s, ev)
	if loraID > 0 {
		// Blocks that name their adapter by id only are not indexed.
		return fmt.Sprintf("store %s rank %d %v lora id %d: skipped", s.Pod, s.Rank, id, loraID)
	}
	if parentKnown {
		if ref.lanes[id] == nil {
			ref.lanes[id] = map[uint64]string{}
		}
		for i, h := range ev.BlockHashes {
			ref.lanes[id][h] = content(m, bs, lora, p.tokens[:(start+i+1)*bs], p.img)
		}
	}
	return fmt.Sprintf("store %s rank %d %v lora %q blocks %d+%d of %d known=%v parent=%v", s.Pod, s.Rank, id, lora, start, n, bs, parentKnown, ev.HasParent)
}

// stepRemove removes one to three hashes, mostly held, from one lane.
func stepRemove(t *testing.T, rng *rand.Rand, idx *SyncPrefixHashTable, ref *reference, s Stream) string {
	lanes := ref.streamLanes(s.Pod, s.Rank)
	if len(lanes) == 0 {
		mustApply(t, idx, s, removed("GPU", 0, rng.Uint64()))
		return "remove from empty stream"
	}
	id := lanes[rng.IntN(len(lanes))]
	var held []uint64
	for h := range ref.lanes[id] {
		held = append(held, h)
	}
	var hashes []uint64
	for k := 1 + rng.IntN(3); k > 0; k-- {
		if len(held) > 0 && rng.IntN(6) > 0 {
			hashes = append(hashes, held[rng.IntN(len(held))])
		} else {
			hashes = append(hashes, rng.Uint64())
		}
	}
	group := id.group
	if group == 0 && rng.IntN(2) == 0 {
		group = kvevent.NoGroup
	}
	mustApply(t, idx, s, removed(id.medium, group, hashes...))
	for _, h := range hashes {
		delete(ref.lanes[id], h)
	}
	return fmt.Sprintf("remove %v %d hashes", id, len(hashes))
}

// compareLanes checks that each lane holds exactly the reference's engine
// hashes, and that equal contents, and only they, share a key.
func compareLanes(idx *SyncPrefixHashTable, ref *reference) error {
	keyOf := map[string]uint64{}
	contentOf := map[uint64]string{}
	got := 0
	for _, m := range *idx.models.Load() {
		for _, ln := range m.lanes {
			if ln == nil {
				continue
			}
			id := laneID{ln.stream.id.pod, ln.stream.id.rank, ln.medium, ln.group}
			want := ref.lanes[id]
			if ln.m.n != len(want) {
				return fmt.Errorf("lane %v holds %d engine hashes, reference %d", id, ln.m.n, len(want))
			}
			got += ln.m.n
			for h, c := range want {
				k, ok := ln.m.get(h)
				if !ok {
					return fmt.Errorf("lane %v lacks %s", id, c)
				}
				if prev, ok := keyOf[c]; ok && prev != k {
					return fmt.Errorf("content %s has two keys", c)
				}
				if prev, ok := contentOf[k]; ok && prev != c {
					return fmt.Errorf("key %x names %s and %s", k, prev, c)
				}
				keyOf[c], contentOf[k] = k, c
			}
		}
	}
	want := 0
	for _, l := range ref.lanes {
		want += len(l)
	}
	if got != want {
		return fmt.Errorf("index holds %d engine hashes, reference %d", got, want)
	}
	return nil
}

// checkEvictions checks what the index evicted in the step that stream
// acting took: it holds no residency the reference does not, and the
// streams other than acting that lost residencies end at one level, which
// no stream that lost none is above: each holds, after the step, no fewer
// than any stream of its model that lost none, and about as many as every
// other that lost some. Slack comes from a key held in several of a
// stream's lanes, which goes from all of them at once. It then makes the
// reference forget what the index evicted.
func checkEvictions(idx *SyncPrefixHashTable, ref *reference, models []*refModel, acting Stream) error {
	type sid struct {
		pod  string
		rank int
	}
	held, want := map[sid]int{}, map[sid]int{}
	lanes := map[laneID]*lane{}
	for _, m := range *idx.models.Load() {
		for _, ln := range m.lanes {
			if ln == nil {
				continue
			}
			id := laneID{ln.stream.id.pod, ln.stream.id.rank, ln.medium, ln.group}
			lanes[id] = ln
			held[sid{id.pod, id.rank}] += ln.m.blocks()
			for i := range ln.m.slots() {
				if h := ln.m.hash(i); ln.m.key(i) != 0 {
					if _, ok := ref.lanes[id][h]; !ok {
						return fmt.Errorf("lane %v holds hash %x, which its engine never stored there", id, h)
					}
				}
			}
		}
	}
	for id, l := range ref.lanes {
		contents := map[string]bool{}
		for _, c := range l {
			contents[c] = true
		}
		want[sid{id.pod, id.rank}] += len(contents)
	}
	const laneSlack = 3 // a stream has at most 4 lanes: two media, two groups
	for _, m := range models {
		for _, lp := range m.pods {
			for lr := 0; lr < m.ranks; lr++ {
				loser := sid{lp, lr}
				if held[loser] >= want[loser] {
					continue
				}
				for _, op := range m.pods {
					for or := 0; or < m.ranks; or++ {
						other := sid{op, or}
						switch {
						case op == acting.Pod && or == acting.Rank:
						case held[other] >= want[other] && held[loser]+laneSlack < held[other]:
							return fmt.Errorf("%v lost blocks to eviction down to %d while %v, which lost none, holds %d",
								loser, held[loser], other, held[other])
						case held[other] < want[other] && loser != (sid{acting.Pod, acting.Rank}) &&
							held[loser]+2*laneSlack < held[other]:
							return fmt.Errorf("%v lost blocks to eviction down to %d while %v lost some down to %d",
								loser, held[loser], other, held[other])
						}
					}
				}
			}
		}
	}
	for id, l := range ref.lanes {
		ln := lanes[id]
		for h := range l {
			if _, ok := ln.m.get(h); ln == nil || !ok {
				delete(l, h)
			}
		}
	}
	return nil
}

// compareMatch matches a random prefix of a pool prompt, plus a partial
// block, against every pod and an unknown one, and compares with the
// reference's answer.
func compareMatch(rng *rand.Rand, idx *SyncPrefixHashTable, ref *reference, m *refModel, lora string) error {
	p := m.prompts[rng.IntN(len(m.prompts))]
	nb := rng.IntN(len(p.tokens)/m.unit + 1)
	toks := append([]uint32{}, p.tokens[:nb*m.unit]...)
	toks = append(toks, make([]uint32, rng.IntN(m.unit))...)
	cands := append(append([]string{}, m.pods...), "ns/unknown")
	var res MatchResult
	idx.MatchPrefix(m.name, lora, toks, cands, &res)
	primary, promptBlocks := refPrimary(ref, m), 0
	if primary > 0 {
		promptBlocks = len(toks) / primary
	}
	if res.BlockSize != primary || res.PromptBlocks != promptBlocks {
		return fmt.Errorf("match %s: block size %d, %d prompt blocks, reference %d, %d",
			m.name, res.BlockSize, res.PromptBlocks, primary, promptBlocks)
	}
	for i, pod := range cands {
		want := PodMatch{Pod: pod}
		if bs, ok := m.bs[pod]; ok && refKnows(ref, pod) {
			want.BlockSize = bs
			runs := make([][2]int, m.ranks)
			bestGPU := 0
			for rank := 0; rank < m.ranks; rank++ {
				a, g := refRun(ref, m, lora, toks, pod, rank)
				runs[rank] = [2]int{a, g}
				if a > want.Blocks || a == want.Blocks && g > bestGPU {
					want.Rank, bestGPU = rank, g
				}
				want.Blocks, want.GPUBlocks = max(want.Blocks, a), max(want.GPUBlocks, g)
			}
			for rank, r := range runs {
				if rank != want.Rank {
					want.OtherRankBlocks = max(want.OtherRankBlocks, r[0])
				}
			}
			want.Tokens, want.GPUTokens = want.Blocks*bs, want.GPUBlocks*bs
		}
		if got := res.Pods[i]; got != want {
			return fmt.Errorf("match %s lora %q %d tokens: got %+v, reference %+v", m.name, lora, len(toks), got, want)
		}
	}
	return nil
}

// refKnows reports whether the reference has a lane of the pod in group 0.
func refKnows(ref *reference, pod string) bool {
	for id := range ref.lanes {
		if id.pod == pod && id.group == 0 {
			return true
		}
	}
	return false
}

// refPrimary is the block size most streams of m with a lane in group 0
// use, the smaller of equals; 0 for none.
func refPrimary(ref *reference, m *refModel) int {
	streams := map[int]map[[2]any]bool{}
	for id := range ref.lanes {
		if bs, ok := m.bs[id.pod]; ok && id.group == 0 {
			if streams[bs] == nil {
				streams[bs] = map[[2]any]bool{}
			}
			streams[bs][[2]any{id.pod, id.rank}] = true
		}
	}
	best := 0
	for bs, s := range streams {
		if len(s) > len(streams[best]) || (len(s) == len(streams[best]) && bs < best) {
			best = bs
		}
	}
	return best
}

// refRun is the number of leading blocks of the plain prompt toks, at the
// pod's block size, that one rank of the pod holds in group 0, in any
// medium and on GPU.
func refRun(ref *reference, m *refModel, lora string, toks []uint32, pod string, rank int) (anyRun, gpuRun int) {
	holds := func(c string, gpuOnly bool) bool {
		for id, l := range ref.lanes {
			if id.pod != pod || id.rank != rank || id.group != 0 || (gpuOnly && id.medium != "GPU") {
				continue
			}
			for _, lc := range l {
				if lc == c {
					return true
				}
			}
		}
		return false
	}
	bs := m.bs[pod]
	gpuDone := false
	for i := 1; i <= len(toks)/bs; i++ {
		c := content(m, bs, lora, toks[:i*bs], -1)
		if !holds(c, false) {
			break
		}
		anyRun = i
		if !gpuDone && holds(c, true) {
			gpuRun = i
		} else {
			gpuDone = true
		}
	}
	return anyRun, gpuRun
}
