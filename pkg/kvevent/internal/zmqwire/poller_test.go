package zmqwire

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
)

func TestPollerTimesOutWithNothingToRead(t *testing.T) {
	_, pull := pair(t)
	p, err := NewPoller(pull)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, wait := range []time.Duration{0, -time.Second, 30 * time.Millisecond} {
		start := time.Now()
		ready, err := p.Poll(wait)
		if err != nil || len(ready) != 0 {
			t.Fatalf("Poll(%v) = %v, %v with nothing sent", wait, ready, err)
		}
		if took := time.Since(start); took < wait {
			t.Errorf("Poll(%v) returned after %v", wait, took)
		}
	}
}

// TestPollerWakesForEveryMessage sends thousands of messages in bursts to
// two sockets and pauses while the receiver polls with a long timeout: a
// wake-up lost between ZMQ_EVENTS's answer, or a receive's EAGAIN, and the
// wait would leave the receiver waiting out the timeout with messages
// queued. The receiver reports the sockets it drained or not: a Poller that
// trusted a drained socket to be signalled when it is not, or that skipped
// a socket signalled, fails it.
func TestPollerWakesForEveryMessage(t *testing.T) {
	for _, report := range []bool{false, true} {
		t.Run(fmt.Sprintf("drained-reported=%v", report), func(t *testing.T) { testPollerWakes(t, report) })
	}
}

func testPollerWakes(t *testing.T, reportDrained bool) {
	pushA, pullA := pair(t)
	pushB, pullB := pair(t)
	_, idle := pair(t)
	p, err := NewPoller(idle, pullA, nil, pullB)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	const n = 2000 // messages per sender
	sent := make(chan error, 2)
	send := func(push *zmq.Socket) {
		for i := range n {
			if i%8 == 0 {
				time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
			}
			if _, err := push.SendBytes([]byte{byte(i)}, 0); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}
	go send(pushA)
	go send(pushB)
	got := map[*zmq.Socket]int{}
	for got[pullA]+got[pullB] < 2*n {
		ready, err := p.Poll(10 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if len(ready) == 0 {
			t.Fatalf("Poll waited 10 s with %d and %d of %d messages received", got[pullA], got[pullB], n)
		}
		for _, r := range ready {
			if (r.Socket != pullA && r.Socket != pullB) || r.Events&zmq.POLLIN == 0 {
				t.Fatalf("Poll named %v (%v), want only the sockets sent to", r.Socket, r.Events)
			}
			for {
				b, err := r.Socket.RecvBytes(zmq.DONTWAIT)
				if err != nil {
					if !IsAgain(err) {
						t.Fatal(err)
					}
					if reportDrained {
						p.Drained(r.Socket)
					}
					break
				}
				if b[0] != byte(got[r.Socket]) {
					t.Fatalf("message %d reads %d", got[r.Socket], b[0])
				}
				got[r.Socket]++
			}
		}
	}
	for range 2 {
		if err := <-sent; err != nil {
			t.Fatal(err)
		}
	}
	// A message already queued is named at once, even without a wait.
	if _, err := pushA.SendBytes([]byte{1}, 0); err != nil {
		t.Fatal(err)
	}
	ready, err := p.Poll(10 * time.Second)
	if err != nil || len(ready) != 1 {
		t.Fatalf("Poll = %v, %v with a message sent", ready, err)
	}
	if ready, err = p.Poll(0); err != nil || len(ready) != 1 || ready[0].Socket != pullA {
		t.Fatalf("Poll(0) = %v, %v with a message queued", ready, err)
	}
}
