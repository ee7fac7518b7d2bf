package gateway

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/sim"
	"github.com/kvgate/kvgate/pkg/sim/simserver"
	"github.com/kvgate/kvgate/pkg/sim/simtest"
)

// startKeyedSim runs a simulated vLLM engine serving llama and the adapter
// sql-lora that, as vLLM with --api-key, accepts requests to its guarded
// paths only with one of keys, and returns its pod.
func startKeyedSim(t *testing.T, keys ...string) *v1.Pod {
	t.Helper()
	e := simtest.Serve(t, simserver.Config{Model: "llama", LoRAModules: []simserver.LoRAModule{{Name: "sql-lora"}},
		APIKeys: keys, Ranks: []simserver.Rank{{Engine: sim.EngineConfig{BlockSize: 16, NumGPUBlocks: 4096}}}})
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "keyed", UID: k8stypes.UID("uid-keyed"),
			Labels: map[string]string{endpoint.ModelNameLabel: "llama", endpoint.ModelPortLabel: strconv.Itoa(e.Port)}},
		Status: v1.PodStatus{Phase: v1.PodRunning, PodIP: "127.0.0.1",
			Conditions: []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue}}},
	}
}

func TestTheEngineAPIKeyServesTheGatewaysOwnRequestsAndNeverAClients(t *testing.T) {
	const gatewayKey, clientKey = "gateway-key", "client-key"
	pod := startKeyedSim(t, gatewayKey, clientKey)
	f := serveSims(t, staticPods{pod}, map[string]string{
		"KVGATE_ENGINE_API_KEY":           gatewayKey,
		"KVGATE_ADAPTER_REFRESH_INTERVAL": "20ms",
	})

	// The gateway lists the engine's adapters with its key.
	testsupport.EventuallyWhy(t, "the gateway to list sql-lora", func() (string, bool) {
		status, body := get(t, f.url+"/v1/models")
		return body, status == http.StatusOK && strings.Contains(body, `"id":"sql-lora"`)
	})

	// A client's request goes with the client's own key, and its prompt is
	// tokenized by the engine with the gateway's.
	chat := `{"model":"sql-lora","messages":[{"role":"user","content":"hello"}],"max_tokens":2}`
	resp, body := post(t, f.url+"/v1/chat/completions", chat, map[string]string{"Authorization": "Bearer " + clientKey})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("chat with the client's key: %d %s", resp.StatusCode, body)
	}
	if ok := f.metric(`kvgate_tokenizer_calls_total{result="ok"}`); ok < 1 {
		t.Errorf("no /tokenize call succeeded (ok = %v)", ok)
	}

	// The gateway never lends its key to a client that sends none: the
	// engine refuses the request.
	resp, body = post(t, f.url+"/v1/chat/completions", chat, nil)
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("chat without a key: %d %s; want the engine's 401", resp.StatusCode, body)
	}
}
