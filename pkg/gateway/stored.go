package gateway

import (
	"cmp"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	k8stypes "k8s.io/apimachinery/pkg/types"

	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/internal/jsonscan"
	"github.com/kvgate/kvgate/pkg/redisstate"
)

// DefaultMaxStoredResponses is Config.MaxStoredResponses' default: about
// 20 MiB of records at vLLM's response ids.
const DefaultMaxStoredResponses = 100_000

// maxResponseIDBytes bounds the id of a response the gateway remembers:
// vLLM's are "resp_" and 32 hexadecimal digits. An engine's longer id is
// not remembered, and counted.
const maxResponseIDBytes = 256

// storedResponses remembers which engine made each OpenAI Responses API
// response the gateway relayed, so that the requests that need the
// response (a follow-up naming it as its previous_response_id, GET
// /v1/responses/{id}, POST /v1/responses/{id}/cancel) go to that engine:
// vLLM keeps a stored response in the memory of the API server that made
// it, which no other engine shares. It holds at most max records, the
// oldest forgotten first; a record names the pod by its name, UID and
// address, so that a pod that replaced it (its response store lost) is
// not taken for it. The first record of an id stands: vLLM names a
// response after the request_id its client may choose, so a later
// response of the same id, made by another client's request, must not
// take the requests for the first one to another engine. Its methods are
// safe for concurrent use.
type storedResponses struct {
	mu   sync.Mutex
	max  int
	byID map[string]responseOwner
	// ring holds the ids remembered in the order recorded, up to max;
	// once full, ring[next] is the oldest, forgotten for the next record.
	ring []string
	next int

	recorded, evicted, refused prometheus.Counter
	// requests counts the requests that name a stored response, by
	// endpoint label and result.
	requests *prometheus.CounterVec
	// shared, when set, shares the records with the other gateway
	// replicas through Redis.
	shared *redisstate.StoredResponses
}

// responseOwner is the engine that made a response, and the model the
// request that made it named.
type responseOwner struct {
	pod     endpoint.Key
	uid     k8stypes.UID
	address string
	model   string
}

// Results of a request that names a stored response, in
// kvgate_gateway_stored_response_requests_total.
const (
	// storedOwner: sent to the engine that made the response.
	storedOwner = "owner"
	// storedGone: that engine no longer serves the model (its pod was
	// deleted, replaced or is not ready).
	storedGone = "gone"
	// storedUnknown: the gateway has no record of the response.
	storedUnknown = "unknown"
)

// newStoredResponses returns a storedResponses of at most max records,
// its metrics registered with reg (when not nil).
func newStoredResponses(max int, reg prometheus.Registerer) (*storedResponses, error) {
	s := &storedResponses{max: max, byID: make(map[string]responseOwner)}
	events := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvgate_gateway_stored_responses_total",
		Help: "OpenAI Responses API responses whose engine the gateway recorded, by event: recorded (relayed by this " +
			"replica, or found in Redis, relayed by another), evicted (forgotten, the oldest, to keep " +
			"within KVGATE_MAX_STORED_RESPONSES), refused (not recorded: an id empty, longer than 256 bytes, or recorded " +
			"already for another engine, since a client may choose a response's id).",
	}, []string{"event"})
	s.recorded, s.evicted, s.refused = events.WithLabelValues("recorded"), events.WithLabelValues("evicted"),
		events.WithLabelValues("refused")
	s.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvgate_gateway_stored_response_requests_total",
		Help: "Requests that need a response an engine stored (a Responses request naming a previous_response_id, GET " +
			"/v1/responses/{id}, POST /v1/responses/{id}/cancel), by endpoint and result: owner (sent to the engine that made " +
			"the response), gone (that engine no longer serves the model), unknown (the gateway has no record of the response).",
	}, []string{"endpoint", "result"})
	for _, e := range []string{PathResponses, endpointStoredResponse, endpointCancelResponse} {
		for _, r := range []string{storedOwner, storedGone, storedUnknown} {
			s.requests.WithLabelValues(e, r)
		}
	}
	size := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kvgate_gateway_stored_responses",
		Help: "OpenAI Responses API responses whose engine the gateway remembers, at most KVGATE_MAX_STORED_RESPONSES.",
	}, func() float64 { return float64(s.len()) })
	if reg != nil {
		for _, c := range []prometheus.Collector{events, s.requests, size} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("register stored response metrics: %w", err)
			}
		}
	}
	return s, nil
}

