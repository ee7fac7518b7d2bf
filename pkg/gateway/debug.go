package gateway

import (
	"cmp"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/pkg/indexer"
	"github.com/kvgate/kvgate/pkg/kvevent/manager"
	"github.com/kvgate/kvgate/pkg/tokenizer"
)

// kvCacheView is the answer of GET /debug/kvcache: what the prefix index
// holds and how the KV event streams feeding it are doing, per model.
type kvCacheView struct {
	KVEventSync bool        `json:"kvEventSync"`
	Models      []modelView `json:"models"`
	// Tokenizers are the models tokenized in process and the state of
	// each form: active, or why the engines tokenize it.
	Tokenizers []tokenizer.LocalModel `json:"tokenizers,omitempty"`
}

// modelView is one model's share of the index and its pods.
type modelView struct {
	Model string `json:"model"`
	// BlockSize is the engines' block size in tokens (the one most of
	// them use), 0 when no engine holds a block of the model; BlockSizes
	// lists every size its engines use, each pod being matched at its
	// own; Entries the distinct blocks indexed.
	BlockSize  int       `json:"blockSize"`
	BlockSizes []int     `json:"blockSizes"`
	Entries    int       `json:"entries"`
	Pods       []podView `json:"pods"`
}

// podView is one pod: what the KV event manager does with it and the
// blocks the index holds for it.
type podView struct {
	Pod string `json:"pod"`
	// State is the manager's (followed, ineligible, failed), with the
	// reason a pod is ineligible and the error a failed one met; "" when
	// the manager no longer knows the pod while the index still holds
	// blocks of it.
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
	Error  string `json:"error,omitempty"`
	// Blocks counts the pod's resident blocks by medium (GPU, CPU, ...),
	// over its ranks, in KV-cache group 0, the group prefixes are matched
	// in.
	Blocks map[string]int `json:"blocks"`
	// LastMatch is when a routing match last credited the pod.
	LastMatch *time.Time `json:"lastMatch,omitempty"`
	// Liveness is how a followed pod stands: absent for a pod not
	// followed, or not judged yet.
	Liveness *livenessView `json:"liveness,omitempty"`
	Ranks    []rankView    `json:"ranks"`
}

// livenessView is a followed pod's liveness (manager.PodLiveness).
type livenessView struct {
	// State is live, or dead once none of its streams was connected and
	// no scrape succeeded for KVGATE_KV_EVENTS_DEAD_POD_TIMEOUT: its blocks
	// were purged and its streams restarted.
	State string `json:"state"`
	// EventsDownSeconds is how long none of the pod's streams has been
	// connected, absent while one is; LastScrapeAgeSeconds the time since
	// its last successful metrics scrape, absent if none succeeded;
	// DeadForSeconds how long it has been dead, absent while live.
	EventsDownSeconds    *float64 `json:"eventsDownSeconds,omitempty"`
	LastScrapeAgeSeconds *float64 `json:"lastScrapeAgeSeconds,omitempty"`
	DeadForSeconds       *float64 `json:"deadForSeconds,omitempty"`
}

// rankView is one data-parallel rank's stream.
type rankView struct {
	Rank int `json:"rank"`
	// Lanes are the blocks the rank holds per medium and group.
	Lanes []indexer.LaneStats `json:"lanes"`
	// LastEventAgeSeconds is the time since the index applied the
	// stream's last batch (or first saw the stream); absent when the index
	// holds nothing of it.
	LastEventAgeSeconds *float64 `json:"lastEventAgeSeconds,omitempty"`
	// Client is the state of the stream's subscription, absent when the
	// manager does not follow it.
	Client *clientView `json:"client,omitempty"`
}

