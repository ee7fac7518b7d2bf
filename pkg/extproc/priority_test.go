package extproc

import (
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
)

func TestRequestHeadersNameTheInferenceObjective(t *testing.T) {
	for _, key := range []string{"x-gateway-inference-objective", "X-Gateway-Inference-Objective"} {
		h := readRequestHeaders(&corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":path", RawValue: []byte("/v1/completions")}, {Key: key, RawValue: []byte("batch")},
		}})
		if h.objective != "batch" {
			t.Errorf("header %s: objective %q; want batch", key, h.objective)
		}
	}
	if h := readRequestHeaders(&corev3.HeaderMap{}); h.objective != "" {
		t.Errorf("no header: objective %q", h.objective)
	}
}

func TestRequestHeadersNameTheFairnessID(t *testing.T) {
	for _, key := range []string{"x-gateway-inference-fairness-id", "X-Gateway-Inference-Fairness-Id"} {
		h := readRequestHeaders(&corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":path", RawValue: []byte("/v1/completions")}, {Key: key, RawValue: []byte("tenant-a")},
		}})
		if h.fairnessID != "tenant-a" {
			t.Errorf("header %s: fairness id %q; want tenant-a", key, h.fairnessID)
		}
	}
	if h := readRequestHeaders(&corev3.HeaderMap{}); h.fairnessID != "" {
		t.Errorf("no header: fairness id %q", h.fairnessID)
	}
}
