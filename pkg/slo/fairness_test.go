package slo

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testsupport"
)

// inFlow sets the fairness id of e's request and returns e.
func inFlow(e *Entry, flow string) *Entry {
	e.Request.FairnessID = flow
	return e
}

// flowArrival is a request of a flow queued by the fairness tests.
type flowArrival struct {
	id, flow string
	priority int
	deadline time.Duration // from the first arrival
}

// queueFlows submits arrivals to q, in order and 1 ms apart, on a full
// fleet: each must wait.
func queueFlows(t *testing.T, q *QueueRouter, f *fleet, c *clock, arrivals []flowArrival) {
	t.Helper()
	start := c.Now()
	for _, a := range arrivals {
		e := inFlow(withPriority(entry(f, c, a.id, 0, nil), a.priority), a.flow)
		e.Deadline = start.Add(a.deadline)
		if queued, err := q.Submit(e, true); !queued {
			t.Fatalf("%s was not queued on a full fleet: %v", a.id, err)
		}
		c.Advance(time.Millisecond)
	}
}

// routeOneAtATime frees one request's capacity at a time and makes a pass
// after each, until nothing waits; it returns the order routed.
func routeOneAtATime(t *testing.T, q *QueueRouter, f *fleet) string {
	t.Helper()
	for i := 0; q.Len() > 0; i++ {
		if i > 100 {
			t.Fatalf("%d passes left %d waiting", i, q.Len())
		}
		f.release(1)
		q.Dispatch()
	}
	return fmt.Sprint(f.order())
}

// assertNoFlowsKept fails when q keeps anything of its flows while none
// waits.
func assertNoFlowsKept(t *testing.T, q *QueueRouter) {
	t.Helper()
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.entries) == 0 && (len(q.bands) != 0 || q.flows != 0) {
		t.Errorf("an empty queue keeps %d priorities' flows (%d flows)", len(q.bands), q.flows)
	}
}

func TestQueueRoundRobinTakesTurnsAmongTheFlowsOfOnePriority(t *testing.T) {
	// Flow a floods the queue with six requests; flow b's two arrive after
	// them, with later deadlines. As capacity frees one request at a time,
	// round-robin sends b's second and fourth; the deadline policy keeps
	// earliest deadline first, whatever the flow.
	var arrivals []flowArrival
	for i := range 6 {
		arrivals = append(arrivals, flowArrival{fmt.Sprint("a", i), "a", 0, time.Duration(10+i) * time.Second})
	}
	for i := range 2 {
		arrivals = append(arrivals, flowArrival{fmt.Sprint("b", i), "b", 0, time.Duration(20+i) * time.Second})
	}
	for fairness, want := range map[string]string{
		"":                 "[a0 a1 a2 a3 a4 a5 b0 b1]",
		FairnessDeadline:   "[a0 a1 a2 a3 a4 a5 b0 b1]",
		FairnessRoundRobin: "[a0 b0 a1 b1 a2 a3 a4 a5]",
	} {
		t.Run(fairness, func(t *testing.T) {
			c := newClock()
			f := &fleet{slack: time.Minute}
			q, _ := newTestQueue(t, c, QueueConfig{Fairness: fairness})
			queueFlows(t, q, f, c, arrivals)
			// The debug API lists them in the order the next pass tries
			// them, each with its flow.
			st := q.Status()
			var shown []string
			for _, w := range st.Waiting {
				shown = append(shown, w.RequestID)
				if w.FairnessID != w.RequestID[:1] {
					t.Errorf("/debug/slo shows %s in flow %q, want %q", w.RequestID, w.FairnessID, w.RequestID[:1])
				}
			}
			if got := fmt.Sprint(shown); got != want || st.Flows != 2 || st.Fairness != cmp.Or(fairness, FairnessDeadline) {
				t.Errorf("Status lists %s waiting in %d flows under %q, want %s in 2 under %q", got, st.Flows, st.Fairness,
					want, cmp.Or(fairness, FairnessDeadline))
			}
			if got := routeOneAtATime(t, q, f); got != want {
				t.Fatalf("routed %s, want %s", got, want)
			}
			assertNoFlowsKept(t, q)
		})
	}
}

