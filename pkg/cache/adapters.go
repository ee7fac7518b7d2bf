package cache

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/pkg/endpoint"
)

// maxModelListBytes bounds the /v1/models body read from one pod.
const maxModelListBytes = 1 << 20

// maxLoggedNames bounds the names a log line lists.
const maxLoggedNames = 16

// adapterLoop reads one pod's /v1/models every interval and records the
// LoRA adapters it lists, runtime-loaded ones included, in the registry,
// and the model cards of the base model and of the adapters taken in the
// pod's state. Its fields are owned by its goroutine.
type adapterLoop struct {
	key      endpoint.Key
	id       string // key's "namespace/name", for the failure counter
	model    string
	page     *pageClient
	state    *podState
	interval time.Duration
	// maxAdapters bounds the adapters taken from one listing.
	maxAdapters int
	// publish records the adapters of the pod of key whose state is state,
	// and returns the previous ones and whether they changed.
	publish func(key endpoint.Key, state *podState, adapters []string) ([]string, bool)
	counter *prometheus.CounterVec
	// dropped counts the adapters listed beyond maxAdapters.
	dropped  *prometheus.CounterVec
	failures failureLog
	body     bytes.Buffer
	// kept is what the loop published last; droppedLogged is set once it
	// has logged adapters left out.
	kept          []string
	droppedLogged bool
}

// run lists the pod's models right away and then on every tick until ctx is
// cancelled.
func (l *adapterLoop) run(ctx context.Context) {
	defer l.page.close()
	pollEvery(ctx, l.interval, l.refresh)
}

// refresh lists the pod's models once. A failure keeps the adapters and the
// cards the pod listed last: an engine that does not answer for a while has
// not unloaded them.
func (l *adapterLoop) refresh(ctx context.Context) {
	cards, adapters, err := l.fetch(ctx)
	trimBuffer(&l.body)
	if ctx.Err() != nil {
		return // stopping: the listing was cut short, not failed
	}
	if err != nil {
		l.counter.WithLabelValues(l.id, readReason(err)).Inc()
		l.failures.failed(err, "keeping the LoRA adapters it listed last")
		return
	}
	l.failures.succeeded()
	listed := len(adapters)
	adapters = capAdapters(adapters, l.kept, l.maxAdapters)
	l.kept = adapters
	if n := listed - len(adapters); n > 0 {
		l.dropped.WithLabelValues(l.id).Add(float64(n))
		if !l.droppedLogged {
			l.droppedLogged = true
			l.failures.log.Info("The pod's engine lists more LoRA adapters than the gateway takes from one pod; "+
				"requests for the others are not routed to it", "pod", l.failures.pod, "model", l.model,
				"listed", listed, "kept", len(adapters))
		}
	}
	// The cards go first, so that an adapter is routed to with its card.
	l.state.setCards(podCards(cards, l.model, adapters))
	if prev, changed := l.publish(l.key, l.state, adapters); changed {
		l.failures.log.Info("The pod's LoRA adapters changed", "pod", l.failures.pod, "model", l.model,
			"adapters", namesForLog(adapters), "previous", namesForLog(prev))
	}
}

// capAdapters returns at most limit of listed, sorted and distinct: those
// of prev, which the pod was last known to serve, first, so that an adapter
// routed to keeps its place when others are loaded, then the others in
// order.
func capAdapters(listed, prev []string, limit int) []string {
	if len(listed) <= limit {
		return listed
	}
	kept := make([]string, 0, limit)
	for _, keepPrev := range [...]bool{true, false} {
		for _, a := range listed {
			if len(kept) == limit {
				break
			}
			if _, inPrev := slices.BinarySearch(prev, a); inPrev == keepPrev {
				kept = append(kept, a)
			}
		}
	}
	slices.Sort(kept)
	return kept
}

// namesForLog returns the first maxLoggedNames of names, each clipped, and
// how many more there are.
func namesForLog(names []string) []string {
	out := make([]string, 0, min(len(names), maxLoggedNames+1))
	for _, n := range names[:min(len(names), maxLoggedNames)] {
		out = append(out, clipForLog(n))
	}
	if more := len(names) - maxLoggedNames; more > 0 {
		out = append(out, fmt.Sprintf("and %d more", more))
	}
	return out
}

// fetch GETs the pod's /v1/models within the timeout and returns the
// cards and the adapters it lists (see cardsOfModelList).
func (l *adapterLoop) fetch(ctx context.Context) ([]ModelCard, []string, error) {
	if err := l.page.get(ctx, &l.body); err != nil {
		return nil, nil, fmt.Errorf("list models: %w", err)
	}
	cards, adapters, err := cardsOfModelList(l.body.Bytes())
	if err != nil {
		return nil, nil, &readError{reason: readBadBody, err: fmt.Errorf("list models at %s: %w", l.page.url, err)}
	}
	return cards, adapters, nil
}

// modelsURL is where the pod lists its models: its engine's address.
func modelsURL(ep *endpoint.Endpoint) string { return "http://" + ep.Address + modelsPath }

// modelsPath is the path of the model list of vLLM's OpenAI-compatible API.
const modelsPath = "/v1/models"
