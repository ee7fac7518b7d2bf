package simserver

import (
	"context"
	"sync"

	"github.com/kvgate/kvgate/pkg/sim"
)

// mailbox collects the outputs of the engine requests serving one HTTP
// request (one per choice), so that an engine never waits for a slow
// client: the runner appends, the handler takes everything appended so far.
type mailbox struct {
	mu    sync.Mutex
	outs  []sim.RequestOutput
	err   error
	ready chan struct{} // holds a token while outs or err is unread
}

func newMailbox() *mailbox { return &mailbox{ready: make(chan struct{}, 1)} }

// put appends outputs.
func (m *mailbox) put(outs ...sim.RequestOutput) {
	m.mu.Lock()
	m.outs = append(m.outs, outs...)
	m.mu.Unlock()
	m.signal()
}

// fail records that no more outputs will come because of err.
func (m *mailbox) fail(err error) {
	m.mu.Lock()
	if m.err == nil {
		m.err = err
	}
	m.mu.Unlock()
	m.signal()
}

func (m *mailbox) signal() {
	select {
	case m.ready <- struct{}{}:
	default:
	}
}

// take waits until outputs are available and returns them all, handing
// them to the caller, or the error recorded by fail once every output before
// it was taken. It returns ctx's error when ctx ends first.
func (m *mailbox) take(ctx context.Context) ([]sim.RequestOutput, error) {
	for {
		m.mu.Lock()
		outs, err := m.outs, m.err
		m.outs = nil
		m.mu.Unlock()
		if len(outs) > 0 {
			return outs, nil
		}
		if err != nil {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-m.ready:
		}
	}
}
