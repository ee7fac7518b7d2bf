package routingbench

import (
	"cmp"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"

	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/indexer"
	"github.com/kvgate/kvgate/pkg/inflight"
	"github.com/kvgate/kvgate/pkg/sim"
)

// The pods' namespace and the model they serve.
const (
	benchNamespace = "bench"
	benchModel     = "bench-model"
)

// simEpoch is virtual time zero: a fixed instant, so that event batches
// carry the same timestamps in every run.
var simEpoch = time.Unix(1_800_000_000, 0)

// engine is one simulated engine, its pod, and what the gateway knows and
// the benchmark tallies of it.
type engine struct {
	index int
	eng   *sim.Engine
	// speed is the engine's speed relative to the configured model's.
	speed float64
	// link decides when, and whether, each event batch reaches the index.
	link    *sim.EventLink
	pod     *endpoint.Endpoint
	key     string // the pod's ID, "namespace/name"
	stream  indexer.Stream
	busy    bool
	stepEnd time.Duration
	// inFlight counts the requests the gateway sent and has not seen
	// finish (the Store's realtime running requests).
	inFlight int
	// load is the engine's load record in the request ledger of a router
	// policy: its prefill queue.
	load     *inflight.PodLoad
	counters counters
	metrics  scraped

	routed                      int
	promptTokens, prefillTokens int64
	busyTime                    time.Duration
	preemptions                 int
	lostBatches                 int
}

// fleet is the engines, their pods and the index, on one virtual clock.
type fleet struct {
	now     time.Duration
	engines []*engine
	byName  map[string]*engine
	index   *indexer.SyncPrefixHashTable
	// cachedPredicted sums the prompt tokens routing predicted cached on
	// the engines the requests went to, cachedFound the part of them the
	// engines found (see PolicyResult.PredictedHitsFound).
	cachedPredicted, cachedFound float64
}

// clock returns the virtual time as a time.Time.
func (f *fleet) clock() time.Time { return simEpoch.Add(f.now) }

// newFleet builds cfg.Engines idle engines with empty caches and an empty
// index; cfg is defaulted and valid.
func newFleet(cfg Config) (*fleet, error) {
	index, err := indexer.NewSyncPrefixHashTable(indexer.Config{}, nil)
	if err != nil {
		return nil, err
	}
	f := &fleet{byName: make(map[string]*engine, cfg.Engines), index: index}
	for i := range cfg.Engines {
		ec := cfg.Engine
		ec.HashSeed = fmt.Sprint("engine-", i)
		ec.DataParallelRank = 0
		ec.Events = true
		speed := engineSpeed(cfg, i)
		ec.Latency.Speed = cmp.Or(ec.Latency.Speed, 1) * speed
		eng, err := sim.NewEngine(ec)
		if err != nil {
			return nil, fmt.Errorf("engine %d: %w", i, err)
		}
		link, err := sim.NewEventLink(cfg.Events, splitmixSeed(cfg.Seed, uint64(i)))
		if err != nil {
			return nil, fmt.Errorf("engine %d: %w", i, err)
		}
		pod := endpoint.Parse(benchPod(i), endpoint.Options{})
		e := &engine{index: i, eng: eng, speed: speed, link: link, pod: pod, key: pod.ID,
			stream: indexer.Stream{Pod: pod.ID, Model: benchModel}, load: inflight.NewPodLoad(pod.ID)}
		e.metrics.window.length = cfg.MetricsWindow
		e.metrics.prefillWindow.length = cfg.PrefillSpeedWindow
		f.engines = append(f.engines, e)
		f.byName[pod.Key.Name] = e
	}
	return f, nil
}

// engineSpeed returns engine i's speed relative to cfg's engine model.
func engineSpeed(cfg Config, i int) float64 {
	if len(cfg.Speeds) == 0 {
		return 1
	}
	return cfg.Speeds[i%len(cfg.Speeds)]
}

// splitmixSeed derives the seed of stream i from seed.
func splitmixSeed(seed, i uint64) uint64 {
	_, out := splitmix64(seed ^ (i+1)*0x9e3779b97f4a7c15)
	return out
}

// benchPod returns the Running, Ready pod of engine i.
func benchPod(i int) *v1.Pod {
	name := fmt.Sprint("engine-", i)
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: benchNamespace, Name: name, UID: k8stypes.UID("uid-" + name),
			Labels: map[string]string{endpoint.ModelNameLabel: benchModel},
		},
		Status: v1.PodStatus{
			Phase: v1.PodRunning, PodIP: fmt.Sprintf("10.0.%d.%d", i/250, i%250+1),
			Conditions: []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue}},
		},
	}
}
