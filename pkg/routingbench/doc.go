// Package routingbench measures how well routing policies use the KV caches
// of a fleet: a deterministic discrete-event simulation that replays a
// workload against simulated vLLM engines (package sim) through the
// gateway's real routing algorithms (package routing), request ledger
// (package inflight), prefix index (package indexer) and KV event codec
// (package kvevent), in virtual time.
//
// Run plays a Workload under each policy of a Config, each on a fleet of its
// own, and returns a Report: per policy the token prefix-hit ratio and its
// share of the pooled bound, the share of the hits routing predicted that
// the engines found when the prefill started, time to first token,
// end-to-end latency, queueing, throughput, preemptions and load
// imbalance, as a text table, CSV, JSON and a PNG plot, and whether
// kv-aware meets its targets (Report.Targets). RunSweep runs workloads at
// several loads, fleet sizes and seeds and summarises each point over the
// seeds. The same workload, configuration and seed give the same report,
// byte for byte.
//
// # The simulation
//
// Virtual time advances from event to event on one priority queue: request
// arrivals, engine step ends, metric scrapes and deliveries of KV event
// batches. Events due at the same instant run in a fixed order (step ends,
// deliveries, scrapes, arrivals, then the order they were scheduled), so a
// run has one outcome. An arriving request is routed at once and added to
// its engine; an idle engine with work starts a step (sim.Engine.BeginStep)
// whose end its latency model prices. At the step's end its tokens reach the
// gateway and its event batch is encoded with kvevent.EncodeEventBatch; the
// engine's sim.EventLink (Config.Events) decides when the bytes reach the
// index, or that they never do; then they are decoded with
// kvevent.DecodeEventBatch and applied to an indexer.SyncPrefixHashTable, as
// a ZMQ client would. vLLM caches a step's blocks when it schedules them and
// announces them when the step ends, so the index learns of a prefill some
// hundreds of milliseconds after the engine starts it.
//
// # The engine model
//
// The engines are not the routers' model of them. Their latency model
// (DefaultLatency) prices attention: a prompt token costs its share of the
// weights' work plus a cost per earlier token of its sequence it attends
// to, cached or not, so prefill grows with the square of the context and a
// prefix hit saves less than the routers' linear model believes; a decode
// step costs a fixed overhead plus, per running request, its share of the
// weights' work and a read of its whole context. Engines differ in speed
// (Config.Speeds, by default DefaultSpeeds: A100-, H100- and L40S-class
// GPUs). Their KV events reach the index late, by a fixed delay and an
// exponential one that holds back the batches behind it, and one in a
// thousand never does (Config.Events, DefaultEvents). The routers start
// from a prefill speed twice the routing package's default
// (Config.RouterPrefillTokensPerSecond), so that what they learn from
// scrapes is what is measured.
//
// # Policies
//
// random, least-request, least-kv-cache, least-latency, prefix-cache
// (AIBrix's rules) and kv-aware are a routing.Router running that
// algorithm, called as the gateway calls it: Route with the prompt's token
// ids, then the decision's attempt opened in a request ledger (package
// inflight) when the request is sent, its FirstToken when its first token
// comes back, the usage the engine reports and its Close when it ends.
// They know what a gateway knows:
//   - the index, fed by the engines' events after their delay;
//   - the requests the gateway sent to each engine and has not seen finish,
//     exact at every instant, and the prefills among them;
//   - metrics scraped every Config.ScrapeInterval (default 50 ms, AIBrix's
//     AIBRIX_POD_METRIC_REFRESH_INTERVAL_MS): waiting and running requests
//     and KV-cache usage as of the scrape, and what the Store derives from
//     vLLM's counters: the mean time to first token and inter-token latency
//     over its recent window (Config.MetricsWindow, 10 s), and the prefill
//     speed over a longer one (Config.PrefillSpeedWindow, 1 min; uncached
//     prompt tokens per second of prefill less one step per prefill, see
//     cache.PrefillSample);
//   - not the output length of a request before it ends.
//
// The TTFT oracle (TTFTOracle) sees the engines themselves: a greedy
// minimiser of each request's time to first token with perfect state. For
// each engine it knows, at the moment it decides: how many leading blocks
// of the prompt the KV cache holds (sim.Engine.CachedPrefixBlocks,
// including blocks of a step in flight that no event has announced); the
// exact prompt work queued ahead of the request, every waiting request
// looked up in the cache as it stands (sim.Engine.Backlog and BacklogCost);
// the requests decoding; how long the step in flight still runs; and the
// engine's latency model, speed and token budget. It predicts the request's
// time to first token as that wait plus the steps that prefill the backlog
// and the request's uncached tokens, each step prefilling up to the budget
// left by the decoding requests and priced by the engine's latency model,
// and sends the request to the lowest prediction (exact ties to the fewest
// requests in flight, then at random). It does not foresee requests
// arriving later, evictions by the requests ahead of it, waits for KV space
// or for a sequence slot, or the decode batch changing, and it weighs no
// request but the one it routes: it is a reference for kv-aware's
// prediction, not a bound on what routing achieves.
//
// # The pooled bound
//
// PooledBound is the yardstick of hit ratio: one LRU cache as large as all
// the engines' caches together, over the same requests, which every
// request reaches. Each report carries it, and each policy's hit ratio as a
// share of it.
//
// # Load
//
// EstimateDemand prices a workload's prompt and output tokens with the
// engines' latency model; AtLoad rescales its arrivals so that it asks a
// given share of the fleet's capacity, the rate at which the fleet would be
// busy all the time if it reused no prefix (the most a prefix-blind policy
// sustains). At 1x, policies that reuse prefixes have room to spare, as
// much as their hits save; at 1.5x only they keep up, if they do.
//
// slo-least-load, slo-least-load-pulling and slo-pack-load are the
// SLO-aware algorithms of a routing.Router routed through the gateway's
// per-model queue (slo.QueueRouter) on the simulation's clock: each request
// carries Config.SLO, one no engine is predicted to serve within it waits
// (slo-least-load refuses it at once), and every first token, completion
// and scrape makes a pass over the waiting requests, as in the gateway.
// Requests refused, or that leave the queue without an engine, count as
// refused or expired, never served. They draw from kv-aware's random
// stream: where every engine meets the SLO they decide exactly as kv-aware
// does.
//
// # Overload
//
// RunOverload measures the fleet's capacity within Config.SLO
// (MeasureCapacity: the highest arrival rate, found by bisection, at which
// kv-aware serves CapacityAttainment of the requests in time) unless given
// one, then replays the workload with its arrival times compressed to each
// of OverloadConfig.Loads times that rate under every policy, and reports
// per load and policy the goodput (requests served within the SLO per
// second), the SLO attainment, the TTFT percentiles of the requests served,
// and the requests queued, refused and expired (OverloadReport; Targets
// checks the SLO-aware algorithms' goodput at 2x and their decisions below
// capacity against kv-aware's).
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
//     num_cached_tokens), over the requests that got a first token; and its
//     share of the pooled bound's;
//   - TTFT: arrival at the gateway to first token, mean and nearest-rank
//     p50, p90, p99; queue: arrival to the engine's first scheduling; E2E:
//     arrival to last token;
//   - throughput: completed requests and output tokens per second from the
//     first arrival to the last token;
//   - load imbalance: the coefficient of variation (standard deviation over
//     mean) across engines of the requests each was sent and of the prompt
//     tokens each computed; the largest relative deviation of an engine's
//     requests from the mean of the engines of its speed; per engine, the
//     share of the run spent in steps;
//   - preemptions, KV event batches lost, and requests refused for
//     exceeding the model length.
//
// # Defaults and their sources
//
// DefaultEngine and DefaultLatency stand for an 8B-class model (Llama 3.1
// 8B: 16 GB of weights in bf16, 2 x 8 billion = 16 GFLOP per token for the
// weights, 32 layers of 4,096 dimensions of attention, 32 layers x 8 KV
// heads x 128 dimensions x 2 (K and V) x 2 bytes = 128 KiB of KV cache per
// token) on one A100-80GB, with vLLM's defaults (block size 16, 256
// sequences, chunked prefill in steps of 8,192 tokens):
//   - KV cache: 90% of 80 GB, less the weights and some 4 GB of activations
//     and CUDA graphs, leaves about 52 GB, some 400,000 tokens: 25,000
//     blocks of 16.
//   - Prefill: the A100's 312 dense bf16 TFLOPS at the 55% utilisation
//     large prefill batches reach compute the weights' 16 GFLOP of a token
//     in 90 us; attention adds 4 x 4,096 x 32 = 0.5 MFLOP per earlier token,
//     3.5 ns at 45% utilisation. A prompt of 10,000 tokens takes 0.9 s plus
//     0.18 s of attention; one of 60,000, 5.4 s plus 6.3 s.
//   - Decode: a step reads the 16 GB of weights, 8 ms at the A100's 2 TB/s,
//     plus launch and sampling costs: 10 ms per step; each running request
//     adds its share of the weights' work, 60 us, and reads its KV cache,
//     128 KiB per token of context at 2 TB/s: 64 ns per token. A step
//     decoding 30 requests of 8,000 tokens of context takes 27 ms.
//   - Speeds: an H100 computes some three times an A100's FLOPS with 1.65
//     times its memory bandwidth; 1.8 stands for both. An L40S has a
//     little over half an A100's bandwidth: 0.6.
//
// The Mooncake trace (3,993 requests over 17 minutes, 61 million prompt
// tokens, 22 million of them distinct) asks 1.1 times the capacity of 8
// such engines (the default speeds) at its own rate: a policy blind to
// prefixes cannot keep up. The 8 caches hold 3.2 million tokens: they
// cannot hold everything. The default conversation workload asks a third
// of their capacity at its own rate.
//
// # Workloads
//
// LoadMooncake reads traces in the Mooncake format (timestamp, input and
// output lengths, and one hash id per 512-token block), expanding each hash
// id into 512 fixed token ids (MooncakeBlock) and cutting the last block to
// the input length, so that prompts share exactly the prefixes their hash
// ids share. GenerateConversations generates multi-turn conversations that
// all open with the same instructions and start in bursts, each turn
// carrying the answers the engines generated for the turns before.
// GenerateSharedPrefix generates chats whose conversations share one of a
// few system prompts and whose turns extend the previous turn's prompt;
// GenerateSharedPrefixChats gives the same chats as conversations, for
// clients that replay them in real time, and TokenizeSharedPrefix sends
// them as text through the engines' and the gateway's tokenizers, so that
// the routers route on the ids the gateway computes.
//
// # Determinism
//
// The engines, the routing algorithms (seeded from Config.Seed), the fates
// of the event batches and the event order are deterministic, and the
// simulation reads no wall clock. The index and the pooled bound key blocks
// with hashes seeded at random per process, but matches do not depend on
// the seed short of a 64-bit hash collision. Policies run concurrently
// (Config.Parallel) on separate fleets and share only the read-only
// workload.
package routingbench
