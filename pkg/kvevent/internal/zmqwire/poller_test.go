package zmqwire

import (
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

// TestPollerWakesForEveryMessage sends thousands of messages in bursts and
// pauses while the receiver polls with a long timeout: a wake-up lost
// between ZMQ_EVENTS's answer and the wait would leave the receiver
// waiting out the timeout with messages queued.
func TestPollerWakesForEveryMessage(t *testing.T) {
	push, pull := pair(t)
	_, idle := pair(t)
	p, err := NewPoller(idle, nil, pull)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	const n = 3000
	sent := make(chan error, 1)
	go func() {
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
	}()
	got := 0
	for got < n {
		ready, err := p.Poll(10 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if len(ready) == 0 {
			t.Fatalf("Poll waited 10 s with %d of %d messages received", got, n)
		}
		for _, r := range ready {
			if r.Socket != pull || r.Events&zmq.POLLIN == 0 {
				t.Fatalf("Poll named %v (%v), want only the socket sent to", r.Socket, r.Events)
			}
		}
		for {
			b, err := pull.RecvBytes(zmq.DONTWAIT)
			if err != nil {
				if !IsAgain(err) {
					t.Fatal(err)
				}
				break
			}
			if b[0] != byte(got) {
				t.Fatalf("message %d reads %d", got, b[0])
			}
			got++
		}
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	// A message already queued is named at once, even without a wait.
	if _, err := push.SendBytes([]byte{1}, 0); err != nil {
		t.Fatal(err)
	}
	ready, err := p.Poll(10 * time.Second)
	if err != nil || len(ready) != 1 {
		t.Fatalf("Poll = %v, %v with a message sent", ready, err)
	}
	if ready, err = p.Poll(0); err != nil || len(ready) != 1 || ready[0].Socket != pull {
		t.Fatalf("Poll(0) = %v, %v with a message queued", ready, err)
	}
}
