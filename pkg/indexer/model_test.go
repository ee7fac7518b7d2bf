package indexer

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvgate/kvgate/pkg/kvevent"
)

// The model-based test drives the index with random interleavings of stored,
// removed, cleared, reset and purge events across pods, ranks, media, groups,
// models and adapters, and after every step compares it with a reference
// that just remembers, per lane, which engine hash names which content.

// refPrompt is a prompt of the pool engines store and routers ask about.
// Prompts are derived from each other so that they share prefixes; img is
// the block carrying a multimodal item, -1 for none.
type refPrompt struct {
	tokens []uint32
	img    int
}

type refModel struct {
	name      string
	blockSize int
	pods      []string
	ranks     int
	prompts   []refPrompt
}

type laneID struct {
	pod    string
	rank   int
	medium string
	group  int
}

// reference is the model of what each lane holds: engine hash -> content,
// where content is a readable string naming model, adapter, tokens and
// multimodal items of the whole prefix.
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

// content names the prefix of n blocks of prompt p stored with an adapter;
// plain omits multimodal items, as a router's prompt does.
func content(m *refModel, lora string, p refPrompt, n int, plain bool) string {
	s := fmt.Sprintf("%s|%s|%v", m.name, lora, p.tokens[:n*m.blockSize])
	if !plain && p.img >= 0 && p.img < n {
		s += fmt.Sprintf("|img@%d", p.img)
	}
	return s
}

// engineHash is how an engine with a given seed names content.
func engineHash(seed uint64, content string) uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%s", seed, content)
	return h.Sum64()
}

func newRefModel(rng *rand.Rand, name string, bs, ranks int, pods ...string) *refModel {
	m := &refModel{name: name, blockSize: bs, pods: pods, ranks: ranks}
	for i := 0; i < 24; i++ {
		nb := 2 + rng.IntN(7)
		if rng.IntN(4) == 0 {
			// Long enough for a match to walk several batches.
			nb += rng.IntN(40)
		}
		toks := make([]uint32, 0, nb*bs)
		img, cut := -1, 0
		if i > 0 && rng.IntN(4) > 0 {
			parent := m.prompts[rng.IntN(len(m.prompts))]
			cut = rng.IntN(min(nb, len(parent.tokens)/bs) + 1)
			toks = append(toks, parent.tokens[:cut*bs]...)
			if parent.img < cut {
				img = parent.img
			}
		}
		for len(toks) < nb*bs {
			toks = append(toks, uint32(rng.IntN(50)))
		}
		if img < 0 && cut < nb && rng.IntN(5) == 0 {
			img = cut + rng.IntN(nb-cut)
		}
		m.prompts = append(m.prompts, refPrompt{toks, img})
	}
	return m
}

func TestModelBasedRandomInterleavings(t *testing.T) {
	for _, sharedSeed := range []bool{true, false} {
		for _, release := range []struct {
			name  string
			ratio int
		}{{"lookup", 0}, {"sweep", math.MaxInt32}} {
			for seed := uint64(1); seed <= 6; seed++ {
				name := fmt.Sprintf("sharedEngineSeed=%v/release=%s/seed=%d", sharedSeed, release.name, seed)
				t.Run(name, func(t *testing.T) {
					runModelBased(t, seed, sharedSeed, release.ratio, 600)
				})
			}
		}
	}
}

