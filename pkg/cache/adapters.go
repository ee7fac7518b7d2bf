package cache

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/pkg/endpoint"
)

// maxModelListBytes bounds the /v1/models body read from one pod.
const maxModelListBytes = 1 << 20

// adapterLoop reads one pod's /v1/models every interval and records the
// LoRA adapters it lists, runtime-loaded ones included, in the registry.
// Its fields are owned by its goroutine.
type adapterLoop struct {
	key      endpoint.Key
	id       string // key's "namespace/name", for the failure counter
	model    string
	url      string
	state    *podState
	client   *http.Client
	interval time.Duration
	timeout  time.Duration
	// publish records the adapters of the pod of key whose state is state,
	// and returns the previous ones and whether they changed.
	publish  func(key endpoint.Key, state *podState, adapters []string) ([]string, bool)
	counter  *prometheus.CounterVec
	failures failureLog
	body     bytes.Buffer
}

// run lists the pod's models right away and then on every tick until ctx is
// cancelled.
func (l *adapterLoop) run(ctx context.Context) {
	pollEvery(ctx, l.interval, l.refresh)
}

// refresh lists the pod's models once. A failure keeps the adapters the pod
// listed last: an engine that does not answer for a while has not unloaded
// them.
func (l *adapterLoop) refresh(ctx context.Context) {
	adapters, err := l.fetch(ctx)
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
	if prev, changed := l.publish(l.key, l.state, adapters); changed {
		l.failures.log.Info("The pod's LoRA adapters changed", "pod", l.failures.pod, "model", l.model,
			"adapters", adapters, "previous", prev)
	}
}

// fetch GETs the pod's /v1/models within the timeout and returns the
// adapters it lists.
func (l *adapterLoop) fetch(ctx context.Context) ([]string, error) {
	if err := getBody(ctx, l.client, l.url, "application/json", l.timeout, maxModelListBytes, &l.body); err != nil {
		return nil, fmt.Errorf("list models: %w", err)
	}
	adapters, err := adaptersOfModelList(l.body.Bytes())
	if err != nil {
		return nil, &readError{reason: readBadBody, err: fmt.Errorf("list models at %s: %w", l.url, err)}
	}
	return adapters, nil
}

// adaptersOfModelList returns the LoRA adapters a vLLM server lists in its
// answer to GET /v1/models: the ids of the model cards that name a parent
// (the base model the adapter applies to), sorted and without duplicates.
// Cards without a parent are base models. It fails when body is not a JSON
// object with a "data" list of cards.
func adaptersOfModelList(body []byte) ([]string, error) {
	var list struct {
		Data *[]struct {
			ID     string  `json:"id"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, fmt.Errorf("decode model list: %w", err)
	}
	if list.Data == nil {
		return nil, errors.New(`decode model list: no "data" list of models`)
	}
	var adapters []string
	for _, c := range *list.Data {
		if c.ID != "" && c.Parent != nil && *c.Parent != "" {
			adapters = append(adapters, c.ID)
		}
	}
	slices.Sort(adapters)
	return slices.Compact(adapters), nil
}

// modelsURL is where the pod lists its models: its engine's address.
func modelsURL(ep *endpoint.Endpoint) string {
	return "http://" + ep.Address + "/v1/models"
}