// clientView is what an operator reads of a stream's ZMQ client.
type clientView struct {
	PubEndpoint    string `json:"pubEndpoint"`
	ReplayEndpoint string `json:"replayEndpoint,omitempty"`
	// Topic is the subscription's topic (in bind mode, the topic the
	// engine must send); PublisherTopic is the engine's, as its replay
	// replies name it (vLLM v0.26 and later), absent until one did.
	Topic          string    `json:"topic"`
	PublisherTopic *string   `json:"publisherTopic,omitempty"`
	Since          time.Time `json:"since"`
	Connected      bool      `json:"connected"`
	// LastSeq is the seq of the last batch delivered, absent before the
	// first.
	LastSeq           *uint64 `json:"lastSeq,omitempty"`
	Batches           uint64  `json:"batches"`
	ReplayedBatches   uint64  `json:"replayedBatches"`
	ReplayFailures    uint64  `json:"replayFailures"`
	UnrecoverableGaps uint64  `json:"unrecoverableGaps"`
	MissedBatches     uint64  `json:"missedBatches"`
	PublisherRestarts uint64  `json:"publisherRestarts"`
	DecodeErrors      uint64  `json:"decodeErrors"`
	// TopicMismatch is set while batches arrive only through replay
	// because the topic filters out the live messages
	// (transport.ClientStats.TopicMismatch).
	TopicMismatch bool `json:"topicMismatch"`
	// JoinedAtSeq is the seq the stream began with when its engine no
	// longer had (or never sent) the batches before it; absent when it
	// began at 0.
	JoinedAtSeq *uint64 `json:"joinedAtSeq,omitempty"`
	// LastHeardAgeSeconds is the time since the engine was last heard
	// from, a live batch or a replay reply; absent before the first.
	LastHeardAgeSeconds *float64 `json:"lastHeardAgeSeconds,omitempty"`
	Disconnections      uint64   `json:"disconnections"`
	// DroppedMessages, ReplaysCut and Suspended show the stream holding
	// its engine to its bounds (transport.ClientStats).
	DroppedMessages uint64 `json:"droppedMessages"`
	ReplaysCut      uint64 `json:"replaysCut"`
	Suspended       bool   `json:"suspended"`
}

// serveKVCache answers GET /debug/kvcache.
func (g *Gateway) serveKVCache(w http.ResponseWriter, r *http.Request) {
	if !allowMethod(w, r, http.MethodGet) || g.readyOr503(w) == nil {
		return
	}
	v := kvCacheView{KVEventSync: g.manager != nil, Models: []modelView{}}
	if g.tokenizer != nil {
		v.Tokenizers = g.tokenizer.LocalModels()
	}
	if g.manager != nil {
		v.Models = buildKVCacheView(g.index.Stats(), g.manager.Snapshot(), time.Now())
	}
	writeJSON(w, v)
}

// buildKVCacheView merges the index's statistics with the manager's pods,
// by model and pod, sorted by name.
func buildKVCacheView(stats []indexer.ModelStats, pods []manager.PodStatus, now time.Time) []modelView {
	b := viewBuilder{models: map[string]*modelView{}, pods: map[[2]string]*podView{}, order: map[string][]*podView{}}
	for _, ms := range stats {
		m := b.model(ms.Model)
		m.BlockSize, m.BlockSizes, m.Entries = ms.BlockSize, ms.BlockSizes, ms.Entries
		for _, ps := range ms.Pods {
			p := b.pod(ms.Model, ps.Pod)
			if !ps.LastMatch.IsZero() {
				p.LastMatch = &ps.LastMatch
			}
			for _, ss := range ps.Streams {
				rk := p.rank(ss.Rank)
				rk.Lanes = ss.Lanes
				age := now.Sub(ss.LastEvent).Seconds()
				rk.LastEventAgeSeconds = &age
				for _, l := range ss.Lanes {
					if l.Group == 0 {
						p.Blocks[l.Medium] += l.Blocks
					}
				}
			}
		}
	}
	for _, ps := range pods {
		p := b.pod(ps.Model, ps.Pod)
		p.State, p.Reason, p.Error = ps.State, string(ps.Reason), ps.Error
		if l := ps.Liveness; l != nil {
			p.Liveness = &livenessView{State: l.State, EventsDownSeconds: secondsSince(l.EventsDownSince, now),
				LastScrapeAgeSeconds: secondsSince(l.LastScraped, now), DeadForSeconds: secondsSince(l.DeadSince, now)}
		}
		for _, st := range ps.Streams {
			p.rank(st.Stream.DPRank).Client = newClientView(st, now)
		}
	}
	return b.sorted()
}

// secondsSince returns the seconds from t to now, nil for the zero time.
func secondsSince(t, now time.Time) *float64 {
	if t.IsZero() {
		return nil
	}
	s := now.Sub(t).Seconds()
	return &s
}