// runModelBased runs steps random steps against a reference; sweepRatio
// makes releases look up each key (0) or sweep the tables (MaxInt32).
func runModelBased(t *testing.T, seed uint64, sharedSeed bool, sweepRatio, steps int) {
	rng := rand.New(rand.NewPCG(seed, 42))
	idx, _ := newTestTable(t, Config{})
	idx.sweepRatio = sweepRatio
	models := []*refModel{
		newRefModel(rng, "m1", 4, 2, "ns/p0", "ns/p1", "ns/p2"),
		newRefModel(rng, "m2", 8, 1, "ns/p3", "ns/p4"),
	}
	ref := &reference{lanes: map[laneID]map[uint64]string{}, model: map[string]*refModel{}}
	for _, m := range models {
		for _, p := range m.pods {
			ref.model[p] = m
		}
	}
	engineSeed := func(pod string, rank int) uint64 {
		if sharedSeed {
			return 7
		}
		return engineHash(uint64(rank), pod)
	}
	loras := []string{"", "", "a1", "a2"}
	for step := 0; step < steps; step++ {
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
		case op < 96:
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
	nb := len(p.tokens) / m.blockSize
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
	refLora := lora
	if lora == "" && rng.IntN(8) == 0 {
		loraID, refLora = 5, "#5"
	}
	ev := &kvevent.BlockStoredEvent{
		TokenIDs: p.tokens[start*m.blockSize : (start+n)*m.blockSize], BlockSize: m.blockSize,
		Medium: id.medium, GroupIdx: group, LoraName: lora, LoraID: loraID,
	}
	if rng.IntN(4) == 0 {
		id.medium, ev.Medium = "GPU", ""
	}
	for i := start; i < start+n; i++ {
		ev.BlockHashes = append(ev.BlockHashes, engineHash(eseed, content(m, refLora, p, i+1, false)))
		img := ""
		if i == p.img {
			img = fmt.Sprintf("img-%d", p.tokens[i*m.blockSize])
		}
		ev.ExtraKeys = append(ev.ExtraKeys, msgpackExtras(lora, img))
	}
	parentKnown := true
	if start > 0 {
		ev.HasParent = true
		ev.ParentBlockHash = engineHash(eseed, content(m, refLora, p, start, false))
		if rng.IntN(10) == 0 {
			ev.ParentBlockHash = rng.Uint64()
		}
		parentKnown = false
		for _, l := range ref.streamLanes(s.Pod, s.Rank) {
			if _, ok := ref.lanes[l][ev.ParentBlockHash]; ok {
				parentKnown = true
			}
		}
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
			ref.lanes[id][h] = content(m, refLora, p, start+i+1, false)
		}
	}
	return fmt.Sprintf("store %s rank %d %v lora %q blocks %d+%d known=%v", s.Pod, s.Rank, id, refLora, start, n, parentKnown)
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
				return fmt.Errorf("lane %v holds %d blocks, reference %d", id, ln.m.n, len(want))
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
		return fmt.Errorf("index holds %d residencies, reference %d", got, want)
	}
	return nil
}

// compareMatch matches a random prefix of a pool prompt, plus a partial
// block, against every pod and an unknown one, and compares with the
// reference's answer.
func compareMatch(rng *rand.Rand, idx *SyncPrefixHashTable, ref *reference, m *refModel, lora string) error {
	p := m.prompts[rng.IntN(len(m.prompts))]
	nb := rng.IntN(len(p.tokens)/m.blockSize + 1)
	toks := append([]uint32{}, p.tokens[:nb*m.blockSize]...)
	toks = append(toks, make([]uint32, rng.IntN(m.blockSize))...)
	cands := append(append([]string{}, m.pods...), "ns/unknown")
	var res MatchResult
	idx.MatchPrefix(m.name, lora, toks, cands, &res)
	if _, known := idx.BlockSize(m.name); !known {
		nb = 0
	}
	for i, pod := range cands {
		wantAny, wantGPU := 0, 0
		for rank := 0; rank < m.ranks; rank++ {
			a, g := refRun(ref, m, lora, p, nb, pod, rank)
			wantAny, wantGPU = max(wantAny, a), max(wantGPU, g)
		}
		if got := res.Pods[i]; got.Pod != pod || got.Blocks != wantAny || got.GPUBlocks != wantGPU {
			return fmt.Errorf("match %s lora %q %d blocks: pod %s got %d/%d GPU, reference %d/%d",
				m.name, lora, nb, pod, got.Blocks, got.GPUBlocks, wantAny, wantGPU)
		}
	}
	return nil
}

// refRun is the number of leading blocks of the plain prompt that one rank of
// a pod holds in group 0, in any medium and on GPU.
func refRun(ref *reference, m *refModel, lora string, p refPrompt, nb int, pod string, rank int) (anyRun, gpuRun int) {
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
	gpuDone := false
	for i := 1; i <= nb; i++ {
		c := content(m, lora, p, i, true)
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
