package testsupport

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// MetricValue returns the sum over the series of metric name in g whose
// labels include every name and value of labels (nil matches every series)
// of a counter's or gauge's value or a histogram's sample count. It returns
// 0 when no series matches: a labelled metric has no series until it is
// first set. It fails t when g cannot be gathered.
func MetricValue(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	sum := 0.0
	for _, m := range matchingSeries(t, g, name, labels) {
		switch {
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		case m.Histogram != nil:
			sum += float64(m.Histogram.GetSampleCount())
		}
	}
	return sum
}

// MetricSeries returns how many series of metric name in g have labels
// that include every name and value of labels, for tests that a series was
// deleted or never made. It fails t when g cannot be gathered.
func MetricSeries(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) int {
	t.Helper()
	return len(matchingSeries(t, g, name, labels))
}

func matchingSeries(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) []*dto.Metric {
	t.Helper()
	families, err := g.Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	var out []*dto.Metric
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if hasLabels(m, labels) {
				out = append(out, m)
			}
		}
	}
	return out
}

// hasLabels reports whether m carries every name and value of labels.
func hasLabels(m *dto.Metric, labels map[string]string) bool {
	found := 0
	for _, lp := range m.GetLabel() {
		if v, ok := labels[lp.GetName()]; ok {
			if v != lp.GetValue() {
				return false
			}
			found++
		}
	}
	return found == len(labels)
}
