package tokenizer

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/pkg/config"
)

func TestNewRejectsConfigValuesOutOfRange(t *testing.T) {
	for _, cfg := range []Config{{Timeout: -time.Second}, {CacheMaxTokens: -1}, {MaxResponseBytes: -1}, {LocalMaxBytes: -1},
		{VerifyFraction: 1.5}, {VerifyFraction: math.NaN()}, {VerifyFraction: math.Inf(1)}} {
		if tk, err := New(cfg, prometheus.NewRegistry()); err == nil {
			tk.Close()
			t.Errorf("New(%+v) succeeded, want an error", cfg)
		}
	}
	if tk, err := New(Config{}, nil); err == nil {
		tk.Close()
		t.Error("New with a nil Registerer succeeded, want an error")
	}
}

func TestNewFailsCleanlyWhenItsMetricsAreTaken(t *testing.T) {
	reg := prometheus.NewRegistry()
	taken := prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvgate_tokenizer_cache_entries", Help: "Tokenizations held by the cache."})
	reg.MustRegister(taken)
	if tk, err := New(Config{}, reg); err == nil {
		tk.Close()
		t.Fatal("New succeeded with one of its metrics already registered")
	}
	reg.Unregister(taken)
	first, err := New(Config{}, reg)
	if err != nil {
		t.Fatalf("New after a failed New on the same registry: %v; the failed one left metrics behind", err)
	}
	defer first.Close()
	if second, err := New(Config{}, reg); err == nil {
		second.Close()
		t.Fatal("a second Tokenizer registered its metrics on the same registry")
	}
}

func TestMetricsAreRegisteredAndUpdated(t *testing.T) {
	f := newFakeVLLM(t, "m")
	tk, reg := newTestTokenizer(t, Config{})
	mustTokenize(t, tk, f.URL, chatHi)
	mustTokenize(t, tk, f.URL, chatHi)

	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range families {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, l := range m.GetLabel() {
				name += "{" + l.GetName() + "=" + l.GetValue() + "}"
			}
			switch {
			case m.Counter != nil:
				got[name] = m.GetCounter().GetValue()
			case m.Gauge != nil:
				got[name] = m.GetGauge().GetValue()
			case m.Histogram != nil:
				got[name+"_count"] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	tokens := float64(len(fakeEncode(userHi+genPrompt, false)))
	want := map[string]float64{
		"kvgate_tokenizer_calls_total{result=ok}":         1,
		"kvgate_tokenizer_calls_total{result=timeout}":    0,
		"kvgate_tokenizer_calls_total{result=canceled}":   0,
		"kvgate_tokenizer_calls_total{result=connection}": 0,
		"kvgate_tokenizer_calls_total{result=status}":     0,
		"kvgate_tokenizer_calls_total{result=bad_body}":   0,
		"kvgate_tokenizer_call_duration_seconds_count":    1,
		"kvgate_tokenizer_cache_hits_total":               1,
		"kvgate_tokenizer_cache_misses_total":             1,
		"kvgate_tokenizer_cache_evictions_total":          0,
		"kvgate_tokenizer_cache_tokens":                   tokens,
		"kvgate_tokenizer_cache_bytes":                    4*tokens + entryOverhead,
		"kvgate_tokenizer_cache_entries":                  1,
		// Nothing is tokenized in process without tokenizer files, and a
		// single-message chat has no message prefix to answer from.
		"kvgate_tokenizer_cache_partial_hits_total":                   0,
		"kvgate_tokenizer_background_dropped_total":                   0,
		"kvgate_tokenizer_local_tokenizations_total{form=completion}": 0,
		"kvgate_tokenizer_local_tokenizations_total{form=chat}":       0,
		"kvgate_tokenizer_local_fallbacks_total{reason=unverified}":   0,
		"kvgate_tokenizer_local_fallbacks_total{reason=mismatch}":     0,
		"kvgate_tokenizer_local_fallbacks_total{reason=request}":      0,
		"kvgate_tokenizer_local_fallbacks_total{reason=render}":       0,
		"kvgate_tokenizer_local_fallbacks_total{reason=long_word}":    0,
		"kvgate_tokenizer_local_fallbacks_total{reason=too_large}":    0,
		"kvgate_tokenizer_local_forms{state=active}":                  0,
		"kvgate_tokenizer_local_forms{state=unverified}":              0,
		"kvgate_tokenizer_local_forms{state=verifying}":               0,
		"kvgate_tokenizer_local_forms{state=fallback}":                0,
		"kvgate_tokenizer_local_forms{state=unavailable}":             0,
	}
	for name, v := range want {
		if got[name] != v {
			t.Errorf("%s = %v, want %v", name, got[name], v)
		}
	}
	var extra []string
	for name := range got {
		if _, ok := want[name]; !ok && strings.HasPrefix(name, "kvgate_") {
			extra = append(extra, name)
		}
	}
	if len(extra) > 0 {
		slices.Sort(extra)
		t.Errorf("unexpected metrics %v", extra)
	}
}

// TestDefaultsMatchTheEnvironmentVariables keeps the zero Config equal to
// the gateway started without the tokenizer's variables set.
func TestDefaultsMatchTheEnvironmentVariables(t *testing.T) {
	env := config.NewEnv(func(string) (string, bool) { return "", false })
	if got := env.Duration(config.TokenizerRequestTimeout, time.Second); got != DefaultTimeout {
		t.Errorf("%s defaults to %v, DefaultTimeout is %v", config.TokenizerRequestTimeout.Name, got, DefaultTimeout)
	}
	if got := env.Int(config.TokenizerCacheMaxTokens, 1); got != DefaultCacheMaxTokens {
		t.Errorf("%s defaults to %d, DefaultCacheMaxTokens is %d", config.TokenizerCacheMaxTokens.Name, got, DefaultCacheMaxTokens)
	}
	if got := env.Float(config.TokenizerVerifyFraction, 0); got != DefaultVerifyFraction {
		t.Errorf("%s defaults to %v, DefaultVerifyFraction is %v", config.TokenizerVerifyFraction.Name, got, DefaultVerifyFraction)
	}
	if got := env.Int(config.TokenizerMaxBackgroundCalls, 1); got != DefaultMaxBackgroundCalls {
		t.Errorf("%s defaults to %d, DefaultMaxBackgroundCalls is %d", config.TokenizerMaxBackgroundCalls.Name, got, DefaultMaxBackgroundCalls)
	}
	if got := env.Int(config.TokenizerLocalMaxBytes, 1); got != DefaultLocalMaxBytes {
		t.Errorf("%s defaults to %d, DefaultLocalMaxBytes is %d", config.TokenizerLocalMaxBytes.Name, got, DefaultLocalMaxBytes)
	}
	if err := env.Err(); err != nil {
		t.Fatal(err)
	}
}
