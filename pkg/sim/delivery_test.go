package sim

import (
	"testing"
	"time"
)

func TestEventLinksDelayInOrderAndLoseTheirShare(t *testing.T) {
	d := EventDelivery{Delay: 5 * time.Millisecond, Jitter: 20 * time.Millisecond, LossRate: 0.1}
	l, err := NewEventLink(d, 42)
	if err != nil {
		t.Fatal(err)
	}
	const n = 20000
	lost := 0
	var last time.Time
	var extra time.Duration
	for i := range n {
		sent := t0.Add(time.Duration(i) * time.Millisecond)
		at, ok := l.Deliver(sent)
		if !ok {
			lost++
			continue
		}
		if at.Sub(sent) < d.Delay {
			t.Fatalf("batch %d arrives %v after it was sent, before the %v delay", i, at.Sub(sent), d.Delay)
		}
		if at.Before(last) {
			t.Fatalf("batch %d arrives at %v, before the batch before it (%v)", i, at, last)
		}
		last = at
		extra += at.Sub(sent) - d.Delay
	}
	if share := float64(lost) / n; share < 0.09 || share > 0.11 {
		t.Errorf("%.3f of the batches lost, want about 0.1", share)
	}
	// Order adds to the jitter's mean: a batch waits for a late one
	// before it.
	if mean := extra / time.Duration(n-lost); mean < d.Jitter || mean > 5*d.Jitter {
		t.Errorf("mean delay beyond the fixed one %v, want at least the jitter's mean %v", mean, d.Jitter)
	}
}

func TestEventLinksAreDeterministic(t *testing.T) {
	d := EventDelivery{Jitter: time.Millisecond, LossRate: 0.5}
	a, _ := NewEventLink(d, 7)
	b, _ := NewEventLink(d, 7)
	c, _ := NewEventLink(d, 8)
	same := true
	for i := range 100 {
		sent := t0.Add(time.Duration(i) * time.Millisecond)
		at1, ok1 := a.Deliver(sent)
		at2, ok2 := b.Deliver(sent)
		at3, ok3 := c.Deliver(sent)
		if at1 != at2 || ok1 != ok2 {
			t.Fatalf("batch %d: links with one seed disagree", i)
		}
		same = same && at1 == at3 && ok1 == ok3
	}
	if same {
		t.Error("links with different seeds drew the same fates")
	}
}

func TestTheZeroEventDeliveryDeliversAtOnce(t *testing.T) {
	l, err := NewEventLink(EventDelivery{}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if at, ok := l.Deliver(t0); !ok || !at.Equal(t0) {
		t.Errorf("delivered at %v (%v), want at once", at, ok)
	}
}

func TestInvalidEventDeliveriesAreRefused(t *testing.T) {
	for _, d := range []EventDelivery{{Delay: -1}, {Jitter: -1}, {LossRate: -0.1}, {LossRate: 1.5}} {
		if _, err := NewEventLink(d, 1); err == nil {
			t.Errorf("%+v accepted", d)
		}
	}
}