func TestQueueRoundRobinStartsAfterTheFlowLastRouted(t *testing.T) {
	// Flows take turns in the order of their ids, each pass starting with
	// the flow after the one last routed at that priority (before any was,
	// the flow of the earliest deadline), and a flow arriving later takes
	// its turn. A pass on a fleet with room for several sends them in
	// turn.
	c := newClock()
	f := &fleet{slack: time.Minute}
	q, _ := newTestQueue(t, c, QueueConfig{Fairness: FairnessRoundRobin})
	queueFlows(t, q, f, c, []flowArrival{
		{"b0", "b", 0, 1 * time.Second}, {"a0", "a", 0, 2 * time.Second}, {"a1", "a", 0, 3 * time.Second},
		{"b1", "b", 0, 4 * time.Second}, {"a2", "a", 0, 5 * time.Second},
	})
	f.release(1)
	q.Dispatch() // no flow was routed yet: the earliest deadline's
	queueFlows(t, q, f, c, []flowArrival{{"c0", "c", 0, 30 * time.Second}, {"d0", "", 0, 40 * time.Second}})
	f.release(3)
	q.Dispatch()
	if got, want := fmt.Sprint(f.order()), "[b0 c0 d0 a0]"; got != want {
		t.Fatalf("routed %s, want %s: the flows after b in turn, the default flow first in id order", got, want)
	}
	f.release(1)
	q.Dispatch()
	if got, want := fmt.Sprint(f.order()), "[b0 c0 d0 a0 b1]"; got != want {
		t.Fatalf("routed %s, want %s", got, want)
	}
	if got, want := routeOneAtATime(t, q, f), "[b0 c0 d0 a0 b1 a1 a2]"; got != want {
		t.Fatalf("routed %s, want %s", got, want)
	}
	assertNoFlowsKept(t, q)
}

func TestQueueRoundRobinKeepsHigherPrioritiesFirst(t *testing.T) {
	// Each priority's flows take turns with a turn of their own; every
	// waiting request of a higher priority goes before any of a lower one.
	c := newClock()
	f := &fleet{slack: time.Minute}
	q, _ := newTestQueue(t, c, QueueConfig{Fairness: FairnessRoundRobin})
	queueFlows(t, q, f, c, []flowArrival{
		{"a0", "a", 0, 1 * time.Second}, {"a1", "a", 0, 2 * time.Second}, {"b0", "b", 0, 3 * time.Second},
		{"x0", "a", 5, 50 * time.Second}, {"x1", "a", 5, 51 * time.Second}, {"x2", "a", 5, 52 * time.Second},
		{"y0", "b", 5, 60 * time.Second}, {"z0", "c", 9, 90 * time.Second},
	})
	if got, want := routeOneAtATime(t, q, f), "[z0 x0 y0 x1 x2 a0 b0 a1]"; got != want {
		t.Fatalf("routed %s, want %s", got, want)
	}
	assertNoFlowsKept(t, q)
}

func TestQueueRoundRobinKeepsAPassBounded(t *testing.T) {
	// On a full fleet a pass over many flows still tries maxWaitsPerPass
	// requests, and one that frees capacity as it goes starts again.
	c := newClock()
	f := &fleet{slack: time.Minute}
	q, _ := newTestQueue(t, c, QueueConfig{Fairness: FairnessRoundRobin})
	var arrivals []flowArrival
	for i := range 40 {
		arrivals = append(arrivals, flowArrival{fmt.Sprint("r", i), fmt.Sprint("f", i%7), 0, time.Duration(i+1) * time.Second})
	}
	queueFlows(t, q, f, c, arrivals)
	var tries int
	for _, w := range q.Status().Waiting {
		tries += w.Tries
	}
	q.Dispatch()
	for _, w := range q.Status().Waiting {
		tries -= w.Tries
	}
	if -tries != maxWaitsPerPass {
		t.Fatalf("a pass on a full fleet tried %d requests, want %d", -tries, maxWaitsPerPass)
	}
}

