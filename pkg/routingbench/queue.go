package routingbench

import (
	"container/heap"
	"time"
)

// eventKind orders the events due at the same instant: an engine's step
// ends (its tokens exist) before event batches reach the index, before the
// Store scrapes, before gateway replicas share their state, before requests
// arrive and are routed, before the gateway's queue looks for requests that
// can no longer wait. Routing thus sees everything that happened up to and
// including its instant.
type eventKind uint8

const (
	evStepEnd eventKind = iota
	evDeliver
	evScrape
	evShare
	evArrival
	evQueue
)

// event is one thing due at a virtual time.
type event struct {
	at   time.Duration // since the start of the simulation
	kind eventKind
	seq  uint64 // order of scheduling, the last tie breaker
	// engine is the engine of a step end or delivery; req the index of an
	// arriving request.
	engine, req int
	// payload is a delivery's encoded event batch.
	payload []byte
}

// eventQueue is a priority queue of events by (at, kind, seq): a total
// order, so that a simulation processes its events in one order only.
type eventQueue struct {
	events eventHeap
	seq    uint64
}

func (q *eventQueue) push(e event) {
	e.seq = q.seq
	q.seq++
	heap.Push(&q.events, e)
}

func (q *eventQueue) pop() event { return heap.Pop(&q.events).(event) }

func (q *eventQueue) len() int { return len(q.events) }

type eventHeap []event

func (h eventHeap) Len() int { return len(h) }

func (h eventHeap) Less(i, j int) bool {
	a, b := &h[i], &h[j]
	if a.at != b.at {
		return a.at < b.at
	}
	if a.kind != b.kind {
		return a.kind < b.kind
	}
	return a.seq < b.seq
}

func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }

func (h *eventHeap) Push(x any) { *h = append(*h, x.(event)) }

func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = event{}
	*h = old[:len(old)-1]
	return e
}
