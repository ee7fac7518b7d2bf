package indexer

import (
	"cmp"
	"slices"
	"time"
)

// ModelStats describes what the index holds for one model.
type ModelStats struct {
	Model string `json:"model"`
	// BlockSize is the block size routers chunk prompts by, 0 when unknown.
	BlockSize int `json:"blockSize"`
	// Entries is the number of distinct blocks (prefix keys) indexed.
	Entries int        `json:"entries"`
	Pods    []PodStats `json:"pods"`
}

// PodStats describes one pod's share of a model's index.
type PodStats struct {
	Pod string `json:"pod"`
	// LastMatch is when a match last credited the pod, zero if never.
	LastMatch time.Time     `json:"lastMatch"`
	Streams   []StreamStats `json:"streams"`
}

// StreamStats describes one publisher (a DP rank) of a pod.
type StreamStats struct {
	Rank int `json:"rank"`
	// LastEvent is when the index last applied a batch of the stream, or
	// when it first saw the stream.
	LastEvent time.Time   `json:"lastEvent"`
	Lanes     []LaneStats `json:"lanes"`
}

// LaneStats is the number of blocks a stream holds in one medium and
// KV-cache group.
type LaneStats struct {
	Medium string `json:"medium"`
	Group  int    `json:"group"`
	Blocks int    `json:"blocks"`
}

// Stats returns a snapshot of the index for operators: per model, its pods,
// their streams and the blocks each holds per medium and group, sorted by
// name. It briefly takes each model's writer lock, never blocking matches.
func (t *SyncPrefixHashTable) Stats() []ModelStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []ModelStats
	for _, m := range *t.models.Load() {
		out = append(out, m.stats())
	}
	slices.SortFunc(out, func(a, b ModelStats) int { return cmp.Compare(a.Model, b.Model) })
	return out
}

// stats describes m; SyncPrefixHashTable.mu is held.
func (m *modelTable) stats() ModelStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	ms := ModelStats{Model: m.name, BlockSize: int(m.blockSize.Load()), Entries: m.keys.n}
	pods := map[*podState][]StreamStats{}
	for st := range m.streams {
		ss := StreamStats{Rank: st.id.rank, LastEvent: time.Unix(0, st.lastEvent.Load())}
		for _, ln := range st.lanes {
			ss.Lanes = append(ss.Lanes, LaneStats{Medium: ln.medium, Group: ln.group, Blocks: ln.m.n})
		}
		slices.SortFunc(ss.Lanes, func(a, b LaneStats) int {
			return cmp.Or(cmp.Compare(a.Medium, b.Medium), cmp.Compare(a.Group, b.Group))
		})
		pods[st.pod] = append(pods[st.pod], ss)
	}
	for ps, streams := range pods {
		slices.SortFunc(streams, func(a, b StreamStats) int { return cmp.Compare(a.Rank, b.Rank) })
		p := PodStats{Pod: ps.name, Streams: streams}
		if lm := ps.lastMatch.Load(); lm != 0 {
			p.LastMatch = time.Unix(0, lm)
		}
		ms.Pods = append(ms.Pods, p)
	}
	slices.SortFunc(ms.Pods, func(a, b PodStats) int { return cmp.Compare(a.Pod, b.Pod) })
	return ms
}
