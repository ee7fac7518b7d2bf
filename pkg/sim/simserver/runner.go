package simserver

import (
	"context"
	"errors"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/sim"
)

// EventSink receives the KV-event batches of one engine rank, in step
// order. pkg/kvevent's ZMQ Publisher is one. Publish is called from the
// rank's engine loop: it should queue the batch and return.
type EventSink interface {
	Publish(batch *kvevent.EventBatch) error
}

// errStopped fails the requests still open when an engine loop stops.
var errStopped = errors.New("engine stopped")

// runner drives one engine rank in wall time: it steps the engine
// whenever there is work, sleeps through each step's simulated duration,
// delivers the step's tokens and publishes its events.
type runner struct {
	rank    int
	sink    EventSink
	metrics *rankMetrics
	log     klog.Logger
	wake    chan struct{} // holds a token when requests arrived while idle

	mu      sync.Mutex
	engine  *sim.Engine
	boxes   map[string]*mailbox  // engine request id -> its HTTP request's mailbox
	lastTok map[string]time.Time // engine request id -> time of its latest token
	stopped bool
}

func newRunner(rank int, engine *sim.Engine, sink EventSink, m *rankMetrics, log klog.Logger) *runner {
	return &runner{
		rank:    rank,
		sink:    sink,
		metrics: m,
		log:     log,
		wake:    make(chan struct{}, 1),
		engine:  engine,
		boxes:   make(map[string]*mailbox),
		lastTok: make(map[string]time.Time),
	}
}

// submit adds a request whose outputs go to box.
func (r *runner) submit(spec sim.RequestSpec, box *mailbox) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return errStopped
	}
	if err := r.engine.Add(spec, time.Now()); err != nil {
		return err
	}
	r.boxes[spec.ID] = box
	r.metrics.setQueue(r.engine.QueueState())
	select {
	case r.wake <- struct{}{}:
	default:
	}
	return nil
}

// abort drops an unfinished request, counting it as aborted.
func (r *runner) abort(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.engine.Abort(id); !ok {
		return
	}
	delete(r.boxes, id)
	delete(r.lastTok, id)
	r.metrics.requestSuccess(sim.FinishAbort)
	r.metrics.setQueue(r.engine.QueueState())
}

// load scores the rank's load as vLLM's data-parallel balancer does:
// waiting requests weigh four times as much as running ones.
func (r *runner) load() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	q := r.engine.QueueState()
	return 4*q.Waiting + q.Running
}

// resetPrefixCache resets the rank's prefix cache and publishes the reset.
func (r *runner) resetPrefixCache() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	batch, err := r.engine.ResetPrefixCache(time.Now())
	if err != nil {
		return err
	}
	r.publish(batch)
	return nil
}

// run steps the engine until ctx ends, then fails every open request.
func (r *runner) run(ctx context.Context) {
	defer r.stop()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		r.mu.Lock()
		end, ok := r.engine.BeginStep(time.Now())
		r.mu.Unlock()
		if !ok {
			select {
			case <-ctx.Done():
				return
			case <-r.wake:
				continue
			}
		}
		timer.Reset(time.Until(end))
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		r.endStep()
	}
}

// endStep completes the step in flight, publishes its events, records its
// metrics and only then delivers its tokens, so that a client that got its
// answer finds it in the events and metrics. (vLLM too publishes a step's
// events before the step's tokens reach clients.) Publishing under the lock
// keeps step batches and reset batches in the order they happened.
func (r *runner) endStep() {
	r.mu.Lock()
	defer r.mu.Unlock()
	res := r.engine.EndStep()
	r.publish(res.Batch)
	r.metrics.step(res.Stats)
	for _, out := range res.Outputs {
		r.metrics.token(out, res.End.Sub(r.lastTok[out.RequestID]))
		if out.Finished {
			delete(r.lastTok, out.RequestID)
			r.metrics.finished(out)
		} else {
			r.lastTok[out.RequestID] = res.End
		}
	}
	for _, out := range res.Outputs {
		if box := r.boxes[out.RequestID]; box != nil {
			box.put(out)
			if out.Finished {
				delete(r.boxes, out.RequestID)
			}
		}
	}
}

func (r *runner) publish(batch *kvevent.EventBatch) {
	if batch == nil || r.sink == nil {
		return
	}
	if err := r.sink.Publish(batch); err != nil {
		r.log.Error(err, "Publishing KV events failed", "events", len(batch.Events))
	}
}

// stop fails the open requests and refuses new ones.
func (r *runner) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopped = true
	for id, box := range r.boxes {
		box.fail(errStopped)
		delete(r.boxes, id)
	}
}
