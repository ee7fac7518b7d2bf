package routing

import (
	"slices"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/inflight"
)

// Outcome says what decided a routing decision. It labels
// kvgate_routing_decisions_total.
type Outcome string

// Outcomes of a decision.
const (
	// OutcomeRandom: the random algorithm drew the pod.
	OutcomeRandom Outcome = "random"
	// OutcomeLoad: a load algorithm (least-request, least-kv-cache,
	// least-latency) chose the pod by its metric.
	OutcomeLoad Outcome = "load"
	// OutcomePrefixHit: the chosen pod holds the longest cached prefix of
	// the prompt among the candidates.
	OutcomePrefixHit Outcome = "prefix_hit"
	// OutcomeLoadOverPrefix: a pod holding more of the prompt was passed
	// over for its load (prefix-cache's load bound, or kv-aware predicting
	// it slower).
	OutcomeLoadOverPrefix Outcome = "load_over_prefix"
	// OutcomeLoadFallback: the prompt was tokenized but no candidate holds
	// any of it (or there is no index), so the pod was chosen on load.
	OutcomeLoadFallback Outcome = "load_fallback"
	// OutcomeImbalanceGuard: prefix-cache found the candidates' loads too
	// far apart and sent the request to the least loaded pod.
	OutcomeImbalanceGuard Outcome = "imbalance_guard"
	// OutcomeNoTokens: the request carries no token ids (tokenization
	// failed or is off), so a prefix algorithm chose on load.
	OutcomeNoTokens Outcome = "no_tokens"
	// OutcomeSLOWait: an SLO-aware algorithm found no pod predicted to
	// meet the request's SLO now, though one could once its queue drains:
	// no pod was chosen.
	OutcomeSLOWait Outcome = "slo_wait"
	// OutcomeSLOUnmeetable: an SLO-aware algorithm found no pod that could
	// meet the request's SLO even with nothing queued: no pod was chosen.
	OutcomeSLOUnmeetable Outcome = "slo_unmeetable"
)

// Decision is a routing decision and the inputs that justified it. Route
// overwrites every field; a caller that reuses one Decision lets Route run
// without allocating once its slices have grown. The JSON form is the one
// the gateway's debug API serves.
type Decision struct {
	// Algorithm is the algorithm that decided.
	Algorithm string `json:"algorithm"`
	// Outcome says what decided.
	Outcome Outcome `json:"outcome"`
	// Endpoint is the chosen pod, shared with the caller's pod list.
	Endpoint *endpoint.Endpoint `json:"-"`
	// PodKey is the chosen pod's "namespace/name".
	PodKey string `json:"pod"`
	// PromptTokens is the number of prompt tokens routed on: the token
	// ids' count, or the request's token count when it has no ids.
	PromptTokens int `json:"promptTokens"`
	// BlockSize and PromptBlocks describe how the prompt was matched
	// against the prefix index; both are 0 when it was not.
	BlockSize    int `json:"blockSize"`
	PromptBlocks int `json:"promptBlocks"`
	// LoadLimit is prefix-cache's bound on the running requests of a pod
	// chosen for its match (mean + factor x standard deviation), 0 for
	// other algorithms.
	LoadLimit float64 `json:"loadLimit,omitempty"`
	// Candidates has one entry per candidate pod, in the order given.
	Candidates []Candidate `json:"candidates"`
	// DPRank is the data-parallel rank of the chosen pod that the request
	// should run on, for vLLM's X-data-parallel-rank header; -1 for none.
	// A decision that matched the prompt against the index (the prefix
	// algorithms) names one when the pod serves several ranks behind its
	// one port (endpoint.Endpoint.DPSize above 1), numbered from 0
	// (DPStartRank 0: the header indexes the engine's own ranks), and one
	// of its ranks holds strictly more of the prompt's prefix than any
	// other (see indexer.PodMatch.Rank). Otherwise the engine balances the
	// request over its ranks by load.
	DPRank int `json:"dpRank"`

	chosen int
	// sloErr is why an SLO-aware algorithm chose no pod, nil otherwise.
	sloErr *SLOError
	// promptBlocks are the keys of the prompt's whole blocks, for the
	// in-flight prefixes (see inFlightPrefixes); empty when not computed.
	promptBlocks []uint64
}

