package sim_test

import (
	"fmt"
	"time"

	"github.com/kvgate/kvgate/pkg/sim"
)

// An engine driven in virtual time, as a discrete-event simulation drives
// it: the caller adds requests at their arrival times and runs each step
// from BeginStep to the end it returns.
func Example() {
	engine, err := sim.NewEngine(sim.EngineConfig{
		NumGPUBlocks: 1024,
		HashSeed:     "engine-0",
		Events:       true,
		Latency: sim.LatencyModel{
			StepOverhead:    5 * time.Millisecond,
			PrefillPerToken: 100 * time.Microsecond,
			DecodePerToken:  100 * time.Microsecond,
		},
	})
	if err != nil {
		panic(err)
	}
	system := "You are a helpful assistant for the operators of an inference fleet. Answer in one short " +
		"sentence, cite the document you used, and say so when you do not know the answer. "
	start := time.Unix(1_800_000_000, 0)
	for i, question := range []string{"What is a KV cache?", "Why route by prefix?"} {
		prompt := sim.Tokenizer{}.Encode(system+question, true)
		arrival := start.Add(time.Duration(i) * 100 * time.Millisecond)
		if err := engine.Add(sim.RequestSpec{ID: fmt.Sprint("q", i), Prompt: prompt, MaxTokens: 8}, arrival); err != nil {
			panic(err)
		}
		// Run until idle; a simulation would interleave the arrivals of
		// many requests and engines on one event queue.
		now := arrival
		for engine.HasWork() {
			end, _ := engine.BeginStep(now)
			res := engine.EndStep()
			for _, out := range res.Outputs {
				if out.Finished {
					fmt.Printf("%s: %d prompt tokens, %d cached, TTFT %v, E2E %v\n", out.RequestID,
						out.Stats.PromptTokens, out.Stats.CachedTokens, out.Stats.Timings.TTFT(), out.Stats.Timings.E2E())
				}
			}
			now = end
		}
	}
	fmt.Println("blocks of the system prompt held:", engine.CachedPrefixBlocks(sim.Tokenizer{}.Encode(system, true), nil))
	// Output:
	// q0: 46 prompt tokens, 0 cached, TTFT 9.6ms, E2E 45.3ms
	// q1: 45 prompt tokens, 32 cached, TTFT 6.3ms, E2E 42ms
	// blocks of the system prompt held: 2
}
