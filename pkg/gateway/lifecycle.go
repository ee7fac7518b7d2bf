package gateway

import (
	"context"

	"github.com/kvgate/kvgate/pkg/cache"
	"k8s.io/klog/v2"
)

// startFunc starts a component under ctx, which ends when the component is
// to stop. It returns once the component has started, with a channel that
// receives the component's result when it has stopped, or fails having
// started nothing.
type startFunc func(ctx context.Context) (<-chan error, error)

// runner starts a component whose Run(ctx) error returns when ctx ends and
// everything it started has stopped.
func runner(run func(context.Context) error) startFunc {
	return func(ctx context.Context) (<-chan error, error) {
		done := make(chan error, 1)
		go func() { done <- run(ctx) }()
		return done, nil
	}
}

// component is one started part of the gateway.
type component struct {
	name   string
	cancel context.CancelFunc
	done   <-chan error
}

// components holds the gateway's running parts: the prefix index's sweep,
// the Store, the KV event manager and the pod source. Each runs under a
// context of its own, so that the gateway stops them only once the requests
// in flight have drained, and stop stops them in the reverse order of their
// start, so that a part stops only after the parts that feed it have: the
// pod source before the manager it notifies, the manager before the index
// it writes.
type components struct {
	log     klog.Logger
	started []component
}

// start starts the component name. It fails, starting nothing, when the
// component fails to start.
func (c *components) start(name string, start startFunc) error {
	ctx, cancel := context.WithCancel(context.Background())
	done, err := start(ctx)
	if err != nil {
		cancel()
		return err
	}
	c.started = append(c.started, component{name: name, cancel: cancel, done: done})
	return nil
}

// stop stops the started components, the last started first, and returns
// once all have stopped; an error one returns is logged.
func (c *components) stop() {
	for i := len(c.started) - 1; i >= 0; i-- {
		p := c.started[i]
		p.cancel()
		if err := <-p.done; err != nil {
			c.log.Error(err, "A component stopped with an error", "component", p.name)
		}
	}
	c.started = nil
}

// podFollower is the KV event manager as the gateway runs it: between Start
// and Stop it follows the KV events of the eligible pods the Store tells it
// about.
type podFollower interface {
	cache.PodListener
	// Start starts the manager's workers, and in bind mode binds its
	// endpoint; it fails when the manager cannot run.
	Start() error
	// Stop stops every subscription and returns once they have ended.
	Stop()
}
