package indexer

import (
	"errors"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/pkg/kvevent"
)

// Reasons of the evicted and skipped block counters.
const (
	// reasonCapacity: the model reached MaxPrefixesPerContext.
	reasonCapacity = "capacity"
	// reasonTotal: the index reached MaxPrefixes.
	reasonTotal = "total_capacity"
	// reasonContext: the model was dropped to respect MaxContexts.
	reasonContext = "context_capacity"
	// reasonIdle: the pod sent nothing and matched nothing for
	// EvictionDuration.
	reasonIdle = "idle_pod"
	// reasonBlockSize: an engine's blocks came with another block size, so
	// its blocks of the old size are gone.
	reasonBlockSize = "block_size_changed"

	// reasonParent: the event's parent block was never indexed.
	reasonParent = "unknown_parent"
	// reasonTokens: the event's tokens do not align to its blocks.
	reasonTokens = "token_mismatch"
	// reasonExtraKeys: the event's extra keys are not one list per block.
	reasonExtraKeys = "extra_keys_mismatch"
	// reasonLoraID: the blocks name their LoRA adapter by the engine's id
	// only, which no request names.
	reasonLoraID = "lora_id_only"
	// reasonNameLimit: the block is one the lane holds under
	// maxNamesPerBlock other engine hashes.
	reasonNameLimit = "name_limit"
	// reasonLaneLimit: the blocks' medium and group would be a lane past
	// maxLanesPerStream, and every lane of the stream holds blocks.
	reasonLaneLimit = "lane_limit"
)

// metrics are the index's Prometheus metrics. Counters and the match
// histogram are updated where things happen; the gauges are read from the
// index when scraped, so they cost nothing on hot paths and vanish with the
// pods and models they describe.
type metrics struct {
	t            *SyncPrefixHashTable
	evictedVec   *prometheus.CounterVec
	skippedVec   *prometheus.CounterVec
	parentMisses prometheus.Counter
	matchSeconds prometheus.Histogram

	entriesDesc  *prometheus.Desc
	podsDesc     *prometheus.Desc
	streamsDesc  *prometheus.Desc
	residentDesc *prometheus.Desc
}

func newMetrics(t *SyncPrefixHashTable) *metrics {
	return &metrics{
		t: t,
		evictedVec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kvgate", Subsystem: "indexer", Name: "evicted_blocks_total",
			Help: "Residencies (block, holder) the index removed on its own, by reason: capacity, total_capacity, context_capacity, idle_pod, block_size_changed.",
		}, []string{"reason"}),
		skippedVec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kvgate", Subsystem: "indexer", Name: "skipped_blocks_total",
			Help: "Stored blocks not indexed, by reason: unknown_parent, token_mismatch, extra_keys_mismatch, lora_id_only, lane_limit, name_limit.",
		}, []string{"reason"}),
		parentMisses: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "kvgate", Subsystem: "indexer", Name: "parent_misses_total",
			Help: "BlockStored events skipped because the index never saw their parent block.",
		}),
		matchSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "kvgate", Subsystem: "indexer", Name: "match_duration_seconds",
			Help:    "Time to match one prompt against the prefix index, hashing the prompt's blocks included.",
			Buckets: prometheus.ExponentialBuckets(1e-6, 2, 16),
		}),
		entriesDesc: prometheus.NewDesc("kvgate_indexer_entries",
			"Distinct blocks (prefix keys) indexed for a model.", []string{"model"}, nil),
		podsDesc: prometheus.NewDesc("kvgate_indexer_pods",
			"Pods with event streams for a model.", []string{"model"}, nil),
		streamsDesc: prometheus.NewDesc("kvgate_indexer_block_size_streams",
			"Engine streams (a pod's data-parallel ranks) holding blocks of a model's primary KV-cache group, by block size in tokens; a model with more than one block_size is matched at each pod's own.",
			[]string{"model", "block_size"}, nil),
		residentDesc: prometheus.NewDesc("kvgate_indexer_resident_blocks",
			"Blocks a pod holds in a medium (GPU, CPU, STORAGE, FS, OBJ, or other for any other name), all ranks and KV-cache groups together.",
			[]string{"model", "pod", "medium"}, nil),
	}
}

func (m *metrics) register(reg prometheus.Registerer) error {
	return errors.Join(
		reg.Register(m.evictedVec),
		reg.Register(m.skippedVec),
		reg.Register(m.parentMisses),
		reg.Register(m.matchSeconds),
		reg.Register(m),
	)
}

func (m *metrics) evicted(reason string, blocks int) {
	if blocks > 0 {
		m.evictedVec.WithLabelValues(reason).Add(float64(blocks))
	}
}

func (m *metrics) skipped(reason string, blocks int) {
	m.skippedVec.WithLabelValues(reason).Add(float64(blocks))
}

func (m *metrics) parentMissed(blocks int) {
	m.parentMisses.Inc()
	m.skipped(reasonParent, blocks)
}

// Describe implements prometheus.Collector for the gauges.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.entriesDesc
	ch <- m.podsDesc
	ch <- m.streamsDesc
	ch <- m.residentDesc
}

// Collect implements prometheus.Collector for the gauges.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	for _, mt := range *m.t.models.Load() {
		for _, s := range mt.pods.Load().sizes {
			ch <- prometheus.MustNewConstMetric(m.streamsDesc, prometheus.GaugeValue, float64(s.streams), mt.name, strconv.Itoa(s.blockSize))
		}
	}
	for _, ms := range m.t.Stats() {
		ch <- prometheus.MustNewConstMetric(m.entriesDesc, prometheus.GaugeValue, float64(ms.Entries), ms.Model)
		ch <- prometheus.MustNewConstMetric(m.podsDesc, prometheus.GaugeValue, float64(len(ms.Pods)), ms.Model)
		for _, ps := range ms.Pods {
			media := map[string]int{}
			for _, ss := range ps.Streams {
				for _, ls := range ss.Lanes {
					media[mediumLabel(ls.Medium)] += ls.Blocks
				}
			}
			for medium, n := range media {
				ch <- prometheus.MustNewConstMetric(m.residentDesc, prometheus.GaugeValue, float64(n), ms.Model, ps.Pod, medium)
			}
		}
	}
}

// mediumOther is the medium label of blocks in a medium vLLM does not name.
const mediumOther = "other"

// mediumLabel is the medium label of a lane's blocks: vLLM's media by name
// (FS and OBJ before STORAGE replaced them), any other as mediumOther, so
// that the names engines choose do not choose the gauge's series.
func mediumLabel(medium string) string {
	switch medium {
	case kvevent.MediumGPU, kvevent.MediumCPU, kvevent.MediumStorage, "FS", "OBJ":
		return medium
	}
	return mediumOther
}
