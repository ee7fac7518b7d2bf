// Package routingbench measures how well routing policies use the KV caches
// of a fleet: a deterministic discrete-event simulation that replays a
// workload against simulated vLLM engines (package sim) through the
// gateway's real routing algorithms (package routing), prefix index
// (package indexer) and KV event codec (package kvevent), in virtual time.
//
// Run plays a Workload under each policy of a Config, each on a fleet of its
// own, and returns a Report: per policy the token prefix-hit ratio, time to
// first token, queueing, throughput and load imbalance, as a text table,
// CSV, JSON and a PNG plot, and whether kv-aware meets its targets
// (Report.Targets). The same workload, configuration and seed give the same
// report, byte for byte.
//
// # The simulation
//
// Virtual time advances from event to event on one priority queue: request
// arrivals, engine step ends, metric scrapes and deliveries of KV event
// batches. Events due at the same instant run in a fixed order (step ends,
// deliveries, scrapes, arrivals, then the order they were scheduled), so a
// run has one outcome. An arriving request is routed at once and added to
// its engine; an idle engine with work starts a step (sim.Engine.BeginStep)
// whose end the latency model prices. At the step's end its tokens reach the
// gateway and its event batch is encoded with kvevent.EncodeEventBatch; after
// Config.EventDelay (default 5 ms: vLLM's publisher thread, the pod network
// and the client's decoding) the bytes are decoded with
// kvevent.DecodeEventBatch and applied to an indexer.SyncPrefixHashTable, as
// a ZMQ client would. vLLM caches a step's blocks when it schedules them and
// announces them when the step ends, so the index learns of a prefill some
// hundreds of milliseconds after the engine starts it.
//
// # Policies
//
// random, least-request, prefix-cache (AIBrix's rules) and kv-aware are a
// routing.Router running that algorithm, called as the gateway calls it:
// Route with the prompt's token ids, then the decision's attempt opened in a
// request ledger (package inflight) when the request is sent, its
// FirstToken when its first token comes back and its Close when it ends.
// They know what a gateway knows:
//   - the index, fed by the engines' events after the delay;
//   - the requests the gateway sent to each engine and has not seen finish
//     (the Store's realtime running requests), exact at every instant;
//   - metrics scraped every Config.ScrapeInterval (default 50 ms, AIBrix's
//     AIBRIX_POD_METRIC_REFRESH_INTERVAL_MS): waiting and running requests
//     and KV-cache usage as of the scrape, and what the Store derives from
//     vLLM's counters: the mean time to first token and inter-token latency
//     over its recent window (Config.MetricsWindow, 10 s), and the prefill
//     speed over a longer one (Config.PrefillSpeedWindow, 1 min; uncached
//     prompt tokens per second of prefill less one step per prefill, see
//     cache.PrefillSample);
//   - not the output length of a request.
//
// The oracle sees the engines themselves. For each engine it knows, at the
// moment it decides: how many leading blocks of the prompt the KV cache
// holds (sim.Engine.CachedPrefixBlocks, including blocks of a step in
// flight that no event has announced); the exact prompt work queued ahead of
// the request, every waiting request looked up in the cache as it stands
// (sim.Engine.Backlog); the requests decoding; how long the step in flight
// still runs; and the engine's latency model and token budget. It predicts
// the request's time to first token as that wait plus the steps that
// prefill the backlog and the request's uncached tokens, each step prefilling
// up to the budget left by the decoding requests and priced by the latency
// model, and sends the request to the lowest prediction (exact ties to the
// fewest requests in flight, then at random). It does not foresee requests
// arriving later, evictions by the requests ahead of it, waits for KV space
// or for a sequence slot, or the decode batch changing.
//
// # Gateway replicas
//
// With Config.Replicas n > 1, every policy but the oracle runs as n gateway
// replicas following the same index: request i arrives at replica i mod n,
// and each replica routes with a Router, request ledger and load records of
// its own, so that it counts only the requests it sent. Every
// Config.ShareInterval of virtual time the replicas share what they have in
// flight (running requests, queued prefill work, prompt blocks) through
// redisstate.ShareInProcess, as the gateway's redisstate.SharedCounts does
// through Redis; each replica's view of the others is then at most one
// interval old (a real replica's, which publishes and reads on its own
// ticker, up to about two). With Config.Unshared they share nothing, as
// replicas without Redis.
//
// # Metrics
//
//   - hit ratio: the prompt tokens engines took from their prefix cache over
//     all prompt tokens, as the engines report them (vLLM's
//     num_cached_tokens), over the requests that got a first token;
//   - TTFT: arrival at the gateway to first token, mean and nearest-rank
//     p50, p90, p99; queue: arrival to the engine's first scheduling; E2E:
//     arrival to last token;
//   - throughput: completed requests and output tokens per second from the
//     first arrival to the last token;
//   - load imbalance: the coefficient of variation (standard deviation over
//     mean) across engines of the requests each was sent and of the prompt
//     tokens each computed; per engine, the share of the run spent in steps;
//   - preemptions, and requests refused for exceeding the model length.
//
// # Defaults and their sources
//
// DefaultEngine and DefaultLatency stand for an 8B-class model (Llama 3.1
// 8B: 16 GB of weights in bf16, 2 x 8 billion = 16 GFLOP and 32 layers x 8
// KV heads x 128 dimensions x 2 (K and V) x 2 bytes = 128 KiB of KV cache
// per token) on one A100-80GB, with vLLM's defaults (block size 16, 256
// sequences, chunked prefill in steps of 8,192 tokens):
//   - KV cache: 90% of 80 GB, less the weights and some 4 GB of activations
//     and CUDA graphs, leaves about 52 GB, some 400,000 tokens: 25,000
//     blocks of 16.
//   - Prefill: 100 us per token, 10,000 tokens per second. The A100's 312
//     dense bf16 TFLOPS at the 55-60% utilisation large prefill batches
//     reach, over 16 GFLOP per token plus causal attention over prompts of
//     some 10,000 tokens (4 x 4,096 x 32 FLOP per earlier token, 2.6 GFLOP
//     per token on average), give 9,000 to 10,000 tokens per second; an
//     H100 (989 TFLOPS) roughly doubles it.
//   - Decode: a step reads the 16 GB of weights, 8 ms at the A100's 2 TB/s,
//     plus launch and sampling costs: 10 ms per step; and each running
//     request's KV cache, 1 GB for 8,000 tokens of context: 0.5 ms per
//     request. A step decoding 30 requests takes 25 ms.
//
// The Mooncake trace (3,993 requests over 17 minutes, 61 million prompt
// tokens, 22 million of them distinct) asks 60,000 prompt tokens per second
// of a fleet that prefills 80,000 with 8 such engines, and the 8 caches
// hold 3.2 million tokens: they cannot hold everything, and a policy blind
// to prefixes loads the fleet to three quarters, where queues form.
// DefaultSharedPrefix has more system prompts than one engine holds. At
// H100-class speeds a policy blind to prefixes loads the same fleet only
// to half; the repository's README shows how the results move with speed
// and cache size.
//
// # Workloads
//
// LoadMooncake reads traces in the Mooncake format (timestamp, input and
// output lengths, and one hash id per 512-token block), expanding each hash
// id into 512 fixed token ids (MooncakeBlock) and cutting the last block to
// the input length, so that prompts share exactly the prefixes their hash
// ids share. GenerateSharedPrefix generates multi-turn chats whose
// conversations share one of a few system prompts and whose turns extend
// the previous turn's prompt; GenerateSharedPrefixChats gives the same
// chats as conversations, for clients that replay them in real time.
//
// # Determinism
//
// The engines, the routing algorithms (seeded from Config.Seed) and the
// event order are deterministic, and the simulation reads no wall clock.
// The index keys blocks with a hash seeded at random per process, but
// matches do not depend on the seed short of a 64-bit hash collision.
// Policies run concurrently (Config.Parallel) on separate fleets and share
// only the read-only workload.
package routingbench
