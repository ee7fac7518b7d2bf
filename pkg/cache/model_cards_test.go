package cache

import (
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/endpoint"
)

func TestModelListsCardsAreReadAsVLLMListsThemWithinTheirBounds(t *testing.T) {
	golden, err := os.ReadFile("testdata/models/vllm_lora.json")
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", MaxModelCardStringBytes+1)
	atBound := strings.Repeat("y", MaxModelCardStringBytes)
	tests := []struct {
		name string
		body string
		want []ModelCard
	}{
		{"vLLM with two adapters", string(golden), []ModelCard{
			{ID: "chat-lora", Root: "/adapters/chat", Parent: llama, OwnedBy: "vllm"},
			{ID: llama, Root: "/models/Llama-3.1-8B-Instruct", MaxModelLen: 8192, OwnedBy: "vllm"},
			{ID: "sql-lora", Root: "/adapters/sql", Parent: llama, OwnedBy: "vllm"},
		}},
		{"the first card of an id", `{"data":[{"id":"m","root":"/a"},{"id":"m","root":"/b"},{"id":""}]}`,
			[]ModelCard{{ID: "m", Root: "/a"}}},
		{"strings beyond the bound dropped, the card kept", fmt.Sprintf(
			`{"data":[{"id":"m","root":%q,"owned_by":%q,"max_model_len":4096},{"id":"a","root":%q,"parent":%q}]}`,
			long, long, atBound, long),
			[]ModelCard{{ID: "a", Root: atBound}, {ID: "m", MaxModelLen: 4096}}},
		{"escapes counted as the string they decode to", `{"data":[{"id":"m","root":"` +
			strings.Repeat(`\u00e9`, MaxModelCardStringBytes/2) + `"}]}`,
			[]ModelCard{{ID: "m", Root: strings.Repeat("é", MaxModelCardStringBytes/2)}}},
		{"values of other types ignored", `{"data":[{"id":"m","root":7,"owned_by":{"a":1},"max_model_len":"8192"},` +
			`{"id":"n","root":null,"max_model_len":8192.5},{"id":"o","max_model_len":-1},{"id":"p","max_model_len":99999999999999999999}]}`,
			[]ModelCard{{ID: "m"}, {ID: "n"}, {ID: "o"}, {ID: "p"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, _, err := cardsOfModelList([]byte(tt.body))
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("cards = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
	// An adapter whose parent is beyond the bound is still an adapter.
	if _, adapters, _ := cardsOfModelList([]byte(tests[2].body)); !reflect.DeepEqual(adapters, []string{"a"}) {
		t.Fatalf("adapters = %q, want a", adapters)
	}
}

func TestPodCardsAreThoseOfItsBaseModelAndTheAdaptersTaken(t *testing.T) {
	listed := []ModelCard{{ID: "a1", Parent: "m"}, {ID: "a2", Parent: "m"}, {ID: "a3", Parent: "m"}, {ID: "alias"}, {ID: "m"}}
	// a3 was left out by the bound on adapters; alias is another name the
	// engine serves its model under, which the pod is not routed for.
	got := podCards(listed, "m", []string{"a1", "a2"})
	if want := []ModelCard{{ID: "a1", Parent: "m"}, {ID: "a2", Parent: "m"}, {ID: "m"}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("cards kept = %+v, want %+v", got, want)
	}
}

func TestModelCardIsTheFirstReadyPodsWithTheSmallestContextLength(t *testing.T) {
	a, b, c := newModelServer(t, "sql-lora"), newModelServer(t, "sql-lora"), newModelServer(t)
	a.setBase("/models/a", 8192)
	b.setBase("/models/b", 4096)
	c.setBase("/models/c", 1024)
	s := newTestStore(t, adapterConfig(nil))
	s.AddOrUpdatePod(testPod("ns", "a", llama, "127.0.0.1", withPort(a.port)))
	s.AddOrUpdatePod(testPod("ns", "b", llama, "127.0.0.1", withPort(b.port)))
	// c is not ready: it is not routed to, and its card is not shown.
	s.AddOrUpdatePod(testPod("ns", "c", llama, "127.0.0.1", withPort(c.port), notReady))
	want := map[string]ModelCard{
		llama:      {ID: llama, Root: "/models/a", MaxModelLen: 4096},
		"sql-lora": {ID: "sql-lora", Root: "/adapters/sql-lora", Parent: llama},
	}
	for model, w := range want {
		testsupport.EventuallyWhy(t, "the card of "+model, func() (string, bool) {
			got, ok := s.ModelCard(model)
			return fmt.Sprintf("%+v %v", got, ok), ok && got == w
		})
	}
	// The first pod no longer ready: the card is b's.
	s.AddOrUpdatePod(testPod("ns", "a", llama, "127.0.0.1", withPort(a.port), notReady))
	if got, ok := s.ModelCard(llama); !ok || got != (ModelCard{ID: llama, Root: "/models/b", MaxModelLen: 4096}) {
		t.Fatalf("card with a unready = %+v, %v; want b's", got, ok)
	}
	s.AddOrUpdatePod(testPod("ns", "b", llama, "127.0.0.1", withPort(b.port), notReady))
	if got, ok := s.ModelCard(llama); ok {
		t.Fatalf("card with no ready pod = %+v, want none", got)
	}
	if got, ok := s.ModelCard("unknown"); ok {
		t.Fatalf("card of an unknown model = %+v, want none", got)
	}
}

func TestModelCardWithoutAListingNamesOnlyTheModelAndAnAdaptersBase(t *testing.T) {
	s := newTestStore(t, noScrape())
	s.AddOrUpdatePod(testPod("ns", "a", llama, "127.0.0.1", withAnnotation(endpoint.LoraAdaptersAnnotation, "sql-lora")))
	for model, want := range map[string]ModelCard{llama: {ID: llama}, "sql-lora": {ID: "sql-lora", Parent: llama}} {
		if got, ok := s.ModelCard(model); !ok || got != want {
			t.Errorf("card of %s = %+v, %v; want %+v", model, got, ok, want)
		}
	}
}
