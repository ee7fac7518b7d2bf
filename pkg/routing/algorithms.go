package routing

import (
	"slices"
	"strings"
)

// HeaderRoutingStrategy is the request header that names the routing
// algorithm of one request, as in AIBrix.
const HeaderRoutingStrategy = "routing-strategy"

// Names of the routing algorithms, as HeaderRoutingStrategy and
// KVGATE_ROUTING_ALGORITHM spell them. The first five are AIBrix's.
const (
	Random       = "random"
	LeastRequest = "least-request"
	LeastKVCache = "least-kv-cache"
	LeastLatency = "least-latency"
	PrefixCache  = "prefix-cache"
	KVAware      = "kv-aware"
	// The SLO-aware algorithms, AIBrix's names: slo is
	// slo-least-load-pulling.
	SLO                 = "slo"
	SLOLeastLoad        = "slo-least-load"
	SLOLeastLoadPulling = "slo-least-load-pulling"
	SLOPackLoad         = "slo-pack-load"
)

var algorithmNames = []string{Random, LeastRequest, LeastKVCache, LeastLatency, PrefixCache, KVAware,
	SLO, SLOLeastLoad, SLOLeastLoadPulling, SLOPackLoad}

var knownAlgorithms = strings.Join(algorithmNames, ", ")

// Algorithms returns the names of the routing algorithms, in the order
// Explain reports them.
func Algorithms() []string { return slices.Clone(algorithmNames) }

// canonicalName returns the algorithm name equal to name up to case and
// surrounding white space, or false.
func canonicalName(name string) (string, bool) {
	name = strings.TrimSpace(name)
	for _, n := range algorithmNames {
		if strings.EqualFold(n, name) {
			return n, true
		}
	}
	return "", false
}

// IsAlgorithm reports whether name names a routing algorithm, up to case
// and surrounding white space, as the routing-strategy header and
// DefaultAlgorithm may.
func IsAlgorithm(name string) bool {
	_, ok := canonicalName(name)
	return ok
}

// IsSLOAware reports whether name names one of the SLO-aware algorithms,
// which read the request's SLO and may choose no pod (see SLOError).
func IsSLOAware(name string) bool {
	n, _ := canonicalName(name)
	switch n {
	case SLO, SLOLeastLoad, SLOLeastLoadPulling, SLOPackLoad:
		return true
	}
	return false
}

// HoldsRequests reports whether the algorithm name names keeps a request
// that no pod can take within its SLO now waiting until one can (the
// pulling algorithms: slo, slo-least-load-pulling, slo-pack-load), rather
// than refusing it at once (slo-least-load, which pushes).
func HoldsRequests(name string) bool {
	n, _ := canonicalName(name)
	return IsSLOAware(n) && n != SLOLeastLoad
}

// needs says which inputs an algorithm reads, so that a decision gathers
// only those.
type needs uint8

const (
	// needRunning reads the requests each pod runs for this gateway
	// (cache.RealtimeNumRequestsRunning).
	needRunning needs = 1 << iota
	// needQueue reads what predicts a pod's prefill delay: waiting
	// requests, inter-token latency and in-flight prefills.
	needQueue
	// needKVCache reads KV-cache usage.
	needKVCache
	// needLatency reads the mean TTFT and inter-token latency.
	needLatency
	// needMatch queries the prefix index for every candidate.
	needMatch

	needAll = needRunning | needQueue | needKVCache | needLatency | needMatch
)

// algorithm is one routing policy. pick reads the gathered candidates of in
// and records its choice in in.d.
type algorithm interface {
	needs() needs
	pick(in input)
}

// newAlgorithms returns every algorithm configured by cfg, by name.
func newAlgorithms(cfg *Config) map[string]algorithm {
	// A negative tolerance or factor stands for zero (see Config).
	tolerance := max(cfg.TieTolerance, 0)
	slo := sloAware{tolerance: tolerance, minQueue: cfg.MinFleetQueue, profiles: cfg.Profiles,
		defaultSpeed: cfg.DefaultPrefillTokensPerSecond}
	pack := slo
	pack.pack = true
	return map[string]algorithm{
		Random:       randomChoice{},
		LeastRequest: leastRequest{},
		LeastKVCache: leastKVCache{},
		LeastLatency: leastLatency{},
		PrefixCache: prefixCache{
			absCount:  float64(cfg.ImbalanceAbsCount),
			factor:    max(cfg.StdDevFactor, 0),
			cpuWeight: cfg.CPUCacheWeight,
		},
		KVAware:             kvAware{tolerance: tolerance, minQueue: cfg.MinFleetQueue},
		SLO:                 slo,
		SLOLeastLoad:        slo,
		SLOLeastLoadPulling: slo,
		SLOPackLoad:         pack,
	}
}
