package transport

import (
	"errors"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvgate/kvgate/pkg/kvevent"
)

// series returns the value of every series of metric name in reg, keyed by
// its labels as "name=value,..." in label-name order; histograms give their
// sample count.
func series(t *testing.T, reg prometheus.Gatherer, name string) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "aibrix_kvcache_zmq_"+name {
			continue
		}
		for _, m := range f.GetMetric() {
			key := ""
			for i, l := range m.GetLabel() {
				if i > 0 {
					key += ","
				}
				key += l.GetName() + "=" + l.GetValue()
			}
			out[key] = metricValue(m)
		}
	}
	return out
}

func metricValue(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return 0
}

// testObserver returns the observer of stream pod, rank dpRank, recording
// into metrics (none when nil).
func testObserver(pod string, dpRank int, metrics *KVCacheMetrics) *observer {
	cfg := DefaultZMQClientConfig(pod, "127.0.0.1", "llama")
	cfg.DPRank, cfg.Metrics, cfg.Logger = dpRank, metrics, logr.Discard()
	pub, _ := cfg.endpoints()
	return newObserver(cfg, pub)
}

func TestKVCacheMetricsRegisterTwiceOnOneRegistryShareSeries(t *testing.T) {
	t.Parallel()
	reg, m1 := newTestMetrics(t)
	m2, err := NewKVCacheMetrics(reg)
	if err != nil {
		t.Fatalf("second registration: %v", err)
	}
	testObserver("ns/a", 0, m1).setConnected(true, true)
	testObserver("ns/a", 0, m2).setConnected(true, true)
	got := series(t, reg, "connections_total")
	if len(got) != 1 || got["dp_rank=0,pod_key=ns/a"] != 2 {
		t.Errorf("connections_total %v, want one series at 2", got)
	}
}

func TestNewKVCacheMetricsRejectsNilAndConflictingRegistries(t *testing.T) {
	t.Parallel()
	if _, err := NewKVCacheMetrics(nil); err == nil {
		t.Error("nil registerer accepted")
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "aibrix_kvcache_zmq_errors_total", Help: "other"}))
	if _, err := NewKVCacheMetrics(reg); err == nil {
		t.Error("conflicting collector accepted")
	}
}

// observeEverything records one of every event the observer knows.
func observeEverything(o *observer) {
	start := time.Now()
	o.setConnected(true, true)
	o.reconnectAttempt()
	o.socketFailed(errors.New("refused"), "Cannot set up sockets")
	o.handshakeFailed("tcp://127.0.0.1:1", "EVENT_HANDSHAKE_FAILED_PROTOCOL", 1)
	o.malformed([][]byte{{1}}, 1)
	o.replayRequested(0, "tcp://127.0.0.1:2")
	o.replaySucceeded()
	o.replayFailed(kindUncounted, errors.New("silent"), "tcp://127.0.0.1:2", time.Second)
	o.replayFailed(kindReplayProtocol, errors.New("no delimiter"), "tcp://127.0.0.1:2", time.Second)
	o.replayStalled(3, time.Second, "tcp://127.0.0.1:2")
	o.replayCut(LimitReplayDuration, 7, "tcp://127.0.0.1:2")
	o.droppedLive(44, 1<<20, 1<<20)
	o.limitHit(LimitPendingBuffer)
	o.suspended(time.Second, 5, time.Minute)
	o.reset(kvevent.StreamReset{Reason: kvevent.ResetUnrecoverableGap, FirstMissing: 4, LastMissing: 5})
	stored := eventCounts{2, 0, 0}
	o.batchDelivered(42, true, start, 2, &stored, &stored, kvevent.DecodeStats{UnknownKeys: 2})
	o.batchUndecodable(43, false, start, 3, errors.New("bad"))
	o.handlerFailed(43, errors.New("index full"))
	o.publisherTopic([]byte("kv"))
	o.setTopicMismatch(true)
}

