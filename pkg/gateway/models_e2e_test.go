package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
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

// simPod returns the ready pod of the simulated engine cfg describes,
// serving model, named name.
func simPod(t *testing.T, name, model string, cfg simserver.Config) *v1.Pod {
	t.Helper()
	e := simtest.Serve(t, cfg)
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: k8stypes.UID("uid-" + name),
			Labels: map[string]string{endpoint.ModelNameLabel: model, endpoint.ModelPortLabel: strconv.Itoa(e.Port)}},
		Status: v1.PodStatus{Phase: v1.PodRunning, PodIP: "127.0.0.1",
			Conditions: []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue}}},
	}
}

// listedModels decodes an answer to GET /v1/models into its cards, each a
// map of its fields as a client reads them.
func listedModels(t *testing.T, body []byte) []map[string]any {
	t.Helper()
	var list struct {
		Object string           `json:"object"`
		Data   []map[string]any `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil || list.Object != "list" {
		t.Fatalf("/v1/models answered %s: %v", body, err)
	}
	return list.Data
}

// cardSummary describes a listed card by the fields clients read, as
// "id root parent max_model_len owned_by".
func cardSummary(c map[string]any) string {
	return fmt.Sprintf("%v %v %v %v %v", c["id"], c["root"], c["parent"], c["max_model_len"], c["owned_by"])
}

func TestModelsListsTheCardsTheEnginesList(t *testing.T) {
	// vLLM started with --model /models/Llama-3.1-8B --served-model-name
	// llama on two pods, of 8192 and 4096 tokens of context, one with the
	// adapter sql-lora.
	engine := func(maxModelLen int, adapters ...simserver.LoRAModule) simserver.Config {
		return simserver.Config{Model: "llama", ModelPath: "/models/Llama-3.1-8B", LoRAModules: adapters,
			Ranks: []simserver.Rank{{Engine: sim.EngineConfig{BlockSize: 16, NumGPUBlocks: 4096, MaxModelLen: maxModelLen}}}}
	}
	pods := staticPods{
		simPod(t, "a", "llama", engine(8192, simserver.LoRAModule{Name: "sql-lora", Path: "/adapters/sql"})),
		simPod(t, "b", "llama", engine(4096)),
	}
	f := serveSims(t, pods, map[string]string{"KVGATE_ADAPTER_REFRESH_INTERVAL": "20ms"})

	// Both pods' engines listed: the base model's context is the smaller,
	// which a request fits whichever pod it goes to.
	want := []string{"llama /models/Llama-3.1-8B <nil> 4096 vllm", "sql-lora /adapters/sql llama <nil> vllm"}
	var cards []map[string]any
	testsupport.EventuallyWhy(t, "the gateway to list the engines' cards", func() (string, bool) {
		status, body := get(t, f.url+"/v1/models")
		if status != http.StatusOK {
			return body, false
		}
		cards = listedModels(t, []byte(body))
		var got []string
		for _, c := range cards {
			got = append(got, cardSummary(c))
		}
		return body, fmt.Sprint(got) == fmt.Sprint(want)
	})
	// vLLM's benchmark client, without --model, loads its tokenizer from
	// the first card's root.
	if root, ok := cards[0]["root"].(string); !ok || root != "/models/Llama-3.1-8B" {
		t.Fatalf(`data[0]["root"] = %v, want the engine's model path`, cards[0]["root"])
	}
	for _, c := range cards {
		perm, _ := c["permission"].([]any)
		first, _ := perm[0].(map[string]any)
		if c["object"] != "model" || c["created"] != float64(f.gw.started.Unix()) || len(perm) != 1 ||
			first["object"] != "model_permission" || first["allow_sampling"] != true || first["organization"] != "*" {
			t.Errorf("card %v: want vLLM's object, the gateway's start as created and vLLM's one permission", c)
		}
	}

	// The Envoy external processor's answer is the same list.
	body, gerr := f.gw.Picker().Models()
	if gerr != nil {
		t.Fatal(gerr)
	}
	var got []string
	for _, c := range listedModels(t, body) {
		got = append(got, cardSummary(c))
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("the external processor lists %q, want %q", got, want)
	}
}

func TestModelsWithoutAnEngineListingNameTheModelAsRootAndAnAdaptersBase(t *testing.T) {
	// With the listing off, the gateway knows only the pods' models: the
	// base model its label names and the adapter it declares.
	f := startFleet(t, []string{"a"}, fleetOptions{
		env:     map[string]string{"KVGATE_ADAPTER_REFRESH_INTERVAL": "0"},
		declare: map[string][]string{"a": {"sql-lora"}},
	})
	status, body := get(t, f.url+"/v1/models")
	if status != http.StatusOK {
		t.Fatalf("/v1/models: %d %s", status, body)
	}
	var got []string
	for _, c := range listedModels(t, []byte(body)) {
		got = append(got, cardSummary(c))
	}
	if want := []string{"llama llama <nil> <nil> kvgate", "sql-lora sql-lora llama <nil> kvgate"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("/v1/models lists %q, want %q", got, want)
	}
}