func newClientView(st manager.StreamStatus, now time.Time) *clientView {
	s := st.Stats
	c := &clientView{PubEndpoint: st.PubEndpoint, ReplayEndpoint: st.ReplayEndpoint, Topic: st.Topic, Since: st.Since,
		Connected: s.Connected, Batches: s.BatchesReceived, ReplayedBatches: s.ReplayedBatches,
		ReplayFailures: s.ReplayFailures, UnrecoverableGaps: s.UnrecoverableGaps, MissedBatches: s.MissedBatches,
		PublisherRestarts: s.PublisherRestarts, DecodeErrors: s.DecodeErrors, TopicMismatch: s.TopicMismatch,
		Disconnections: s.Disconnections, DroppedMessages: s.DroppedMessages, ReplaysCut: s.ReplaysCut,
		Suspended: s.Suspended}
	if s.JoinedAtSeq > 0 {
		seq := s.JoinedAtSeq
		c.JoinedAtSeq = &seq
	}
	c.LastHeardAgeSeconds = secondsSince(s.LastHeardTime, now)
	if s.BatchesReceived > 0 {
		seq := s.LastSeq
		c.LastSeq = &seq
	}
	if s.PublisherTopicKnown {
		topic := s.PublisherTopic
		c.PublisherTopic = &topic
	}
	return c
}

// viewBuilder collects models and pods by name.
type viewBuilder struct {
	models map[string]*modelView
	pods   map[[2]string]*podView
	// order keeps the pods of each model.
	order map[string][]*podView
}

func (b *viewBuilder) model(name string) *modelView {
	m, ok := b.models[name]
	if !ok {
		m = &modelView{Model: name, BlockSizes: []int{}, Pods: []podView{}}
		b.models[name] = m
	}
	return m
}

func (b *viewBuilder) pod(model, key string) *podView {
	b.model(model)
	p, ok := b.pods[[2]string{model, key}]
	if !ok {
		p = &podView{Pod: key, Blocks: map[string]int{}, Ranks: []rankView{}}
		b.pods[[2]string{model, key}] = p
		b.order[model] = append(b.order[model], p)
	}
	return p
}

func (p *podView) rank(r int) *rankView {
	for i := range p.Ranks {
		if p.Ranks[i].Rank == r {
			return &p.Ranks[i]
		}
	}
	p.Ranks = append(p.Ranks, rankView{Rank: r, Lanes: []indexer.LaneStats{}})
	return &p.Ranks[len(p.Ranks)-1]
}

// sorted returns the models, their pods and ranks in name order.
func (b *viewBuilder) sorted() []modelView {
	out := make([]modelView, 0, len(b.models))
	for name, m := range b.models {
		for _, p := range b.order[name] {
			slices.SortFunc(p.Ranks, func(a, b rankView) int { return cmp.Compare(a.Rank, b.Rank) })
			m.Pods = append(m.Pods, *p)
		}
		slices.SortFunc(m.Pods, func(a, b podView) int { return cmp.Compare(a.Pod, b.Pod) })
		out = append(out, *m)
	}
	slices.SortFunc(out, func(a, b modelView) int { return cmp.Compare(a.Model, b.Model) })
	return out
}

// storedResponseView is the answer of GET /debug/responses/{id}: the
// engine the gateway recorded as the maker of a Responses API response,
// and whether requests for it reach that engine.
type storedResponseView struct {
	ID string `json:"id"`
	// Pod, UID and Address name the engine that made the response; Model
	// is the model its request named.
	Pod     string `json:"pod"`
	UID     string `json:"uid"`
	Address string `json:"address"`
	Model   string `json:"model"`
	// Result is what a request for the response meets now: owner (it is
	// sent to that engine) or gone (that engine no longer serves the
	// model).
	Result string `json:"result"`
}

// serveStoredResponseDebug answers GET /debug/responses/{id} with the
// gateway's record of the response id, 404 when it has none.
func (g *Gateway) serveStoredResponseDebug(w http.ResponseWriter, r *http.Request) {
	b := g.readyOr503(w)
	if b == nil || !allowMethod(w, r, http.MethodGet) {
		return
	}
	id := strings.TrimPrefix(r.URL.Path, "/debug/responses/")
	o, ok := g.stored.lookup(id)
	if !ok || id == "" {
		writeError(w, http.StatusNotFound, typeNotFound, codeNotFound, "",
			"the gateway has no record of the response "+strconv.Quote(id))
		return
	}
	v := storedResponseView{ID: id, Pod: o.pod.String(), UID: string(o.uid), Address: o.address, Model: o.model, Result: storedGone}
	if pods, err := b.store.ListPodsByModel(o.model); err == nil && slices.ContainsFunc(pods, o.is) {
		v.Result = storedOwner
	}
	writeJSON(w, v)
}