// Route returns the route of an attempt sent to the chosen pod, for the
// request ledger (inflight.Request.Route): the pod's load record, the
// prompt's length, the uncached tokens the decision predicted for the pod,
// the time the pod takes to prefill them at its prefill speed, and the
// predicted time to first token. It returns a Route without a pod before a
// decision.
func (d *Decision) Route() inflight.Route {
	c := d.Chosen()
	if c == nil {
		return inflight.Route{}
	}
	rt := inflight.Route{Pod: c.load, Endpoint: c.ep, PromptTokens: d.PromptTokens, UncachedTokens: c.uncached,
		PredictedTTFTSeconds: c.PredictedTTFTSeconds}
	if len(d.promptBlocks) > 0 {
		rt.PromptBlocks = slices.Clone(d.promptBlocks)
	}
	if c.PrefillTokensPerSecond > 0 {
		rt.PrefillSeconds = c.uncached / c.PrefillTokensPerSecond
	}
	return rt
}

// SLOError returns why an SLO-aware algorithm chose no pod, nil when it
// chose one or another algorithm decided.
func (d *Decision) SLOError() *SLOError { return d.sloErr }

// Chosen returns the chosen pod's candidate entry, nil before a decision
// and when none was chosen.
func (d *Decision) Chosen() *Candidate {
	if d.Endpoint == nil || d.chosen >= len(d.Candidates) {
		return nil
	}
	return &d.Candidates[d.chosen]
}

