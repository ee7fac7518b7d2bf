package manager

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/pkg/kvevent/transport"
)

// managerMetrics are a KVEventManager's own metrics, kvgate_kv_event_*.
// The gauges are computed from the manager's state when scraped, so they
// never drift from it.
type managerMetrics struct {
	reg          prometheus.Registerer
	reconciles   *prometheus.CounterVec
	streamStarts prometheus.Counter
	streamStops  prometheus.Counter
	purges       *prometheus.CounterVec
	state        *stateCollector
	// ignored counts messages a bound socket dropped, by reason; nil in
	// connect mode.
	ignored *prometheus.CounterVec
}

func newManagerMetrics(reg prometheus.Registerer, m *KVEventManager) (*managerMetrics, error) {
	mm := &managerMetrics{
		reg: reg,
		reconciles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_kv_event_reconciles_total",
			Help: "Pod reconciliations of the KV event manager, by result (ok, error: retried with backoff).",
		}, []string{"result"}),
		streamStarts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_kv_event_stream_starts_total",
			Help: "KV-event streams (pod, data-parallel rank) the manager started following.",
		}),
		streamStops: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_kv_event_stream_stops_total",
			Help: "KV-event streams the manager stopped following; each stop purged the pod from the index.",
		}),
		purges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_kv_event_pod_purges_total",
			Help: "Pods the KV event manager purged from the index as it stopped their streams, by reason " +
				"(dead: streams and scrapes stopped for the dead-pod timeout; changed: followed anew; stopped: deleted or ineligible).",
		}, []string{"reason"}),
		state: &stateCollector{m: m,
			pods: prometheus.NewDesc("kvgate_kv_event_pods",
				"Pods known to the KV event manager, by state (followed, ineligible, failed: retrying).", []string{"state"}, nil),
			ineligible: prometheus.NewDesc("kvgate_kv_event_ineligible_pods",
				"Pods whose KV events are not followed, by reason.", []string{"reason"}, nil),
			streams: prometheus.NewDesc("kvgate_kv_event_streams",
				"KV-event streams (pod, data-parallel rank) being followed.", nil, nil),
			dead: prometheus.NewDesc("kvgate_kv_event_dead_pods",
				"Followed pods judged dead: no stream connected and no successful metrics scrape for the dead-pod timeout.", nil, nil),
		},
	}
	for _, r := range purgeReasons {
		mm.purges.WithLabelValues(r)
	}
	if m.cfg.Bind != nil {
		mm.ignored = prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_kv_event_bind_ignored_messages_total",
			Help: "Messages received on the gateway's bound KV event sockets and dropped, by reason.",
		}, []string{"reason"})
		for _, r := range transport.IgnoredReasons {
			mm.ignored.WithLabelValues(r)
		}
	}
	if reg == nil {
		return mm, nil
	}
	for i, c := range mm.collectors() {
		if err := reg.Register(c); err != nil {
			for _, done := range mm.collectors()[:i] {
				reg.Unregister(done)
			}
			return nil, fmt.Errorf("kvevent: register KV event manager metrics: %w", err)
		}
	}
	return mm, nil
}

func (mm *managerMetrics) collectors() []prometheus.Collector {
	cs := []prometheus.Collector{mm.reconciles, mm.streamStarts, mm.streamStops, mm.purges, mm.state}
	if mm.ignored != nil {
		cs = append(cs, mm.ignored)
	}
	return cs
}

// bindIgnored counts a message a bound socket dropped.
func (mm *managerMetrics) bindIgnored(reason string) {
	mm.ignored.WithLabelValues(reason).Inc()
}

func (mm *managerMetrics) unregister() {
	if mm.reg == nil {
		return
	}
	for _, c := range mm.collectors() {
		mm.reg.Unregister(c)
	}
}

// stateCollector reports the gauges of the manager's pods and streams.
type stateCollector struct {
	m                               *KVEventManager
	pods, ineligible, streams, dead *prometheus.Desc
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.pods
	ch <- c.ineligible
	ch <- c.streams
	ch <- c.dead
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	states := map[string]int{PodStateFollowed: 0, PodStateIneligible: 0, PodStateFailed: 0}
	reasons := make(map[IneligibleReason]int, len(ineligibleReasons))
	for _, r := range ineligibleReasons {
		reasons[r] = 0
	}
	streams := 0
	c.m.mu.Lock()
	for _, st := range c.m.states {
		states[st.state()]++
		if st.reason != "" {
			reasons[st.reason]++
		}
		streams += len(st.streams)
	}
	dead := 0
	for _, l := range c.m.liveness {
		if l.dead() {
			dead++
		}
	}
	c.m.mu.Unlock()
	for s, n := range states {
		ch <- prometheus.MustNewConstMetric(c.pods, prometheus.GaugeValue, float64(n), s)
	}
	for r, n := range reasons {
		ch <- prometheus.MustNewConstMetric(c.ineligible, prometheus.GaugeValue, float64(n), string(r))
	}
	ch <- prometheus.MustNewConstMetric(c.streams, prometheus.GaugeValue, float64(streams))
	ch <- prometheus.MustNewConstMetric(c.dead, prometheus.GaugeValue, float64(dead))
}
