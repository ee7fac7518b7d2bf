package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/sim"
	"github.com/kvgate/kvgate/pkg/sim/simserver"
	"github.com/kvgate/kvgate/pkg/sim/simtest"
)

// Objectives of the saturation tests: batch is sheddable, chat is not.
var saturationObjectives = objectiveMap{"batch": -1, "chat": 0}

// saturationKV is the KV-cache utilization beyond which the saturation
// tests' engines have no capacity: a held prompt of holdWords words (some
// 420 tokens) passes it.
const (
	saturationKV = 0.3
	holdWords    = 48
)

// saturationEngines are simulated engines serving llama, each with a KV
// cache of 64 blocks of 16 tokens, stepping every 50 ms: a streamed
// request of holdWords prompt words fills more than saturationKV of it,
// and leaves room for small requests for tens of seconds.
type saturationEngines struct {
	urls []string
	pods staticPods
}

func startSaturationEngines(t *testing.T, n int) *saturationEngines {
	t.Helper()
	s := &saturationEngines{}
	for i := range n {
		e := simtest.Serve(t, simserver.Config{Model: "llama", Ranks: []simserver.Rank{{
			Engine: sim.EngineConfig{BlockSize: 16, NumGPUBlocks: 65, Latency: sim.LatencyModel{StepOverhead: 50 * time.Millisecond}},
		}}})
		name := fmt.Sprint("sat-", i)
		s.urls = append(s.urls, e.URL)
		s.pods = append(s.pods, &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: k8stypes.UID("uid-" + name),
				Labels: map[string]string{endpoint.ModelNameLabel: "llama", endpoint.ModelPortLabel: strconv.Itoa(e.Port)}},
			Status: v1.PodStatus{Phase: v1.PodRunning, PodIP: "127.0.0.1",
				Conditions: []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue}}},
		})
	}
	return s
}

// saturationEnv is the gateway's environment in the saturation tests: a
// KV-cache threshold of saturationKV, and a metrics staleness generous
// enough for a loaded machine's scrapes.
var saturationEnv = map[string]string{
	config.SaturationKVCacheUtilization.Name: strconv.FormatFloat(saturationKV, 'f', -1, 64),
	config.SaturationMetricsStaleness.Name:   "3000",
}

// hold streams a long completion from engine i, directly, and returns once
// its first token came: its prompt holds more than saturationKV of the
// engine's KV cache until release hangs up.
func (s *saturationEngines) hold(t *testing.T, i int) (release func()) {
	t.Helper()
	return simtest.Hold(t, s.urls[i], "llama", simPrompt(1000+i, holdWords), 500)
}

// waitKV waits until the gateway's Store reads every engine's KV cache,
// freshly scraped, as over (true) or within (false) saturationKV, by
// engine index.
func waitKV(t *testing.T, f *testFleet, over map[int]bool) {
	t.Helper()
	testsupport.EventuallyWhy(t, fmt.Sprintf("the engines' KV caches over %v: %v", saturationKV, over), func() (string, bool) {
		pods, err := f.gw.store.ListPodsByModel("llama")
		if err != nil {
			return err.Error(), false
		}
		snaps := f.gw.store.Snapshots(pods, nil)
		var got []string
		ok := true
		for _, sp := range snaps {
			i, _ := strconv.Atoi(strings.TrimPrefix(sp.Endpoint.Key.Name, "sat-"))
			got = append(got, fmt.Sprintf("%s=%.2f(%s)", sp.Endpoint.Key.Name, sp.Metrics.KVCacheUsage, sp.Scrape))
			if want, named := over[i]; sp.Scrape != cache.ScrapeFresh || named && (sp.Metrics.KVCacheUsage > saturationKV) != want {
				ok = false
			}
		}
		return strings.Join(got, " "), ok && len(snaps) == len(over)
	})
}