func TestObserverRecordsStatsAndMetricsOnceEachAndDeletes(t *testing.T) {
	t.Parallel()
	reg, m := newTestMetrics(t)
	a, b := testObserver("ns/a", 1, m), testObserver("ns/b", 0, m)
	observeEverything(a)
	b.replayRequested(0, "tcp://127.0.0.1:2")

	checks := []struct {
		name, labels string
		want         float64
	}{
		{"connections_total", "dp_rank=1,pod_key=ns/a", 1},
		{"reconnect_attempts_total", "dp_rank=1,pod_key=ns/a", 1},
		{"events_received_total", "dp_rank=1,event_type=BLOCK_STORED,pod_key=ns/a", 2},
		{"events_processed_total", "dp_rank=1,event_type=BLOCK_STORED,pod_key=ns/a", 2},
		{"batches_received_total", "dp_rank=1,pod_key=ns/a", 2},
		{"replayed_batches_total", "dp_rank=1,pod_key=ns/a", 1},
		{"errors_total", "dp_rank=1,error_type=decode,pod_key=ns/a", 1},
		{"errors_total", "dp_rank=1,error_type=handler,pod_key=ns/a", 1},
		{"errors_total", "dp_rank=1,error_type=malformed_message,pod_key=ns/a", 1},
		{"errors_total", "dp_rank=1,error_type=replay_protocol,pod_key=ns/a", 1},
		{"errors_total", "dp_rank=1,error_type=socket,pod_key=ns/a", 2},
		{"missed_events_total", "dp_rank=1,pod_key=ns/a", 2},
		{"stream_resets_total", "dp_rank=1,pod_key=ns/a,reason=unrecoverable_gap", 1},
		{"last_sequence_id", "dp_rank=1,pod_key=ns/a", 43},
		{"connection_status", "dp_rank=1,pod_key=ns/a", 1},
		{"topic_mismatch", "dp_rank=1,pod_key=ns/a", 1},
		{"event_processing_duration_seconds", "dp_rank=1,pod_key=ns/a", 1},
		{"replay_requests_total", "dp_rank=1,pod_key=ns/a", 1},
		{"replay_success_total", "dp_rank=1,pod_key=ns/a", 1},
		{"replay_failures_total", "dp_rank=1,pod_key=ns/a", 3},
		{"limit_hits_total", "dp_rank=1,limit=replay_duration,pod_key=ns/a", 1},
		{"limit_hits_total", "dp_rank=1,limit=receive_buffer,pod_key=ns/a", 1},
		{"limit_hits_total", "dp_rank=1,limit=pending_buffer,pod_key=ns/a", 1},
		{"limit_hits_total", "dp_rank=1,limit=reset_rate,pod_key=ns/a", 1},
		{"limit_hits_total", "dp_rank=1,limit=replay_batches,pod_key=ns/a", 0},
		{"suspended", "dp_rank=1,pod_key=ns/a", 1},
		{"replay_requests_total", "dp_rank=0,pod_key=ns/b", 1},
		{"decode_skips_total", "dp_rank=1,kind=unknown_key,pod_key=ns/a", 2},
		{"decode_skips_total", "dp_rank=1,kind=unknown_event,pod_key=ns/a", 0},
	}
	for _, c := range checks {
		if got := series(t, reg, c.name)[c.labels]; got != c.want {
			t.Errorf("%s{%s} = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	wantStats := ClientStats{PodKey: "ns/a", ModelName: "llama", DPRank: 1, Connected: true, LastSeq: 43,
		BatchesReceived: 2, ReplayedBatches: 1, EventsReceived: 2, DecodeErrors: 1, HandlerErrors: 1,
		MalformedMessages: 1, Connections: 1, ReconnectAttempts: 1, ReplayRequests: 1, ReplaySuccesses: 1,
		ReplayFailures: 3, UnrecoverableGaps: 1, MissedBatches: 2, PublisherTopic: "kv", PublisherTopicKnown: true,
		TopicMismatch: true, DroppedMessages: 1, ReplaysCut: 2, PendingOverflows: 1, Suspensions: 1, Suspended: true}
	got := a.stats()
	got.LastEventTime = time.Time{}
	if got != wantStats {
		t.Errorf("stats %+v\nwant  %+v", got, wantStats)
	}

	a.close()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		for _, metric := range f.GetMetric() {
			for _, l := range metric.GetLabel() {
				if l.GetName() == LabelPodKey && l.GetValue() == "ns/a" {
					t.Errorf("%s still has a series for the deleted stream", f.GetName())
				}
			}
		}
	}
	if got := series(t, reg, "replay_requests_total")["dp_rank=0,pod_key=ns/b"]; got != 1 {
		t.Errorf("other stream's replay requests %v after Delete, want 1", got)
	}
}

func TestObserverWithoutMetricsCountsStatsOnly(t *testing.T) {
	t.Parallel()
	o := testObserver("ns/a", 0, nil)
	observeEverything(o)
	if st := o.stats(); st.BatchesReceived != 2 || st.DecodeErrors != 1 || st.MissedBatches != 2 || !st.Connected {
		t.Errorf("stats %+v: want every event counted", st)
	}
	o.close()
}
