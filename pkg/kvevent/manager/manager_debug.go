package manager

import (
	"cmp"
	"slices"
	"time"

	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/kvevent/transport"
)

// PodStatus describes what a KVEventManager does with one pod, for
// operators (the gateway's /debug/kvcache).
type PodStatus struct {
	Pod   string `json:"pod"`
	Model string `json:"model,omitempty"`
	// State is PodStateFollowed, PodStateIneligible or PodStateFailed
	// (its streams could not start; retried with backoff).
	State string `json:"state"`
	// Reason tells why an ineligible pod is not followed.
	Reason IneligibleReason `json:"reason,omitempty"`
	// Error explains an invalid configuration or a failure to start.
	Error string `json:"error,omitempty"`
	// Target is how a followed pod is followed.
	Target *PodTarget `json:"target,omitempty"`
	// Streams are the followed pod's streams, by rank.
	Streams []StreamStatus `json:"streams,omitempty"`
	// Liveness is how the followed pod stands as the liveness check last
	// judged it; nil before its first judgement and for pods not
	// followed.
	Liveness *PodLiveness `json:"liveness,omitempty"`
}

// StreamStatus describes one followed stream.
type StreamStatus struct {
	Stream kvevent.StreamID `json:"stream"`
	// PubEndpoint and ReplayEndpoint are the engine's sockets the stream
	// reads ("" replay: disabled). In bind mode PubEndpoint is the
	// gateway's bound endpoint.
	PubEndpoint    string `json:"pubEndpoint"`
	ReplayEndpoint string `json:"replayEndpoint,omitempty"`
	// Topic is the SUB filter of a dialled stream, or the topic a bound
	// stream expects its engine to publish with (kv@<ip>:<port>@<model>,
	// port being the engine's HTTP port).
	Topic string `json:"topic"`
	// Since is when the manager started following the stream.
	Since time.Time `json:"since"`
	// LastEventAge is how long ago the last batch was delivered; 0 before
	// the first.
	LastEventAge time.Duration `json:"lastEventAgeNanos,omitempty"`
	// Stats are the stream's counters: connection, last seq, replays,
	// gaps, resets.
	Stats transport.ClientStats `json:"stats"`
}

// Snapshot returns the state of every pod the manager knows, sorted by pod
// key. It takes no lock while reading the streams' counters.
func (m *KVEventManager) Snapshot() []PodStatus {
	m.mu.Lock()
	out := make([]PodStatus, 0, len(m.states))
	followed := make([][]*followedStream, 0, len(m.states))
	for key, st := range m.states {
		ps := PodStatus{Pod: key, Model: st.model, State: st.state(), Reason: st.reason}
		if st.err != nil {
			ps.Error = st.err.Error()
		}
		if len(st.streams) > 0 {
			t := st.target
			ps.Target = &t
			ps.Liveness = m.podLivenessOf(key, t)
		}
		out = append(out, ps)
		followed = append(followed, st.streams)
	}
	m.mu.Unlock()
	now := time.Now()
	for i, streams := range followed {
		for _, s := range streams {
			ss := StreamStatus{Stream: s.id, PubEndpoint: s.pubEndpoint, ReplayEndpoint: s.replayEndpoint,
				Topic: s.topic, Since: s.since, Stats: s.stats.Stats()}
			if !ss.Stats.LastEventTime.IsZero() {
				ss.LastEventAge = now.Sub(ss.Stats.LastEventTime)
			}
			out[i].Streams = append(out[i].Streams, ss)
		}
	}
	slices.SortFunc(out, func(a, b PodStatus) int { return cmp.Compare(a.Pod, b.Pod) })
	return out
}