// record remembers that pod made the response id to a request for model,
// and shares the record when the records are shared. An empty id, one
// longer than maxResponseIDBytes, or one remembered for another engine is
// refused; one remembered for pod already stays as it is.
func (s *storedResponses) record(id string, pod *endpoint.Endpoint, model string) {
	if len(id) == 0 || len(id) > maxResponseIDBytes {
		s.refused.Inc()
		return
	}
	o := responseOwner{pod: pod.Key, uid: pod.UID, address: pod.Address, model: model}
	if s.remember(id, o) && s.shared != nil {
		s.shared.Record(id, redisstate.StoredResponse{Namespace: o.pod.Namespace, Name: o.pod.Name, UID: string(o.uid),
			Address: o.address, Model: o.model})
	}
}

// remember records o as the engine of the response id, the newest record,
// and reports whether it did: an id remembered already keeps its record,
// and one remembered for another engine is counted as refused.
func (s *storedResponses) remember(id string, o responseOwner) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if had, ok := s.byID[id]; ok {
		if had != o {
			s.refused.Inc()
		}
		return false
	}
	if len(s.ring) < s.max {
		s.ring = append(s.ring, id)
	} else {
		delete(s.byID, s.ring[s.next])
		s.evicted.Inc()
		s.ring[s.next] = id
		s.next = (s.next + 1) % s.max
	}
	s.byID[id] = o
	s.recorded.Inc()
	return true
}

// lookup returns the record of the response id. Without one, when the
// records are shared, it asks Redis, waiting at most the look-up timeout,
// and remembers what Redis holds, so that it asks once per response. An
// id no record may have (empty, or longer than maxResponseIDBytes) is not
// asked for.
func (s *storedResponses) lookup(id string) (responseOwner, bool) {
	s.mu.Lock()
	o, ok := s.byID[id]
	s.mu.Unlock()
	if ok || s.shared == nil || len(id) == 0 || len(id) > maxResponseIDBytes {
		return o, ok
	}
	r, ok := s.shared.Lookup(id)
	if !ok {
		return o, false
	}
	o = responseOwner{pod: endpoint.Key{Namespace: r.Namespace, Name: r.Name}, uid: k8stypes.UID(r.UID), address: r.Address,
		model: r.Model}
	if !s.remember(id, o) {
		// Recorded meanwhile, by a response relayed here: that stands.
		return s.lookupLocal(id)
	}
	return o, true
}

// lookupLocal returns this replica's record of the response id.
func (s *storedResponses) lookupLocal(id string) (responseOwner, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.byID[id]
	return o, ok
}

// len returns the number of responses remembered.
func (s *storedResponses) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byID)
}

// unknownWhy says why the gateway may have no record of a response.
func (s *storedResponses) unknownWhy() string {
	if s.shared == nil {
		return fmt.Sprintf("made before the gateway started, through another gateway replica, or forgotten as older than the "+
			"last %d responses", s.max)
	}
	return fmt.Sprintf("made before the gateway started, through another gateway replica longer ago than the records "+
		"shared in Redis live, while Redis could not be reached or was asked too many look-ups at once, or forgotten as "+
		"older than the last %d responses", s.max)
}

// is reports whether p is the engine o names.
func (o *responseOwner) is(p *endpoint.Endpoint) bool {
	return p.Key == o.pod && p.UID == o.uid && p.Address == o.address
}

// storedOwner returns the engine that made the response id among the
// ready pods of model ("" for the model the record names), its record, and
// the result of the search, counted under the request's endpoint label.
// Without a record of its own, the gateway asks Redis when the records are
// shared (see lookup).
func (g *Gateway) storedOwner(b *backend, id, model, label string) (*endpoint.Endpoint, responseOwner, string) {
	o, ok := g.stored.lookup(id)
	if !ok {
		g.stored.requests.WithLabelValues(label, storedUnknown).Inc()
		return nil, o, storedUnknown
	}
	if pods, err := b.store.ListPodsByModel(cmp.Or(model, o.model)); err == nil {
		for _, p := range pods {
			if o.is(p) {
				g.stored.requests.WithLabelValues(label, storedOwner).Inc()
				return p, o, storedOwner
			}
		}
	}
	g.stored.requests.WithLabelValues(label, storedGone).Inc()
	return nil, o, storedGone
}

