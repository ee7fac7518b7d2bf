package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/kvgate/kvgate/internal/testapiserver"
	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/discovery"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/routing"
	"github.com/kvgate/kvgate/pkg/sim"
	"github.com/kvgate/kvgate/pkg/sim/simserver"
	"github.com/kvgate/kvgate/pkg/sim/simtest"
)

// rewriteCluster is an API server serving the Inference Extension's CRDs,
// with an InferencePool "pool" in namespace llm whose one pod is a
// simulated engine serving llama and the adapters sql-lora-v1 and
// sql-lora-v2.
type rewriteCluster struct {
	kubeconfig string
	rewrites   dynamic.ResourceInterface
	// port is the engine's.
	port int
}

func startRewriteCluster(t *testing.T) *rewriteCluster {
	t.Helper()
	kubeconfig, rc := startAPIServer(t, filepath.Join("..", "..", "config", "inference-extension"))
	e := simtest.Serve(t, simserver.Config{Model: "llama",
		LoRAModules: []simserver.LoRAModule{{Name: "sql-lora-v1", Path: "/adapters/v1"}, {Name: "sql-lora-v2", Path: "/adapters/v2"}},
		Ranks:       []simserver.Rank{{Engine: sim.EngineConfig{BlockSize: 16, NumGPUBlocks: 4096, MaxModelLen: 8192}}}})
	ctx := context.Background()
	client := kubernetes.NewForConfigOrDie(rc)
	dyn := dynamic.NewForConfigOrDie(rc)
	if _, err := client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "llm"}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pool := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
		"metadata": map[string]any{"name": "pool", "labels": map[string]any{endpoint.ModelNameLabel: "llama"}},
		"spec": map[string]any{
			"selector":          map[string]any{"matchLabels": map[string]any{"app": "llm"}},
			"targetPorts":       []any{map[string]any{"number": int64(e.Port)}},
			"endpointPickerRef": map[string]any{"name": "kvgate", "port": map[string]any{"number": int64(9002)}},
		},
	}}
	if _, err := dyn.Resource(discovery.InferencePoolResource).Namespace("llm").Create(ctx, pool, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "vllm-0", Labels: map[string]string{"app": "llm"}},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}}}
	createReadyPod(t, client, pod)
	return &rewriteCluster{kubeconfig: kubeconfig, port: e.Port,
		rewrites: dyn.Resource(discovery.InferenceModelRewriteResource).Namespace("llm")}
}

// apply creates or replaces the InferenceModelRewrite name of the pool,
// whose rules each map a model to its targets ("" for a generic rule), each
// target "model" or "model=weight".
func (c *rewriteCluster) apply(t *testing.T, name string, rules map[string][]string) {
	t.Helper()
	var rs []any
	for model, targets := range rules {
		r := map[string]any{}
		if model != "" {
			r["matches"] = []any{map[string]any{"model": map[string]any{"type": "Exact", "value": model}}}
		}
		var ts []any
		for _, tg := range targets {
			m, w, weighted := strings.Cut(tg, "=")
			target := map[string]any{"modelRewrite": m}
			if weighted {
				n, _ := strconv.Atoi(w)
				target["weight"] = int64(n)
			}
			ts = append(ts, target)
		}
		r["targets"] = ts
		rs = append(rs, r)
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceModelRewrite",
		"metadata": map[string]any{"name": name},
		"spec":     map[string]any{"poolRef": map[string]any{"name": "pool"}, "rules": rs},
	}}
	testapiserver.Apply(t, c.rewrites, u)
}

// servedModel posts a chat for model with headers, routed by prefix (so
// that its prompt is tokenized by the engine), and returns the status, the
// model the engine's response names ("" when it names none) and the body.
func servedModel(t *testing.T, url, model string, stream bool, headers map[string]string) (int, string, string) {
	t.Helper()
	req := map[string]any{"model": model, "max_tokens": 4, "messages": []map[string]string{{"role": "user", "content": "hello"}}}
	if stream {
		req["stream"] = true
	}
	body, _ := json.Marshal(req)
	all := map[string]string{routing.HeaderRoutingStrategy: routing.PrefixCache}
	for k, v := range headers {
		all[k] = v
	}
	resp, data := post(t, url+"/v1/chat/completions", string(body), all)
	if stream {
		// Every chunk names the model; the first is enough.
		for _, line := range strings.Split(string(data), "\n") {
			if rest, ok := strings.CutPrefix(line, "data: {"); ok {
				data = []byte("{" + rest)
				break
			}
		}
	}
	var out struct {
		Model string `json:"model"`
	}
	_ = json.Unmarshal(data, &out)
	return resp.StatusCode, out.Model, string(data)
}

