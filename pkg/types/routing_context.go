// Package types holds the small request types shared by the cache Store, the
// routing algorithms and the gateway.
package types

import (
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
)

// RoutingContext carries what routing needs to know of one inference
// request.
//
// The gateway fills the exported fields before routing; routing reads them and
// records its decision with SetTargetPod. The exported fields are not
// synchronized: write them before the context is shared with other
// goroutines. The target pod may be set and read concurrently.
//
// The request's deadline, cancellation and logger are not part of it: as
// with net/http's handlers, the functions that need them take a
// context.Context of their own.
type RoutingContext struct {
	// RequestID identifies the request uniquely among the requests in
	// flight through this gateway.
	RequestID string
	// ClientRequestID is the X-Request-Id the client sent, "" for none,
	// as sent. vLLM names the request after it, so the gateway's logs and
	// /debug pages show it beside RequestID (see LoggedClientRequestID)
	// for operators to join the two. It never identifies the request to
	// the gateway: clients choose it, and two may choose the same.
	ClientRequestID string
	// Model is the model name the client asked for: a base model or a LoRA
	// adapter.
	Model string
	// LoraAdapter is the adapter Model resolved to, "" when Model names a
	// base model.
	LoraAdapter string
	// Algorithm names the routing algorithm chosen for the request.
	Algorithm string
	// PromptTokenIDs holds the tokenized prompt when the gateway tokenized
	// it; nil otherwise.
	PromptTokenIDs []uint32
	// PromptTokenCount is the number of prompt tokens when they were counted
	// without keeping the ids. InputTokens prefers len(PromptTokenIDs).
	PromptTokenCount int
	// PredictedOutputTokens is the number of tokens the request is expected
	// to generate, 0 when unknown.
	PredictedOutputTokens int
	// ReceivedAt is when the gateway received the request.
	ReceivedAt time.Time
	// SLO is the service-level objective the request is to be served
	// within, counted from ReceivedAt; zero for none. The SLO-aware
	// routing algorithms read it.
	SLO SLO
	// SLOContended reports that the model's SLO queue is contended as the
	// request is routed: requests wait in it, or one was refused for want
	// of capacity moments ago (see package slo). The SLO-aware algorithms
	// then keep the prefill work queued on a pod within the SLO's base
	// time to first token, so that the gateway, not the engines, holds
	// what the fleet cannot serve at once.
	SLOContended bool
	// Priority ranks the request against the others of its pool when the
	// fleet is short of capacity: higher first, 0 when the request names
	// none. A negative priority marks it sheddable: refused rather than
	// served late. The Gateway API Inference Extension's InferenceObjective
	// the request names (its x-gateway-inference-objective header) sets it.
	Priority int
	// FairnessID names the flow the request belongs to among those of its
	// priority, "" for the default flow of the requests that name none:
	// the Gateway API Inference Extension's x-gateway-inference-fairness-id
	// header, e.g. a tenant. A model's SLO queue can take turns among the
	// flows waiting at one priority (see package slo). It is printable
	// ASCII of at most MaxFairnessIDBytes bytes.
	FairnessID string

	target atomic.Pointer[routingTarget]
}

type routingTarget struct {
	pod *v1.Pod
	at  time.Time
}

// NewRoutingContext returns a RoutingContext for the request requestID asking
// for model, received now.
func NewRoutingContext(requestID, model string) *RoutingContext {
	return &RoutingContext{RequestID: requestID, Model: model, ReceivedAt: time.Now()}
}

// MaxFairnessIDBytes bounds a FairnessID: the gateway ignores a longer
// x-gateway-inference-fairness-id header (the request joins the default
// flow).
const MaxFairnessIDBytes = 128

// ValidFairnessID reports whether id can be a FairnessID: at most
// MaxFairnessIDBytes bytes, each printable ASCII.
func ValidFairnessID(id string) bool {
	if len(id) > MaxFairnessIDBytes {
		return false
	}
	for i := range len(id) {
		if !printableASCII(id[i]) {
			return false
		}
	}
	return true
}

// MaxLoggedClientRequestIDBytes bounds the client's request id logs and
// /debug pages show: longer ones are cut to their first
// MaxLoggedClientRequestIDBytes bytes.
const MaxLoggedClientRequestIDBytes = 128

// LoggedClientRequestID returns ClientRequestID as logs and /debug pages
// show it: its first MaxLoggedClientRequestIDBytes bytes, each byte that is
// not printable ASCII replaced with '?', so that a client's id cannot
// forge log lines. It allocates only when it replaces a byte.
func (r *RoutingContext) LoggedClientRequestID() string {
	id := r.ClientRequestID
	if len(id) > MaxLoggedClientRequestIDBytes {
		id = id[:MaxLoggedClientRequestIDBytes]
	}
	for i := range len(id) {
		if !printableASCII(id[i]) {
			return sanitized(id, i)
		}
	}
	return id
}

func printableASCII(b byte) bool { return b >= ' ' && b <= '~' }

// sanitized returns id with each byte from the i-th on that is not
// printable ASCII replaced with '?'.
func sanitized(id string, i int) string {
	b := []byte(id)
	for ; i < len(b); i++ {
		if !printableASCII(b[i]) {
			b[i] = '?'
		}
	}
	return string(b)
}

// InputTokens reports the number of prompt tokens: len(PromptTokenIDs) when
// the prompt was tokenized, PromptTokenCount otherwise.
func (r *RoutingContext) InputTokens() int {
	if r.PromptTokenIDs != nil {
		return len(r.PromptTokenIDs)
	}
	return r.PromptTokenCount
}

// SetTargetPod records pod as the routing decision, stamped with the current
// time. Setting it again (a retry on another pod) replaces the decision.
func (r *RoutingContext) SetTargetPod(pod *v1.Pod) {
	r.target.Store(&routingTarget{pod: pod, at: time.Now()})
}

// TargetPod returns the pod the request was routed to, nil before routing.
// The pod is shared: treat it as read-only.
func (r *RoutingContext) TargetPod() *v1.Pod {
	if t := r.target.Load(); t != nil {
		return t.pod
	}
	return nil
}

// HasRouted reports whether a target pod has been set.
func (r *RoutingContext) HasRouted() bool {
	t := r.target.Load()
	return t != nil && t.pod != nil
}

// RoutedAt returns when the target pod was set, the zero time before routing.
func (r *RoutingContext) RoutedAt() time.Time {
	if t := r.target.Load(); t != nil {
		return t.at
	}
	return time.Time{}
}
