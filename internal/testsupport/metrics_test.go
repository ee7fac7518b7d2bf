package testsupport

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestMetricValueSumsTheSeriesThatCarryTheLabels(t *testing.T) {
	reg := prometheus.NewRegistry()
	blocks := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "blocks"}, []string{"pod", "medium"})
	requests := prometheus.NewCounter(prometheus.CounterOpts{Name: "requests_total"})
	latency := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "latency_seconds"})
	unused := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "unused_total"}, []string{"reason"})
	reg.MustRegister(blocks, requests, latency, unused)
	blocks.WithLabelValues("a", "GPU").Set(3)
	blocks.WithLabelValues("a", "CPU").Set(2)
	blocks.WithLabelValues("b", "GPU").Set(1)
	requests.Add(7)
	latency.Observe(0.1)
	latency.Observe(0.2)

	for _, tc := range []struct {
		name       string
		metric     string
		labels     map[string]string
		want       float64
		wantSeries int
	}{
		{"one series", "blocks", map[string]string{"pod": "a", "medium": "CPU"}, 2, 1},
		{"a label shared by two series", "blocks", map[string]string{"pod": "a"}, 5, 2},
		{"every series", "blocks", nil, 6, 3},
		{"a value no series has", "blocks", map[string]string{"pod": "c"}, 0, 0},
		{"a label the metric lacks", "blocks", map[string]string{"model": "llama"}, 0, 0},
		{"a counter", "requests_total", nil, 7, 1},
		{"a histogram's sample count", "latency_seconds", nil, 2, 1},
		{"a labelled metric never set", "unused_total", nil, 0, 0},
		{"an unknown metric", "nothing", nil, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := MetricValue(t, reg, tc.metric, tc.labels); got != tc.want {
				t.Errorf("MetricValue(%s%v) = %v, want %v", tc.metric, tc.labels, got, tc.want)
			}
			if got := MetricSeries(t, reg, tc.metric, tc.labels); got != tc.wantSeries {
				t.Errorf("MetricSeries(%s%v) = %d, want %d", tc.metric, tc.labels, got, tc.wantSeries)
			}
		})
	}
}
