package routing_test

import (
	"context"
	"fmt"
	"math/rand/v2"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/indexer"
	"github.com/kvgate/kvgate/pkg/inflight"
	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/routing"
	"github.com/kvgate/kvgate/pkg/types"
)

// The gateway's use of a Router: resolve the routing-strategy header before
// tokenizing, route, and record the attempt in the request ledger, which
// counts it on the pod and its prefill as queued until the first token
// comes back.
func Example() {
	store, err := cache.New(cache.Config{PodMetricRefreshInterval: -1, AdapterRefreshInterval: -1})
	if err != nil {
		panic(err)
	}
	for i, name := range []string{"vllm-0", "vllm-1"} {
		store.AddOrUpdatePod(&v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Labels: map[string]string{endpoint.ModelNameLabel: "llama"}},
			Status: v1.PodStatus{Phase: v1.PodRunning, PodIP: fmt.Sprint("10.0.0.", i+1),
				Conditions: []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue}}},
		})
	}
	index, err := indexer.NewSyncPrefixHashTable(indexer.Config{}, nil)
	if err != nil {
		panic(err)
	}
	// vllm-1's engine computed the first two 16-token blocks of the prompt.
	prompt := make([]uint32, 40)
	for i := range prompt {
		prompt[i] = uint32(1000 + i)
	}
	stored := &kvevent.BlockStoredEvent{BlockHashes: []uint64{11, 12}, TokenIDs: prompt[:32], BlockSize: 16,
		Medium: kvevent.MediumGPU, GroupIdx: kvevent.NoGroup}
	if err := index.ApplyBatch(indexer.Stream{Pod: "default/vllm-1", Model: "llama"},
		&kvevent.EventBatch{Events: []kvevent.KVEvent{stored}}); err != nil {
		panic(err)
	}
	router, err := routing.New(routing.Config{Index: index, Rand: rand.NewPCG(1, 1)})
	if err != nil {
		panic(err)
	}
	ledger, err := inflight.New(inflight.Config{})
	if err != nil {
		panic(err)
	}
	ledger.Observe(router.Observer())

	// Per request.
	algorithm, err := router.Resolve("" /* the routing-strategy header */)
	if err != nil {
		panic(err) // 400 Bad Request
	}
	ctx := types.NewRoutingContext("req-1", "llama")
	req := ledger.Admit(ctx.RequestID, ctx.Model)
	defer req.End()
	ctx.Algorithm = algorithm
	ctx.PromptTokenIDs = prompt // nil when tokenization failed
	pods, err := store.ListPodsByModel(ctx.Model)
	if err != nil {
		panic(err) // 404: no pod serves the model
	}
	var d routing.Decision
	if err := router.Route(context.Background(), ctx, store.Snapshots(pods, nil), &d); err != nil {
		panic(err) // 503 when no pod is ready
	}
	attempt := req.Route(d.Route())
	// ... proxy the request to d.Endpoint; when the first streamed token arrives:
	attempt.FirstToken()
	// ... and when the response has been relayed:
	attempt.Close(inflight.Done, "")

	c := d.Chosen()
	fmt.Println(d.Algorithm, d.PodKey, d.Outcome)
	fmt.Printf("%d of %d tokens cached, %d to prefill\n", c.MatchedTokens, d.PromptTokens, c.UncachedTokens)
	// Output:
	// kv-aware default/vllm-1 prefix_hit
	// 32 of 40 tokens cached, 8 to prefill
}
