package main

import (
	"cmp"
	"context"
	"math"
	"net/http"
	"slices"

	"github.com/kvgate/kvgate/pkg/localfleet"
)

// decisionsMetric counts the gateway's routing decisions by algorithm and
// outcome.
const decisionsMetric = "kvgate_routing_decisions_total"

// decision names the series of one algorithm and outcome.
type decision struct{ algorithm, outcome string }

// decisions counts routing decisions.
type decisions map[decision]float64

// queueMetric is the number of requests waiting in the gateway's SLO
// queues, per model.
const queueMetric = "kvgate_slo_queue_length"

// Counters of the prompt tokens routing predicted cached on the chosen
// pods, and of the part the engines found cached.
const (
	cachedPredictedMetric = "kvgate_routing_cached_tokens_predicted_total"
	cachedFoundMetric     = "kvgate_routing_cached_tokens_found_total"
)

// gatewayCounts is what the demo reads of the gateway's metrics: its
// routing decisions, the requests waiting in its SLO queues, and the
// cached tokens routing predicted and the engines found.
type gatewayCounts struct {
	decisions                    decisions
	queued                       float64
	cachedPredicted, cachedFound float64
}

// foundSince returns the share of the cached tokens routing predicted
// since before that the engines found, NaN when it predicted none.
func (c gatewayCounts) foundSince(before gatewayCounts) float64 {
	predicted := c.cachedPredicted - before.cachedPredicted
	if predicted <= 0 {
		return math.NaN()
	}
	return (c.cachedFound - before.cachedFound) / predicted
}

// scrapeCounts reads the decision counters, the SLO queues' lengths and
// the cached-token counters from the gateway's /metrics.
func scrapeCounts(ctx context.Context, client *http.Client, gatewayURL string) (gatewayCounts, error) {
	families, err := localfleet.Metrics(ctx, client, gatewayURL)
	if err != nil {
		return gatewayCounts{}, err
	}
	c := gatewayCounts{decisions: decisions{}}
	for _, m := range families[decisionsMetric].GetMetric() {
		var k decision
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "algorithm":
				k.algorithm = l.GetValue()
			case "outcome":
				k.outcome = l.GetValue()
			}
		}
		c.decisions[k] = m.GetCounter().GetValue()
	}
	c.queued = localfleet.Sum(families, queueMetric)
	c.cachedPredicted = localfleet.Sum(families, cachedPredictedMetric)
	c.cachedFound = localfleet.Sum(families, cachedFoundMetric)
	return c, nil
}

// scrapeAllCounts sums the counts of the gateways at urls.
func scrapeAllCounts(ctx context.Context, client *http.Client, urls []string) (gatewayCounts, error) {
	sum := gatewayCounts{decisions: decisions{}}
	for _, u := range urls {
		c, err := scrapeCounts(ctx, client, u)
		if err != nil {
			return gatewayCounts{}, err
		}
		for k, v := range c.decisions {
			sum.decisions[k] += v
		}
		sum.queued += c.queued
		sum.cachedPredicted += c.cachedPredicted
		sum.cachedFound += c.cachedFound
	}
	return sum, nil
}

// decisionCount is one series' count over a run.
type decisionCount struct {
	decision
	count float64
}

// since returns the decisions made after before, the series that counted
// none left out, ordered by algorithm then count.
func (d decisions) since(before decisions) []decisionCount {
	var out []decisionCount
	for k, v := range d {
		if n := v - before[k]; n > 0 {
			out = append(out, decisionCount{k, n})
		}
	}
	slices.SortFunc(out, func(a, b decisionCount) int {
		return cmp.Or(cmp.Compare(a.algorithm, b.algorithm), cmp.Compare(b.count, a.count), cmp.Compare(a.outcome, b.outcome))
	})
	return out
}