func TestQueueRoundRobinMakesTheLargestFlowGiveUpItsOwnPlace(t *testing.T) {
	// A full queue of four: flow a holds three requests of priority 0,
	// flow b one, of the latest deadline. With round-robin, a request of
	// another flow takes the place of a's latest; one of a is refused;
	// one of a higher priority takes a's latest place too, not b's. The
	// deadline policy makes room only for a higher priority, taking the
	// latest deadline whatever its flow.
	full := []flowArrival{
		{"a0", "a", 0, 10 * time.Second}, {"a1", "a", 0, 20 * time.Second}, {"a2", "a", 0, 30 * time.Second},
		{"b0", "b", 0, 40 * time.Second},
	}
	// Flow a holds two, b and c one each: b is one short of a.
	even := []flowArrival{
		{"a0", "a", 0, 10 * time.Second}, {"a1", "a", 0, 20 * time.Second},
		{"b0", "b", 0, 30 * time.Second}, {"c0", "c", 0, 40 * time.Second},
	}
	tests := []struct {
		name, fairness string
		full           []flowArrival // full when nil
		arrival        flowArrival
		wantDisplaced  string // "" when the arrival is refused
		wantWaiting    string
	}{
		{"round-robin: another flow", FairnessRoundRobin, nil, flowArrival{"c0", "c", 0, 50 * time.Second}, "a2", "[a0 b0 c0 a1]"},
		{"round-robin: the default flow", FairnessRoundRobin, nil, flowArrival{"d0", "", 0, 50 * time.Second}, "a2", "[a0 b0 d0 a1]"},
		{"round-robin: a smaller flow", FairnessRoundRobin, nil, flowArrival{"b1", "b", 0, 5 * time.Second}, "a2", "[b1 a0 b0 a1]"},
		{"round-robin: the largest flow", FairnessRoundRobin, nil, flowArrival{"a3", "a", 0, 1 * time.Second}, "", "[a0 b0 a1 a2]"},
		{"round-robin: a higher priority", FairnessRoundRobin, nil, flowArrival{"b1", "b", 1, 50 * time.Second}, "a2", "[b1 a0 b0 a1]"},
		{"round-robin: the largest flow at a higher priority", FairnessRoundRobin, nil, flowArrival{"a3", "a", 1, 50 * time.Second}, "a2", "[a3 a0 b0 a1]"},
		{"deadline: another flow", FairnessDeadline, nil, flowArrival{"c0", "c", 0, 50 * time.Second}, "", "[a0 a1 a2 b0]"},
		{"deadline: a higher priority", FairnessDeadline, nil, flowArrival{"a3", "a", 1, 50 * time.Second}, "b0", "[a3 a0 a1 a2]"},
		{"round-robin: a flow one short of the largest", FairnessRoundRobin, even, flowArrival{"b1", "b", 0, 5 * time.Second}, "", "[a0 b0 c0 a1]"},
		{"round-robin: a new flow beside flows of one each", FairnessRoundRobin, even[1:], flowArrival{"d0", "d", 0, 5 * time.Second}, "", "[a1 b0 c0]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newClock()
			f := &fleet{slack: time.Minute}
			full := full
			if tt.full != nil {
				full = tt.full
			}
			q, reg := newTestQueue(t, c, QueueConfig{MaxLength: len(full), Fairness: tt.fairness})
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			start := c.Now()
			routes := map[string]chan error{}
			for _, w := range full {
				e := inFlow(entry(f, c, w.id, 0, nil), w.flow)
				e.Deadline = start.Add(w.deadline)
				route := make(chan error, 1)
				routes[w.id] = route
				go func() { route <- q.Route(ctx, e, true) }()
				testsupport.Eventually(t, w.id+" to wait", func() bool { return q.Len() == len(routes) })
			}
			a := tt.arrival
			e := inFlow(withPriority(entry(f, c, a.id, 0, nil), a.priority), a.flow)
			e.Deadline = start.Add(a.deadline)
			queued, err := q.Submit(e, true)
			var qe *Error
			if tt.wantDisplaced == "" {
				if queued || !errors.As(err, &qe) || qe.Reason != ReasonQueueFull {
					t.Fatalf("Submit = %v, %v; want refused with %s", queued, err, ReasonQueueFull)
				}
			} else {
				if !queued || err != nil {
					t.Fatalf("Submit = %v, %v; want queued", queued, err)
				}
				select {
				case err := <-routes[tt.wantDisplaced]:
					if !errors.As(err, &qe) || qe.Reason != ReasonDisplaced {
						t.Fatalf("the Route of %s = %v, want %s", tt.wantDisplaced, err, ReasonDisplaced)
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("the Route of %s did not return", tt.wantDisplaced)
				}
			}
			for id, route := range routes {
				if id != tt.wantDisplaced && len(route) != 0 {
					t.Fatalf("%s left the queue: %v", id, <-route)
				}
			}
			wantDisplaced := map[bool]float64{true: 0, false: 1}[tt.wantDisplaced == ""]
			if o := outcomeCounts(t, reg); o[outcomeDisplaced] != wantDisplaced || o[outcomeRejected] != 1-wantDisplaced {
				t.Fatalf("outcomes %v, want %v displaced", o, wantDisplaced)
			}
			f.release(len(full))
			q.Dispatch()
			if got := fmt.Sprint(f.order()); got != tt.wantWaiting || q.Len() != 0 {
				t.Fatalf("routed %s with %d left, want %s", got, q.Len(), tt.wantWaiting)
			}
			assertNoFlowsKept(t, q)
		})
	}
}

