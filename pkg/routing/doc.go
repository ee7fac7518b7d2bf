// Package routing chooses the pod that serves each inference request.
//
// A Router holds ten algorithms. A request names one in the routing-strategy
// header (HeaderRoutingStrategy), as with AIBrix; a request naming none gets
// Config.DefaultAlgorithm (KVGATE_ROUTING_ALGORITHM, or AIBrix's
// ROUTING_ALGORITHM; kv-aware unless set); an unknown name is an
// *UnknownAlgorithmError, which the gateway answers with 400:
//
//   - random: a pod drawn uniformly.
//   - least-request: the fewest requests in flight from the gateway.
//   - least-kv-cache: the lowest KV-cache usage.
//   - least-latency: the lowest expected latency of the request, the pod's
//     mean TTFT plus its mean inter-token latency times the predicted output
//     tokens, scaled by the gateway's requests in flight on the pod against
//     the candidates' mean. These means follow the pod's current queue and
//     batch, where a mean end-to-end latency follows the mix of output
//     lengths it happened to serve; but they lag by the Store's window, and
//     the count of requests in flight, which moves with every request the
//     gateway routes, keeps the pod measured fastest from getting every
//     request until its means catch up; the prefill work the gateway has
//     queued on a pod is a floor on its time to first token, so that a pod
//     measured while idle, a pod that just joined above all, takes a
//     burst only until that work reaches the others' latency. A pod's
//     means move only when it serves requests, and may be those of a few
//     long prompts: a pod with no request in flight is scored at most at
//     the candidates' median expected latency, so that it gets a request
//     that measures it again rather than none for as long as its last
//     means exceed the others'. AIBrix's least-latency reads other
//     metrics and counts no request in flight: the engine's mean queue
//     time plus its mean prefill and decode times, each scaled to the
//     fleet's mean prompt and output lengths (see docs/aibrix.md).
//   - prefix-cache: AIBrix's prefix-cache routing on the sync prefix index,
//     with its load-imbalance guard and standard-deviation bound. As in
//     AIBrix, when every prompt opens alike a pod that holds nothing may get
//     no request for as long as the loads stay within both limits.
//   - kv-aware: the least cost of the request in seconds of delay: its
//     predicted time to first token and what its prefill delays other
//     requests (below).
//   - slo-least-load, slo-least-load-pulling (also named slo) and
//     slo-pack-load, AIBrix's SLO-aware family: a pod predicted to serve
//     the request within its service-level objective, or none (see SLOs
//     below).
//
// Ties go to the pod with the fewest requests in flight, then to one drawn
// from Config.Rand, so a seeded source makes decisions reproducible.
//
// A decision reads only memory: the prefix index (PrefixIndex, the
// indexer's SyncPrefixHashTable) and one snapshot per candidate
// (cache.PodSnapshot, which the Store gathers with one registry lookup per
// pod): the pod's identity, its scraped metrics and their scrape state,
// its ejection, and its load record in the request ledger, which holds
// the gateway's requests and prefills in flight on it. The index is an
// interface, the snapshots are values and the clock is a Config field, so
// that a simulation can drive the same code in virtual time. Route returns
// the chosen pod and, per candidate, the inputs that justified it
// (Decision); Explain runs every algorithm on one set of snapshots for the
// gateway's debug API.
//
// # Pods without fresh metrics
//
// A pod's scraped metrics (waiting requests, KV-cache usage, latencies,
// prefill speed) are fresh when its latest scrape succeeded, as its
// snapshot's Scrape state tells. A pod whose scrapes
// fail keeps its last values and a pod not scraped yet has none: either
// reads as idle, no queue and no latency, although such a pod is most
// likely down, restarting or too loaded to answer. So while some candidates
// have fresh metrics, every algorithm but random chooses among those only;
// the others stay in the decision, with their Candidate.Scrape state, but
// are left out of the choice and of the statistics it compares against
// (prefix-cache's load bound, the median latency least-latency gives
// unmeasured pods, the best cached prefix of kv-aware's outcome). When no
// candidate has fresh metrics (scraping is off, or every pod fails), stale
// and unscraped pods are ranked alike on what is known. least-request reads
// only the gateway's own request counts but follows the same rule: a pod
// that cannot be scraped is the likeliest to refuse the next request too.
// random reads no metric and draws among every candidate. Pods that refused
// connections are the gateway's to leave out before routing (see
// cache.Store.EjectPod).
//
// # kv-aware: the cost model
//
// kv-aware sends a request to the candidate pod p where it costs least, in
// seconds of delay to its own first token and to the other requests:
//
//	C(p) = TTFT(p) + U(p)/S(p) x N(p) + U(p)/S x K
//
// TTFT(p) is the request's predicted time to first token on p,
//
//	TTFT(p) = Q(p) + U(p)/S(p) + D(p)
//
// S(p) is how fast p prefills, in tokens per second: the Store's
// PrefillTokensPerSecond, the prompt tokens the engine computed per second of
// computing them over the last minute or so (each prefill's time less one
// engine step, see cache.PrefillSample). A pod not measured yet, or whose
// prefills have been too short to tell (nearly all cache hits) for more
// than a window, is given the median speed of the measured candidates, which serve the same model; with
// none measured, Config.DefaultPrefillTokensPerSecond. A measured speed is
// believed, lower or higher than the others': a pod that prefills at half
// the speed of the rest is predicted twice as slow for the same work, so it
// gets a request where that is still the soonest first token: less than
// half the others' prefill work while they can take the load, about half
// once every pod queues.
//
// U(p) is the prompt's prefill work on p, in tokens:
//
//	U(p) = P - G(p) - w x (M(p) - G(p))
//
// P is the prompt's length, M(p) the length of its prefix that p holds in any
// medium and G(p) the part of it in GPU memory (both from the index, in whole
// blocks, so a trailing partial block always counts as work, as vLLM
// recomputes it). For a pod that serves several data-parallel ranks behind
// one port, both are of the rank holding the longest prefix. The decision
// names that rank (Decision.DPRank), for the gateway to send the request
// there with vLLM's X-data-parallel-rank header, when the pod's ranks
// start at 0 and the rank holds strictly more of the prefix than each
// other rank; otherwise, and when the gateway leaves the rank to the
// engine to spread a hot prefix, the engine chooses the rank by load, and
// a request for a prefix one rank holds may run on another and compute it
// again. GPU-resident tokens cost nothing to reuse. Tokens held only
// in CPU memory or storage must be copied back, which is cheaper than
// computing them but not free; w, Config.CPUCacheWeight, is the share of
// their prefill time the copy saves.
//
// Q(p) is the prefill work queued ahead of the request on p, in seconds:
//
//	Q(p) = max(A(p), max(0, W(p) - E(p)) x T / S(p))
//
// A(p) is the work left in the prefills this gateway started on p (see
// In-flight prefills below), which counts this gateway's requests from the
// moment they are sent. W(p) is the engine's number of waiting requests at
// the last scrape, T the running mean of the uncached tokens of the requests
// this gateway sent: the scrape lags, but counts every gateway's requests. A
// request of this gateway that waits in the engine appears in both, hence
// the larger of the two rather than their sum. E(p) is how many of the
// waiting requests the scrape counted this gateway knows to have left the
// queue since: of its requests to p sent before the scrape and not yet
// prefilled then, the engine prefills the older first, so the older are
// taken to have been running and the W(p) newer to have been waiting, and
// E(p) counts those of the waiting ones whose first token has come back, or
// that have ended, since. Without it, for up to a scrape interval after a
// request ends, the pod holding its prefix would be charged a prefill for
// it and could lose the next request for the same prefix to an idle pod.
// When other gateways' requests are queued among this one's, E(p) may count
// a request that was running at the scrape; the queue then reads short by as
// many until the next scrape.
//
// D(p) is p's recent mean inter-token latency (the Store's AvgTPOTSeconds),
// the decode interference: the first token comes out of an engine step that
// also advances every request p is decoding, and such a step lasts about one
// inter-token interval, longer the larger p's batch. It is what separates a
// pod decoding a large batch from an idle one when the cache makes the
// prefill itself cheap. It is the step S(p) is measured without.
//
// The other two terms are what the request's prefill costs the others, for
// a request lives longer than its first token and so do its neighbours.
// N(p) is the number of requests decoding on p: the gateway's requests in
// flight there less those whose prefill has not produced a first token (see
// In-flight prefills). vLLM runs a prefill in the same steps as the batch
// it decodes, so each of them waits for the prefill's U(p)/S(p) seconds
// before its next token: a prefill on a pod decoding twenty requests costs
// twenty times its duration in their latency. It is what keeps a pod busy
// decoding from taking every request whose prefix it holds, and spreads
// cold prompts over the pods with the fewest requests to hold up, even when
// a pod decoding many would serve the first token sooner; its prefill
// speed counts too, so a pod at half speed gets work when the others are
// busy decoding, but no more than in proportion to its speed.
//
// K is the number of prefills this gateway has queued on the least queued
// candidate, and S the candidates' mean prefill speed. When every pod has
// prefills queued, the fleet is saturated: a prefill anywhere adds its
// tokens to the work every queued request waits for, since routing moves
// new work away from the most loaded pods, and the fleet drains that work
// at its speed, S, wherever it runs. A cold prefill where the prompt is not
// cached then costs the fleet more than the wait in the queue of the pod
// that holds it, and kv-aware keeps its cache hits under overload, where
// minimising each request's own first token alone would trade them for
// shorter queues and make every queue longer. K is never less than
// Config.MinFleetQueue, one half by default, even while a pod has no
// prefill queued: a fleet busy enough for routing to matter is seldom idle
// for long, and the requests arriving while a prefill runs find less
// capacity free, wherever it ran. This floor is the model's one weight,
// set on the routing benchmark (see the README). Without it (a negative
// MinFleetQueue), kv-aware computes prefixes again on idle pods and the
// requests arriving next wait for that work; with it, kv-aware keeps more
// of its cache hits at and below the fleet's capacity, for somewhat longer
// queues on the pods holding hot prefixes beyond it.
//
// Every other term is a time, so the model otherwise trades cache hits
// against load with no weight to tune: a cached prefix is worth the
// prefill time it saves, to the request and to those it would hold up,
// and a queue costs the time it takes to drain. A pod holding the prompt's
// prefix keeps its requests until the work queued on it outweighs what its
// cache saves; then the request goes to a pod that computes the prefix,
// and holds it from then on, so that a hot prefix is replicated as far as
// its load needs and no further. Costs within Config.TieTolerance of the
// lowest are ties, broken by the least prefill work (see Prompts in
// flight), then by running requests, then at random, so that prompts no
// pod holds spread over the idle pods (whose caches then hold different
// prefixes) instead of all going to the pod measured marginally faster.
//
// What the model leaves out: the request's own decoding, whose length the
// gateway does not know when it routes and whose pace differs between pods
// by their batch, which N(p) already weighs; and the KV memory the request
// will hold, which vLLM guards itself, queueing a request it cannot fit and
// preempting the newest when decoding outgrows the cache: both show in the
// engine's waiting requests, W(p) below. Predicting a step's time from the
// batch, or the risk of preemption from the scraped KV-cache usage, made
// placement worse in the routing benchmark: the inter-token latencies vLLM
// reports include the long steps of other requests' prefills, and usage is
// high on every pod of a loaded fleet.
//
// # In-flight prefills
//
// The gateway records every attempt to serve a request in the request
// ledger (package inflight): Decision.Route gives the attempt's route (the
// chosen pod's load record, the uncached tokens U, the prefill time U/S, the
// predicted time to first token), inflight.Request.Route opens it when the
// request is sent, and the attempt's FirstToken or Close ends its prefill.
// Per pod, the prefills started form a first-come first-served queue, the
// order in which vLLM admits and prefills requests. Each adds U/S seconds
// of work: a prefill started at time t is predicted done at
// F = max(F', t) + U/S, F' being the prediction for the one started before
// it, and A(p) = max(0, F - now) for the last one. The queue drains with time
// even when no first token is reported, as for a response that is not
// streamed. A first token proves that its prefill and every prefill started
// on the pod before it are done: they leave the queue, and the rest of the
// queue is predicted from that moment, F = now + the rest's U/S. A close
// without a first token proves less, that the prefill ended some time
// before: it and the ones before it leave the queue, and F only moves
// earlier, to now + the rest's U/S if that is earlier. A request that does
// not end within the ledger's TTL is reaped, its prefill dropped and
// counted. The Router follows the attempts through its Observer: their
// uncached tokens feed the running mean T, and their first tokens the
// prediction ratio.
//
// # Prompts in flight
//
// The index learns that a pod holds a prefix when the pod's prefill of it
// ends, which under load is many seconds after the request was routed. The
// engine, though, prefills its requests first come first served and keeps
// a running request's blocks, so a request sharing the prefix of one sent
// to a pod before it will find that prefix cached there. The Router
// therefore remembers the prompt blocks of every attempt open on each pod,
// from the attempt's opening to its close (at most
// Config.MaxInFlightPrefixBlocks; an attempt beyond it is not remembered,
// and counted), and kv-aware and the SLO-aware algorithms take M(p) as the
// longer of the index's match and the in-flight one
// (Candidate.InFlightMatchedBlocks). Within the tie tolerance, the pod with
// the least prefill work left (the longest cached prefix) wins before the
// fewest requests in flight: once queues grow to seconds, 5% of a predicted
// TTFT is more than a cached prefix saves, and the tie rule would
// otherwise decide.
//
// # SLOs
//
// A request routed by an SLO-aware algorithm carries its model's objective
// (RoutingContext.SLO, set by the caller, see package slo): a time to first
// token, optionally growing with the prompt's length, a mean time per
// output token, an end-to-end latency, each counted from the request's
// arrival at the gateway. For each candidate the algorithm predicts
//
//	TTFT(p) as kv-aware does, after the time the request already spent;
//	TPOT(p) = max(p's measured inter-token latency, its GPU profile's TPOT
//	          at the request's output and prompt lengths);
//	E2E(p)  = TTFT(p) + TPOT(p) x (predicted output tokens - 1),
//
// the output length coming from the model's output predictor
// (RoutingContext.PredictedOutputTokens). The SLO budget is the largest
// share of a target the predictions use; a pod meets the SLO when its
// budget is at most 1 + Config.TieTolerance (Candidate.SLOBudget,
// SLOVerdict). A pod that meets it is full when the request's pending load
// by the GPU profile of the pod's deployment (1/(throughput x latency) at
// its shape, cache.ProfilePoint.PendingLoad) added to the pending load of
// the requests in flight there, this gateway's and, as shared through
// Redis, the other replicas' (inflight.PodLoad.PendingLoad), exceeds 1; or
// when, while the model's queue is contended (a request waited or was
// refused within the last two seconds, RoutingContext.SLOContended), more
// prefill work than the SLO's base TTFT is queued on it and the request's
// own prefill there would take more than a tenth of that base: the gateway
// then holds, in deadline order, what the engine's first-come first-served
// queue would make every later request wait behind, and lets on what adds
// little to it, mostly cache hits, which holding back would turn away the
// cheapest work there is.
//
// slo-least-load and slo-least-load-pulling take kv-aware's choice when it
// meets the SLO and is not full, ties included, so that below capacity
// they decide as kv-aware does but for the requests kv-aware would send to
// a pod predicted to miss; otherwise they choose as kv-aware does among the
// pods that meet the SLO and are not full.
// slo-pack-load, while the queue is contended, chooses the
// pod whose budget is the most used, keeping the others' headroom, and
// otherwise chooses as least-load. A request without an objective is
// routed as kv-aware routes it. When no pod qualifies, Route fails with an
// *SLOError: Unmeetable (wrapping cache.ErrSLOFailureRequest) when no
// candidate could meet the SLO even with nothing queued, prefilling at the
// fastest speed measured or configured; otherwise (wrapping
// cache.ErrLoadCapacityReached) with the Slack the request can still wait
// and the Drain of the shortest queue, from which the caller's queue
// decides how long the request waits and what Retry-After to answer. The
// outcomes slo_wait and slo_unmeetable count these decisions. The pulling
// algorithms (HoldsRequests: slo, slo-least-load-pulling, slo-pack-load)
// wait in the queue; slo-least-load refuses at once.
//
// # Outcomes and metrics
//
// Each decision has an Outcome: random, load (a load algorithm's metric),
// prefix_hit (the chosen pod holds the longest cached prefix), load_over_prefix
// (a pod holding more of the prompt was passed over for its load),
// load_fallback (no candidate holds any of a tokenized prompt, or there is no
// index), imbalance_guard (prefix-cache's guard), no_tokens (no token ids:
// a prefix algorithm routed on load), slo_wait or slo_unmeetable (no pod
// for an SLO-aware algorithm, see SLOs). New registers on
// Config.Registerer:
//
//	kvgate_routing_decisions_total{algorithm,outcome}   decisions
//	kvgate_routing_matched_fraction{algorithm}          share of a tokenized prompt the chosen pod holds
//	kvgate_routing_decision_duration_seconds{algorithm} time to decide, after tokenization
//	kvgate_routing_ttft_prediction_ratio                TTFT seen at FirstToken / kv-aware's prediction
//	kvgate_routing_inflight_prefix_dropped_total        attempts whose prompt blocks were not remembered
//	kvgate_routing_cached_tokens_predicted_total        prompt tokens a decision counted as cached on its pod
//	kvgate_routing_cached_tokens_found_total            the part of them the engine found cached
//	kvgate_routing_cached_tokens_reported_total         cached tokens the engines reported
//
// The three cached-token counters cover the attempts whose engine reported
// usage.prompt_tokens_details.cached_tokens (vLLM with
// --enable-prompt-tokens-details). Found below predicted means hits routing
// counted on were gone when the prefill started: evicted while the request
// waited in a long queue on a pod short of KV memory, or never where the
// index said. A prompt cached whole shows one block short, as vLLM
// computes at least its last token.
//
// The request ledger registers the in-flight prefill gauges
// (kvgate_routing_inflight_prefills, kvgate_routing_inflight_prefill_tokens)
// and kvgate_routing_inflight_prefills_expired_total.
//
// Each decision is logged at verbosity 4 with the chosen pod's inputs, and
// with every candidate's at verbosity 5.
package routing
