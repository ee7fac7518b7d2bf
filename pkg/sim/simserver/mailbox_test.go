package simserver

import (
	"context"
	"errors"
	"testing"

	"github.com/kvgate/kvgate/pkg/sim"
)

func TestMailboxDeliversEveryOutputInOrderThenTheError(t *testing.T) {
	box := newMailbox()
	const n = 5000
	go func() {
		for i := 0; i < n; i += 3 {
			box.put(sim.RequestOutput{Token: uint32(i)}, sim.RequestOutput{Token: uint32(i + 1)}, sim.RequestOutput{Token: uint32(i + 2)})
		}
		box.fail(errStopped)
	}()
	next := uint32(0)
	for {
		outs, err := box.take(context.Background())
		if err != nil {
			if !errors.Is(err, errStopped) || next < n {
				t.Fatalf("take: %v after %d outputs", err, next)
			}
			return
		}
		for _, o := range outs {
			if o.Token != next {
				t.Fatalf("got token %d, want %d", o.Token, next)
			}
			next++
		}
		// Writing to what take returned must not race with put.
		clear(outs)
	}
}

func TestMailboxTakeEndsWithTheContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := newMailbox().take(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("take on a cancelled context: %v", err)
	}
}