func TestQueueRoundRobinKeepsNothingOfFlowsThatLeft(t *testing.T) {
	// Requests of many flows and priorities wait and leave every way a
	// request leaves: routed, cancelled, expired, displaced. Once none
	// waits, the queue keeps nothing of their flows, and Close forgets
	// those still waiting.
	c := newClock()
	f := &fleet{slack: time.Minute}
	q, reg := newTestQueue(t, c, QueueConfig{MaxLength: 200, Fairness: FairnessRoundRobin})
	var cancel []*Entry
	for i := range 200 {
		e := inFlow(withPriority(entry(f, c, fmt.Sprint("r", i), time.Minute, nil), i%5), fmt.Sprint("flow-", i))
		if queued, err := q.Submit(e, true); !queued {
			t.Fatalf("r%d was not queued: %v", i, err)
		}
		if i%4 == 0 {
			cancel = append(cancel, e)
		}
	}
	q.mu.Lock()
	flows, bands := q.flows, len(q.bands)
	q.mu.Unlock()
	if flows != 200 || bands != 5 {
		t.Fatalf("%d flows in %d priorities, want 200 in 5", flows, bands)
	}
	for _, e := range cancel {
		if !q.Cancel(e) {
			t.Fatalf("%s could not be cancelled", e.Request.RequestID)
		}
	}
	// A higher priority fills the queue again, then displaces the lowest
	// priority's requests.
	for i := range 70 {
		if queued, err := q.Submit(inFlow(withPriority(entry(f, c, fmt.Sprint("h", i), time.Minute, nil), 9), "h"), true); !queued {
			t.Fatalf("h%d was not queued: %v", i, err)
		}
	}
	if o := outcomeCounts(t, reg); o[outcomeDisplaced] != 20 {
		t.Fatalf("outcomes %v, want 20 displaced", o)
	}
	f.release(60)
	q.Dispatch()
	c.Advance(2 * time.Minute)
	q.Dispatch()
	if q.Len() != 0 {
		t.Fatalf("%d left waiting", q.Len())
	}
	assertNoFlowsKept(t, q)

	queueFlows(t, q, f, c, []flowArrival{{"x0", "x", 0, time.Second}, {"y0", "y", 3, time.Second}})
	q.Close(ReasonStopped)
	q.mu.Lock()
	flows, bands = q.flows, len(q.bands)
	q.mu.Unlock()
	if flows != 0 || bands != 0 {
		t.Fatalf("a closed queue keeps %d flows in %d priorities", flows, bands)
	}
}

func TestConfigRefusesAnUnknownFairness(t *testing.T) {
	for _, fairness := range []string{"", FairnessDeadline, FairnessRoundRobin} {
		if err := (Config{Fairness: fairness}).Validate(); err != nil {
			t.Errorf("fairness %q: %v", fairness, err)
		}
	}
	if err := (Config{Fairness: "fair"}).Validate(); err == nil || !strings.Contains(err.Error(), `"fair"`) {
		t.Errorf("fairness fair: %v, want it refused", err)
	}
}
