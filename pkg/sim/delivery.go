package sim

import (
	"errors"
	"math"
	"time"
)

// EventDelivery models how an engine's KV-event batches reach a
// subscriber: late, by a fixed delay plus a random one, and sometimes not
// at all. vLLM publishes a step's batch from a background thread after the
// step; the batch then crosses the pod network and waits in the
// subscriber's queue, and a subscriber too slow for the publisher's
// high-water mark, or one reconnecting, loses batches that no replay brings
// back. The zero value delivers every batch at once.
type EventDelivery struct {
	// Delay is the least time from a step's end to its batch's arrival.
	Delay time.Duration
	// Jitter is the mean of an exponentially distributed delay added to
	// each batch, so that now and then a batch arrives much later than
	// most. Batches still arrive in the order they were published: a late
	// batch holds back the ones after it, as one connection does.
	Jitter time.Duration
	// LossRate is the share of batches that never arrive, in [0, 1].
	LossRate float64
}

// Validate reports a negative delay or jitter, or a loss rate outside
// [0, 1].
func (d EventDelivery) Validate() error {
	switch {
	case d.Delay < 0 || d.Jitter < 0:
		return errors.New("event delay and jitter must not be negative")
	case !(d.LossRate >= 0 && d.LossRate <= 1):
		return errors.New("event loss rate must be within [0, 1]")
	}
	return nil
}

// EventLink draws the fate of one engine's batches under an EventDelivery:
// a deterministic function of its seed and the order of the calls. It is
// not safe for concurrent use.
type EventLink struct {
	d     EventDelivery
	state uint64
	last  time.Time
}

// NewEventLink returns the link of one engine's batches; links with
// different seeds draw independently.
func NewEventLink(d EventDelivery, seed uint64) (*EventLink, error) {
	if err := d.Validate(); err != nil {
		return nil, err
	}
	return &EventLink{d: d, state: seed}, nil
}

// Deliver returns when a batch published at sent arrives, no earlier than
// the batches delivered before it, or false when it is lost.
func (l *EventLink) Deliver(sent time.Time) (time.Time, bool) {
	if l.d.LossRate > 0 && l.uniform() < l.d.LossRate {
		return time.Time{}, false
	}
	at := sent.Add(l.d.Delay)
	if l.d.Jitter > 0 {
		at = at.Add(time.Duration(-math.Log(1-l.uniform()) * float64(l.d.Jitter)))
	}
	if at.Before(l.last) {
		at = l.last
	}
	l.last = at
	return at, true
}

// uniform draws a float64 in [0, 1) from the link's SplitMix64 stream.
func (l *EventLink) uniform() float64 {
	l.state += 0x9e3779b97f4a7c15
	return float64(splitmix64(l.state)>>11) / (1 << 53)
}