func TestInferenceModelRewritesReachTheEngineRewritten(t *testing.T) {
	c := startRewriteCluster(t)
	c.apply(t, "aliases", map[string][]string{"sql-lora": {"sql-lora-v1"}})

	f := &testFleet{t: t}
	f.serve(loadTestConfig(t, map[string]string{"KUBECONFIG": c.kubeconfig, "KVGATE_POD_DISCOVERY": "inferencepool",
		"KVGATE_POD_NAMESPACE": "llm", "KVGATE_INFERENCE_POOLS": "pool", "AIBRIX_PREFIX_CACHE_KV_EVENT_SYNC_ENABLED": "false",
		"AIBRIX_POD_METRIC_REFRESH_INTERVAL_MS": "20", "KVGATE_ADAPTER_REFRESH_INTERVAL": "20ms",
		"AIBRIX_VLLM_TOKENIZER_ENDPOINT_TEMPLATE": "http://%s:" + strconv.Itoa(c.port)}))
	f.waitReady()

	// A rewrite that existed at start applies once the engine's adapters
	// are known; the request reaches the engine naming the target.
	testsupport.EventuallyWhy(t, "the alias sql-lora to reach sql-lora-v1", func() (string, bool) {
		status, model, body := servedModel(t, f.url, "sql-lora", false, nil)
		return body, status == http.StatusOK && model == "sql-lora-v1"
	})
	// So does a streamed request, whose body the gateway also changes to
	// ask for the usage chunk.
	if status, model, body := servedModel(t, f.url, "sql-lora", true, nil); status != http.StatusOK || model != "sql-lora-v1" {
		t.Fatalf("streamed request for sql-lora: %d, the engine served %q: %s", status, model, body)
	}

	// A rewrite created, then updated, while the gateway runs.
	c.apply(t, "chat", map[string][]string{"chat": {"llama"}})
	testsupport.EventuallyWhy(t, "a created rewrite to apply", func() (string, bool) {
		status, model, body := servedModel(t, f.url, "chat", false, nil)
		return body, status == http.StatusOK && model == "llama"
	})
	// The other APIs are rewritten alike: Anthropic's Messages, whose
	// prompt is converted from the body, and an endpoint routed by the
	// model alone.
	resp, data := post(t, f.url+"/v1/messages", `{"model":"chat","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`,
		map[string]string{routing.HeaderRoutingStrategy: routing.PrefixCache})
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(data), `"model":"llama"`) {
		t.Fatalf("messages for chat: %d %s; want llama's answer", resp.StatusCode, data)
	}
	resp, data = post(t, f.url+"/v1/messages/count_tokens", `{"model":"chat","messages":[{"role":"user","content":"hi"}]}`, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("count_tokens for chat: %d %s", resp.StatusCode, data)
	}
	// The engine tokenized every prompt for the model it was sent to.
	if got := f.metric(`kvgate_gateway_tokenization_failures_total{reason="status"}`); got != 0 {
		t.Errorf("%v prompts failed to tokenize: the tokenizer was asked for the model requested", got)
	}
	c.apply(t, "chat", map[string][]string{"chat": {"sql-lora-v1=1", "sql-lora-v2=1"}})
	testsupport.EventuallyWhy(t, "an updated rewrite to split chat over both adapters", func() (string, bool) {
		seen := map[string]int{}
		for range 40 {
			_, model, _ := servedModel(t, f.url, "chat", false, nil)
			seen[model]++
		}
		return mustJSON(seen), len(seen) == 2 && seen["sql-lora-v1"] > 0 && seen["sql-lora-v2"] > 0
	})

	// The header names the model, over the rules.
	headerRewrites := f.metric(`kvgate_gateway_model_rewrites_total{source="header"}`)
	if status, model, body := servedModel(t, f.url, "chat", false, map[string]string{HeaderModelRewrite: "llama"}); status != http.StatusOK || model != "llama" {
		t.Fatalf("chat with %s llama: %d, the engine served %q: %s", HeaderModelRewrite, status, model, body)
	}
	if got := f.metric(`kvgate_gateway_model_rewrites_total{source="header"}`); got != headerRewrites+1 {
		t.Errorf("header rewrites = %v, want %v", got, headerRewrites+1)
	}
	if f.metric(`kvgate_gateway_model_rewrites_total{source="rule"}`) == 0 {
		t.Errorf("no rule rewrite counted")
	}
	long := strings.Repeat("m", MaxModelRewriteHeaderBytes+1)
	if status, _, body := servedModel(t, f.url, "chat", false, map[string]string{HeaderModelRewrite: long}); status != http.StatusBadRequest ||
		!strings.Contains(body, HeaderModelRewrite) {
		t.Fatalf("a header value of %d bytes: %d %s; want 400 naming the header", len(long), status, body)
	}
	// The requests count under the model they went to.
	_, metrics := get(t, f.adminURL+"/metrics")
	for _, line := range strings.Split(metrics, "\n") {
		if strings.HasPrefix(line, "kvgate_gateway_requests_total{") && strings.Contains(line, `model="sql-lora"`) {
			t.Errorf("a request is counted under the model it asked for: %s", line)
		}
	}

	// A deleted rewrite no longer applies: chat is served by no engine.
	if err := c.rewrites.Delete(context.Background(), "chat", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testsupport.EventuallyWhy(t, "a deleted rewrite to stop applying", func() (string, bool) {
		status, _, body := servedModel(t, f.url, "chat", false, nil)
		return body, status == http.StatusNotFound && strings.Contains(body, codeModelNotFound)
	})
}
