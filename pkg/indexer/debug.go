package indexer

import (
	"cmp"
	"slices"
	"time"
)

// ModelStats describes what the index holds for one model.
type ModelStats struct {
	Model string `json:"model"`
	// BlockSize is the model's primary block size (see
	// MatchResult.BlockSize), 0 when no engine holds a block of it.
	BlockSize int `json:"blockSize"`
	// BlockSizes are the block sizes of the model's engines, ascending:
	// more than one when engines of one model were configured apart, each
	// then matched at its own.
	BlockSizes []int `json:"blockSizes"`
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
// KV-cache group, and their size in tokens.
type LaneStats struct {
	Medium    string `json:"medium"`
	Group     int    `json:"group"`
	BlockSize int    `json:"blockSize"`
	Blocks    int    `json:"blocks"`
}

// Stats returns a snapshot of the index for operators: per model, its pods,
// their streams and the blocks each holds per medium and group, sorted by
// name. It never waits for a writer: it reads counts the writers publish as
// they go, each as of the writer's last event, taking only the registry
// lock, which no one holds while waiting for a model's writer.
func (t *SyncPrefixHashTable) Stats() []ModelStats {
	type modelStreams struct {
		m       *modelTable
		streams []*stream
	}
	t.mu.Lock()
	models := make([]modelStreams, 0, len(*t.models.Load()))
	for _, m := range *t.models.Load() {
		ms := modelStreams{m: m, streams: make([]*stream, 0, len(m.streams))}
		for st := range m.streams {
			ms.streams = append(ms.streams, st)
		}
		models = append(models, ms)
	}
	t.mu.Unlock()
	out := make([]ModelStats, 0, len(models))
	for _, ms := range models {
		out = append(out, ms.m.stats(ms.streams))
	}
	slices.SortFunc(out, func(a, b ModelStats) int { return cmp.Compare(a.Model, b.Model) })
	return out
}

// stats describes m and the given streams of it from what writers publish.
func (m *modelTable) stats(streams []*stream) ModelStats {
	idx := m.pods.Load()
	ms := ModelStats{Model: m.name, BlockSize: idx.primary, BlockSizes: []int{}, Entries: int(m.keys.count.Load())}
	for _, s := range idx.sizes {
		ms.BlockSizes = append(ms.BlockSizes, s.blockSize)
	}
	pods := map[*podState][]StreamStats{}
	for _, st := range streams {
		ss := StreamStats{Rank: st.id.rank, LastEvent: time.Unix(0, st.lastEvent.Load())}
		if lanes := st.view.Load(); lanes != nil {
			for _, ln := range *lanes {
				ss.Lanes = append(ss.Lanes, LaneStats{Medium: ln.medium, Group: ln.group,
					BlockSize: int(ln.blockSize.Load()), Blocks: int(ln.blocks.Load())})
			}
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
