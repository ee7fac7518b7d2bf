package transport

import (
	"testing"
	"time"

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

func TestKVCacheMetricsRegisterTwiceOnOneRegistryShareSeries(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	m1, err := NewKVCacheMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	m2, err := NewKVCacheMetrics(reg)
	if err != nil {
		t.Fatalf("second registration: %v", err)
	}
	m1.NewZMQClientMetrics("ns/a", 0).IncrementConnectionCount()
	m2.NewZMQClientMetrics("ns/a", 0).IncrementConnectionCount()
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

func TestZMQClientMetricsRecordAndDelete(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	m, err := NewKVCacheMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	a, b := m.NewZMQClientMetrics("ns/a", 1), m.NewZMQClientMetrics("ns/b", 0)
	a.IncrementEventCount(string(kvevent.EventTypeBlockStored))
	a.IncrementEventCount("SOMETHING_NEW")
	a.IncrementErrorCount(ErrorTypeDecode)
	a.IncrementErrorCount("other")
	a.IncrementMissedEvents(3)
	a.recordReset(kvevent.StreamReset{Reason: kvevent.ResetUnrecoverableGap, FirstMissing: 4, LastMissing: 5})
	a.UpdateLastSequenceID(42)
	a.SetConnected(true)
	a.RecordEventProcessingLatency(time.Millisecond)
	a.recordSkips(kvevent.DecodeStats{UnknownKeys: 2})
	b.IncrementReplayCount()

	checks := []struct {
		name, labels string
		want         float64
	}{
		{"events_received_total", "dp_rank=1,event_type=BLOCK_STORED,pod_key=ns/a", 1},
		{"events_received_total", "dp_rank=1,event_type=SOMETHING_NEW,pod_key=ns/a", 1},
		{"errors_total", "dp_rank=1,error_type=decode,pod_key=ns/a", 1},
		{"errors_total", "dp_rank=1,error_type=other,pod_key=ns/a", 1},
		{"missed_events_total", "dp_rank=1,pod_key=ns/a", 5},
		{"stream_resets_total", "dp_rank=1,pod_key=ns/a,reason=unrecoverable_gap", 1},
		{"last_sequence_id", "dp_rank=1,pod_key=ns/a", 42},
		{"connection_status", "dp_rank=1,pod_key=ns/a", 1},
		{"event_processing_duration_seconds", "dp_rank=1,pod_key=ns/a", 1},
		{"replay_requests_total", "dp_rank=0,pod_key=ns/b", 1},
		{"decode_skips_total", "dp_rank=1,kind=unknown_key,pod_key=ns/a", 2},
		{"decode_skips_total", "dp_rank=1,kind=unknown_event,pod_key=ns/a", 0},
	}
	for _, c := range checks {
		if got := series(t, reg, c.name)[c.labels]; got != c.want {
			t.Errorf("%s{%s} = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	a.Delete()
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

func TestNilZMQClientMetricsRecordNothing(t *testing.T) {
	t.Parallel()
	var m *ZMQClientMetrics
	m.IncrementConnectionCount()
	m.IncrementDisconnectionCount()
	m.IncrementReconnectAttempts()
	m.IncrementErrorCount(ErrorTypeDecode)
	m.IncrementEventCount(string(kvevent.EventTypeAllCleared))
	m.IncrementMissedEvents(1)
	m.IncrementReplayCount()
	m.IncrementReplaySuccess()
	m.IncrementReplayFailure()
	m.RecordEventProcessingLatency(time.Second)
	m.UpdateLastSequenceID(1)
	m.SetConnected(true)
	m.recordReset(kvevent.StreamReset{Reason: kvevent.ResetRewind})
	m.recordBatch(1, true, &[len(eventTypes)]int{}, &[len(eventTypes)]int{})
	m.recordSkips(kvevent.DecodeStats{UnknownEvents: 1, UnknownKeys: 1, UnknownFields: 1})
	m.Delete()
}