// objectiveHeader names the objective of a request, none for "".
func objectiveHeader(objective string) map[string]string {
	if objective == "" {
		return nil
	}
	return map[string]string{HeaderInferenceObjective: objective}
}

// smallCompletion is a completion that needs little of an engine.
func smallCompletion(i int) string {
	return completion(fmt.Sprint("short request ", i), `,"max_tokens":2`)
}

func TestSheddableRequestsAreRefusedWhileEveryEngineIsSaturated(t *testing.T) {
	engines := startSaturationEngines(t, 2)
	f := serveSimsWith(t, engines.pods, saturationEnv, func(c *Config) { c.Objectives = saturationObjectives })
	waitKV(t, f, map[int]bool{0: false, 1: false})

	// With capacity, every request is served, sheddable or not.
	for i, objective := range []string{"batch", "chat", ""} {
		resp, body := post(t, f.url+PathCompletions, smallCompletion(i), objectiveHeader(objective))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("objective %q with capacity: %d %s", objective, resp.StatusCode, body)
		}
	}

	releases := []func(){engines.hold(t, 0), engines.hold(t, 1)}
	waitKV(t, f, map[int]bool{0: true, 1: true})
	resp, body := post(t, f.url+PathCompletions, smallCompletion(10), objectiveHeader("batch"))
	var e apiError
	if err := json.Unmarshal(body, &e); err != nil || resp.StatusCode != http.StatusTooManyRequests ||
		e.Error.Code != codePoolSaturated || e.Error.Type != typeRateLimit || resp.Header.Get(HeaderRetryAfter) != "1" {
		t.Fatalf("a sheddable request while every engine is saturated: %d (Retry-After %q) %s; want 429 %s with Retry-After 1",
			resp.StatusCode, resp.Header.Get(HeaderRetryAfter), body, codePoolSaturated)
	}
	if n := f.metric(`kvgate_gateway_shed_requests_total{model="llama"}`); n != 1 {
		t.Errorf("kvgate_gateway_shed_requests_total = %v; want 1", n)
	}
	// Priority 0, named or not, is never shed.
	for i, objective := range []string{"chat", "", "unknown"} {
		resp, body := post(t, f.url+PathCompletions, smallCompletion(20+i), objectiveHeader(objective))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("objective %q while saturated: %d %s; want 200", objective, resp.StatusCode, body)
		}
	}

	// One engine freed: it has capacity, the pods are no longer
	// saturated, and the sheddable request is routed as any other.
	releases[0]()
	waitKV(t, f, map[int]bool{0: false, 1: true})
	resp, body = post(t, f.url+PathCompletions, smallCompletion(30), objectiveHeader("batch"))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a sheddable request once an engine has capacity: %d %s; want 200", resp.StatusCode, body)
	}
	if n := f.metric(`kvgate_gateway_shed_requests_total{model="llama"}`); n != 1 {
		t.Errorf("kvgate_gateway_shed_requests_total = %v; want still 1", n)
	}
}

func TestSheddableMessagesRequestsAreRefusedInAnthropicsShape(t *testing.T) {
	engines := startSaturationEngines(t, 1)
	f := serveSimsWith(t, engines.pods, saturationEnv, func(c *Config) { c.Objectives = saturationObjectives })
	engines.hold(t, 0)
	waitKV(t, f, map[int]bool{0: true})
	body := `{"model":"llama","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`
	resp, got := post(t, f.url+PathMessages, body, objectiveHeader("batch"))
	var e struct {
		Type  string `json:"type"`
		Error struct {
			Type string `json:"type"`
		} `json:"error"`
	}
	if err := json.Unmarshal(got, &e); err != nil || resp.StatusCode != http.StatusTooManyRequests || e.Type != "error" ||
		e.Error.Type == "" || !bytes.Contains(got, []byte("saturated")) {
		t.Fatalf("%d %s; want 429 in Anthropic's error shape", resp.StatusCode, got)
	}
}