// Candidate holds what a decision knew about one candidate pod. Inputs an
// algorithm does not read are left zero, except that the chosen pod's match
// and uncached tokens are always filled in (Route needs them) and
// Explain gathers every input.
type Candidate struct {
	// Pod is the pod's "namespace/name".
	Pod string `json:"pod"`
	// Score is the value the algorithm ranked the pod by: running
	// requests (least-request), KV-cache usage (least-kv-cache), expected
	// latency in seconds scaled by the requests in flight (least-latency),
	// weighted matched share of the prompt (prefix-cache), the cost of the
	// request in seconds of delay, its own time to first token and what its
	// prefill delays other requests (kv-aware); 0 for random.
	Score float64 `json:"score"`

	// Running is the number of requests this gateway (or, with shared
	// counts, the fleet of gateways) has sent to the pod and not seen
	// complete.
	Running float64 `json:"running"`
	// Waiting is the engine's queue of requests not yet scheduled, as
	// last scraped. WaitingEnded is how many of them were this gateway's
	// requests whose first token came back, or that ended, since the
	// scrape: no longer waiting. Of its requests sent before the scrape and
	// not prefilled by then, the older are taken to have been running and
	// the newer, as many as Waiting, waiting, as the engine prefills
	// requests in the order they arrive.
	Waiting      float64 `json:"waiting"`
	WaitingEnded int     `json:"waitingEnded"`
	// KVCacheUsage is the engine's KV-cache usage (0..1), as last scraped.
	KVCacheUsage float64 `json:"kvCacheUsage"`
	// AvgTTFTSeconds and AvgTPOTSeconds are the engine's recent mean time
	// to first token and inter-token latency; 0 when not measured.
	AvgTTFTSeconds float64 `json:"avgTTFTSeconds"`
	AvgTPOTSeconds float64 `json:"avgTPOTSeconds"`
	// PrefillTokensPerSecond is the prefill speed the prediction used;
	// SpeedSource says where it came from.
	PrefillTokensPerSecond float64     `json:"prefillTokensPerSecond"`
	SpeedSource            SpeedSource `json:"speedSource,omitempty"`

	// InFlightPrefills and InFlightPrefillTokens count the prefills this
	// gateway started on the pod that have not produced a first token;
	// QueueSeconds is the prefill work predicted ahead of a new request.
	InFlightPrefills      int     `json:"inFlightPrefills"`
	InFlightPrefillTokens int     `json:"inFlightPrefillTokens"`
	QueueSeconds          float64 `json:"queueSeconds"`
	// Decoding is how many of the running requests have had their first
	// token (Running less InFlightPrefills): decoding, each next token of
	// theirs waits for any prefill the pod runs (kv-aware only).
	Decoding float64 `json:"decoding,omitempty"`

	// MatchedBlocks is the number of the prompt's leading blocks the pod
	// holds in any medium, MatchedGPUBlocks the part of them in GPU memory;
	// MatchedTokens and MatchedGPUTokens are the same in tokens.
	MatchedBlocks    int `json:"matchedBlocks"`
	MatchedGPUBlocks int `json:"matchedGPUBlocks"`
	MatchedTokens    int `json:"matchedTokens"`
	MatchedGPUTokens int `json:"matchedGPUTokens"`
	// InFlightMatchedBlocks is the number of the prompt's leading blocks
	// that requests in flight on the pod hold: sent there, not yet ended,
	// and so computed before this request or running with their blocks
	// kept. The index learns of them only once their prefill ends.
	// InFlightMatchedTokens is the same in tokens. The prefill work
	// (UncachedTokens) counts the longer of the two prefixes as cached,
	// in-flight blocks as GPU-resident.
	InFlightMatchedBlocks int `json:"inFlightMatchedBlocks"`
	InFlightMatchedTokens int `json:"inFlightMatchedTokens"`
	// UncachedTokens is the prefill work predicted for the prompt on the
	// pod, in tokens: the prompt less its cached prefix, CPU-only tokens
	// discounted by the CPU cache weight.
	UncachedTokens int `json:"uncachedTokens"`
	// PredictedTTFTSeconds is kv-aware's predicted time to first token.
	PredictedTTFTSeconds float64 `json:"predictedTTFTSeconds,omitempty"`
	// PredictedTPOTSeconds and PredictedE2ESeconds are the SLO-aware
	// algorithms' predicted inter-token and end-to-end latencies: the
	// pod's measured inter-token latency, or its GPU profile's when
	// higher, and the time to first token plus that latency for each
	// further predicted output token.
	PredictedTPOTSeconds float64 `json:"predictedTPOTSeconds,omitempty"`
	PredictedE2ESeconds  float64 `json:"predictedE2ESeconds,omitempty"`
	// PendingLoad is the share of the pod's profiled capacity the requests
	// in flight on it take, every gateway's (see
	// cache.PendingLoadProvider); 0 without GPU profiles.
	PendingLoad float64 `json:"pendingLoad,omitempty"`
	// SLOBudget is the largest share of one of the request's SLO targets
	// the predictions use, its wait so far included: at most 1 (plus the
	// tie tolerance, within which predictions are equal) meets the
	// SLO. SLOVerdict is the SLO-aware algorithms' verdict on the pod.
	SLOBudget  float64    `json:"sloBudget,omitempty"`
	SLOVerdict SLOVerdict `json:"sloVerdict,omitempty"`
	// Scrape says how current the pod's scraped metrics are (fresh,
	// stale or none), as its snapshot tells; empty for random.
	Scrape cache.ScrapeState `json:"scrape,omitempty"`

	ep       *endpoint.Endpoint
	load     *inflight.PodLoad
	uncached float64 // UncachedTokens before rounding
	measured uint8   // has* bits
	// rank is the index's rank of the pod holding MatchedBlocks, and
	// otherRankBlocks the longest run of its other ranks.
	rank, otherRankBlocks int
}

// SpeedSource says where a pod's prefill speed came from.
type SpeedSource string

// Sources of a prefill speed.
const (
	// SpeedMeasured: the pod's own cache.PrefillTokensPerSecond.
	SpeedMeasured SpeedSource = "measured"
	// SpeedModelMedian: the median measured speed of the candidates, for
	// a pod not measured.
	SpeedModelMedian SpeedSource = "model_median"
	// SpeedDefault: Config.DefaultPrefillTokensPerSecond, no candidate
	// being measured.
	SpeedDefault SpeedSource = "default"
)
