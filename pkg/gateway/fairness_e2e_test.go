package gateway

import (
	"context"
	"net/http"
	"slices"
	"testing"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/slo"
)

// The fairness tests queue tenantsQueued in this order, tenant a six
// requests, then tenant b two; round-robin sends them in roundRobinOrder.
var (
	tenantsQueued   = []string{"a-0", "a-1", "a-2", "a-3", "a-4", "a-5", "b-0", "b-1"}
	roundRobinOrder = []string{"a-0", "b-0", "a-1", "b-1", "a-2", "a-3", "a-4", "a-5"}
)

// tenantOf returns the tenant of a request of tenantsQueued.
func tenantOf(id string) string { return "tenant-" + id[:1] }

func TestRoundRobinFairnessTakesTurnsAmongTenantsInAFullSLOQueue(t *testing.T) {
	// The fleet is full. Tenant a floods the queue with six requests
	// (x-gateway-inference-fairness-id), then tenant b sends two: once
	// capacity frees, round-robin sends b's second and fourth rather than
	// after all of a's, each tenant's own requests in deadline order.
	f, q := startQuarterPodFleetWith(t, func(c *Config) { c.SLO.Fairness = slo.FairnessRoundRobin })
	var order openedOrder
	f.gw.ledger.Observe(order.observer())
	_, release := holdQuarterPodFleet(t, f, q, &order)

	answers := map[string]chan sloAnswer{}
	for i, id := range tenantsQueued {
		waiting := q.Len()
		answers[id] = sendWithHeaders(context.Background(), f.url, i, id, map[string]string{HeaderFairnessID: tenantOf(id)},
			`,"max_tokens":4`)
		testsupport.Eventually(t, id+" to wait", func() bool { return q.Len() == waiting+1 })
	}
	// GET /debug/slo lists the waiting requests in the order they will be
	// sent, each with its tenant, and counts the tenants waiting.
	v := debugSLO(t, f)
	if len(v.Models) != 1 || v.Models[0].Queue == nil {
		t.Fatalf("GET /debug/slo: %+v, want one model with its queue", v)
	}
	qv := v.Models[0].Queue
	var shown []string
	for _, w := range qv.Waiting {
		if w.FairnessID != tenantOf(w.ClientRequestID) {
			t.Errorf("GET /debug/slo shows %s of fairness id %q, want %q", w.ClientRequestID, w.FairnessID, tenantOf(w.ClientRequestID))
		}
		shown = append(shown, w.ClientRequestID)
	}
	if !slices.Equal(shown, roundRobinOrder) || qv.Flows != 2 || qv.Fairness != slo.FairnessRoundRobin {
		t.Errorf("GET /debug/slo lists %v waiting in %d flows under %q, want %v in 2 under %s", shown, qv.Flows, qv.Fairness,
			roundRobinOrder, slo.FairnessRoundRobin)
	}

	clients := waitingClients(q)
	release()
	for id, a := range answers {
		if r := <-a; r.err != nil || r.status != http.StatusOK {
			t.Errorf("%s: %+v, want 200", id, r)
		}
	}
	if sent := sentClients(&order, clients); !slices.Equal(sent, roundRobinOrder) {
		t.Errorf("the waiting requests were sent in the order %v, want %v: the tenants taking turns", sent, roundRobinOrder)
	}
}

func TestThePickerTakesTurnsAmongTenantsWithRoundRobinFairness(t *testing.T) {
	// As through the proxy: the fairness ids a front end such as ext_proc
	// passes have the tenants take turns.
	var reqs []PickRequest
	for i, id := range tenantsQueued {
		reqs = append(reqs, PickRequest{Path: PathCompletions, ClientRequestID: id, FairnessID: tenantOf(id),
			Body: []byte(completion(simPrompt(i, 20), `,"max_tokens":40`))})
	}
	sent := pickedInOrder(t, func(c *Config) { c.SLO.Fairness = slo.FairnessRoundRobin }, reqs)
	if !slices.Equal(sent, roundRobinOrder) {
		t.Errorf("the waiting requests were picked in the order %v, want %v", sent, roundRobinOrder)
	}
}