// pinStored makes the engine that made the response a Responses request
// continues (previous_response_id) its only candidate, when that engine is
// among the model's ready pods, ejected or not: no other engine holds the
// response. It reports whether it did; a request it does not pin is
// routed as any other, and the engine it reaches answers 404 unless it
// holds the response.
func (g *Gateway) pinStored(a *admitted, id string) bool {
	pod, _, result := g.storedOwner(a.b, id, a.model, PathResponses)
	if result != storedOwner {
		return false
	}
	a.pods, a.ready, a.pinned = []*endpoint.Endpoint{pod}, 1, true
	return true
}

// Endpoint labels of the requests for a stored response.
const (
	endpointStoredResponse = PathResponses + "/{id}"
	endpointCancelResponse = PathResponses + "/{id}/cancel"
)

// storedPath returns the response id of a path of a request for a stored
// response (PathResponses/{id} or PathResponses/{id}/cancel), the method
// it takes, and its endpoint label; ok is false for any other path.
func storedPath(path string) (id, method, label string, ok bool) {
	rest, found := strings.CutPrefix(path, PathResponses+"/")
	if !found {
		return "", "", "", false
	}
	id, action, _ := strings.Cut(rest, "/")
	switch {
	case id == "":
		return "", "", "", false
	case action == "" && !strings.HasSuffix(rest, "/"):
		return id, http.MethodGet, endpointStoredResponse, true
	case action == "cancel":
		return id, http.MethodPost, endpointCancelResponse, true
	}
	return "", "", "", false
}

// serveStoredResponse serves the requests for a response an engine stored
// (GET /v1/responses/{id}, POST /v1/responses/{id}/cancel): each goes to
// the engine that made the response, as the gateway recorded it, and is
// answered 404 when the gateway has no record of it or that engine is
// gone.
func (g *Gateway) serveStoredResponse(w http.ResponseWriter, r *http.Request) {
	id, method, label, ok := storedPath(r.URL.Path)
	if !ok {
		writeError(w, http.StatusNotFound, typeNotFound, codeNotFound, "", "no endpoint at "+r.URL.Path)
		return
	}
	g.serveRequest(w, r, kindStored, label, method, id)
}

// checkStored checks a request for the stored response id, as check does
// the others: the gateway must have a record of the response, and the
// engine that made it must be a ready pod of the model its request named.
// That engine is the one candidate, ejected or not.
func (g *Gateway) checkStored(a *admitted, id, strategy, label string, body []byte) *Error {
	alg, rerr := resolveAlgorithm(a.b.router, strategy)
	if rerr != nil {
		return rerr
	}
	a.algorithm = alg
	pod, o, result := g.storedOwner(a.b, id, "", label)
	switch result {
	case storedUnknown:
		return &Error{Status: http.StatusNotFound, Type: typeNotFound, Code: codeNotFound, Param: "response_id",
			Message: fmt.Sprintf("Response with id '%s' not found: the gateway has no record of the engine holding this stored "+
				"response (%s)", id, g.stored.unknownWhy())}
	case storedGone:
		a.model = o.model
		return &Error{Status: http.StatusNotFound, Type: typeNotFound, Code: codeNotFound, Param: "response_id",
			Message: fmt.Sprintf("Response with id '%s' not found: pod %s, which made this stored response and alone held "+
				"it, no longer serves the model `%s`", id, o.pod, o.model)}
	}
	a.model, a.pods, a.ready, a.pinned, a.body = o.model, []*endpoint.Endpoint{pod}, 1, true, body
	return nil
}

// responseID returns the id of a Responses API response object, "" when
// it has none that is a string.
func responseID(obj []byte) string {
	if len(obj) == 0 || obj[0] != '{' {
		return ""
	}
	var id string
	_ = jsonscan.Members(obj, func(name, value []byte) error {
		if string(jsonscan.Name(name)) == "id" && value[0] == '"' {
			id, _ = jsonscan.String(value)
		}
		return nil
	})
	return id
}

// recorder returns what records the engine of the response to a request
// of kind k that pod serves, for model: nil unless the request is a
// Responses request an engine may store (its store is not false).
func (g *Gateway) recorder(in *inference, pod *endpoint.Endpoint, model string) func(id string) {
	if in.kind != kindResponses || in.conv.NotStored {
		return nil
	}
	return func(id string) { g.stored.record(id, pod, model) }
}
