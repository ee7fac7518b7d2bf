package routingbench

import (
	"fmt"
	"testing"

	"github.com/kvgate/kvgate/pkg/sim"
)

func TestOracleWeighsWhatAnEngineHoldsAgainstTheWorkQueuedOnIt(t *testing.T) {
	cfg := smallFleet()
	cfg.Engines = 2
	f, err := newFleet(cfg.withDefaults())
	if err != nil {
		t.Fatal(err)
	}
	o := newOracle(f, 1)
	w := docsWorkload(2, 1, 1024, 64, 1, 9) // one document, two questions
	warm, asked := w.Requests[0], w.Requests[1]
	hot := f.engines[0]
	add := func(e *engine, id string, prompt []uint32) {
		t.Helper()
		if err := e.eng.Add(sim.RequestSpec{ID: id, Prompt: prompt, MaxTokens: 1}, f.clock()); err != nil {
			t.Fatal(err)
		}
	}
	add(hot, "warm", warm.Prompt)
	for hot.eng.HasWork() {
		end, _ := hot.eng.BeginStep(f.clock())
		hot.eng.EndStep()
		f.now = end.Sub(simEpoch)
	}

	// Engine 0 holds the 1,024-token document: 64 tokens to compute in
	// one step (16.4 ms); engine 1 computes all 1,088 in two steps of at
	// most 1,024 (128.8 ms).
	lat := linearLatency
	if got, want := o.predict(hot, asked.Prompt), lat.StepOverhead+64*lat.PrefillPerToken; got != want {
		t.Errorf("prediction on the engine holding the document %v, want %v", got, want)
	}
	if got, want := o.predict(f.engines[1], asked.Prompt), 2*lat.StepOverhead+1088*lat.PrefillPerToken; got != want {
		t.Errorf("prediction on the empty engine %v, want %v", got, want)
	}
	if e, _ := o.route(1, &asked); e != 0 {
		t.Errorf("routed to engine %d, want 0 which holds the document", e)
	}

	// Three uncached prompts of 1,000 tokens waiting on engine 0 put 3,064
	// tokens (3 steps, 336.4 ms) ahead of the question's first token.
	for i := range 3 {
		add(hot, fmt.Sprint("queued-", i), docsWorkload(1, 1, 1000, 0, 1, uint64(20+i)).Requests[0].Prompt)
	}
	if got, want := o.predict(hot, asked.Prompt), 3*lat.StepOverhead+3064*lat.PrefillPerToken; got != want {
		t.Errorf("prediction behind the queue %v, want %v", got, want)
	}
	if e, _ := o.route(1, &asked); e != 1 {
		t.Errorf("routed to engine %d, want 1 now that engine 0's queue outweighs its cache", e)
	}

	// In the step now starting (112.4 ms), the first queued prompt
	// completes and will decode; the second gets 24 tokens. After it, 976
	// + 1,000 + 64 tokens take 2 steps of 1,023 prefill tokens and one
	// decode token.
	end, _ := hot.eng.BeginStep(f.clock())
	hot.busy, hot.stepEnd = true, end.Sub(simEpoch)
	if b := hot.eng.Backlog(); b != (sim.Backlog{PrefillTokens: 1976, Decoding: 1}) {
		t.Fatalf("backlog %+v, want 1976 tokens to prefill and 1 request decoding", b)
	}
	want := lat.StepOverhead + 1024*lat.PrefillPerToken + 2*(lat.StepOverhead+lat.DecodePerToken) + 2040*lat.PrefillPerToken
	if got := o.predict(hot, asked.Prompt); got != want {
		t.Errorf("prediction during a step %v, want %v", got, want)
	}
}
