package gateway

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/inflight"
	"github.com/kvgate/kvgate/pkg/internal/jsonscan"
	"github.com/kvgate/kvgate/pkg/routing"
	"github.com/kvgate/kvgate/pkg/types"
)

// Picker is the gateway's routing decision for front ends that forward
// requests themselves, such as an Envoy external processor: it reads and
// checks a request's body, resolves its model and routing algorithm,
// tokenizes its prompt, routes it with the gateway's Router, Store and
// prefix index, and records it in the request ledger, exactly as the HTTP
// proxy does, and then lets the front end report what became of the
// request. Its methods are safe for concurrent use.
type Picker struct{ g *Gateway }

// Picker returns the gateway's Picker. It decides once Serve has synced the
// pods; before, every Pick is refused with 503 gateway_not_ready.
func (g *Gateway) Picker() *Picker { return &Picker{g: g} }

// Ready reports whether the gateway should receive traffic, and why not.
func (p *Picker) Ready() (bool, string) { return p.g.readiness() }

// HoldBody takes n bytes of the gateway's bound on the request bytes it
// holds at once (Config.MaxHeldRequestBytes) for a body a front end
// buffers. It returns the 503 to answer, counted, when they would pass the
// bound; otherwise the front end gives them back with ReleaseBody once it
// drops the body.
func (p *Picker) HoldBody(n int) *Error {
	if p.g.bodies.Take(int64(n)) {
		return nil
	}
	return p.g.heldRefusal()
}

// ReleaseBody gives back n bytes taken with HoldBody.
func (p *Picker) ReleaseBody(n int) { p.g.bodies.Give(int64(n)) }

// Registerer is the gateway's metrics registry, for a front end's own
// metrics.
func (p *Picker) Registerer() prometheus.Registerer { return p.g.registry }

// Logger is the gateway's logger.
func (p *Picker) Logger() klog.Logger { return p.g.cfg.Logger }

// MaxBodyBytes is the largest request body the gateway accepts
// (Config.MaxRequestBodyBytes).
func (p *Picker) MaxBodyBytes() int64 { return p.g.cfg.MaxRequestBodyBytes }

// Algorithm returns the routing algorithm of a request whose
// routing-strategy header is strategy ("" for none): the default, or the
// one it names. It fails with 400 for a name that is no algorithm.
func (p *Picker) Algorithm(strategy string) (string, *Error) {
	return resolveAlgorithm(p.g.router, strategy)
}

// Paths of the endpoints whose bodies the gateway tokenizes (OpenAI's
// completions, chat completions and Responses, Anthropic's Messages), and
// of the model list it answers itself.
const (
	PathCompletions     = "/v1/completions"
	PathChatCompletions = "/v1/chat/completions"
	PathMessages        = "/v1/messages"
	PathResponses       = "/v1/responses"
	PathModels          = "/v1/models"
)

// Models returns the body the gateway answers GET /v1/models with: the
// models served by at least one ready pod, in OpenAI's format. It fails
// with 503 before the pods are known.
func (p *Picker) Models() ([]byte, *Error) {
	b := p.g.ready()
	if b == nil {
		return nil, notReady()
	}
	data, err := json.Marshal(p.g.modelList(b))
	if err != nil {
		return nil, &Error{Status: http.StatusInternalServerError, Type: "server_error", Code: "encoding_failed", Message: err.Error()}
	}
	return append(data, '\n'), nil
}

// PickRequest is what a front end knows of a request when it picks its pod.
type PickRequest struct {
	// Path is the request's path, with or without its query: the OpenAI
	// completion and chat endpoints are tokenized as the proxy tokenizes
	// them; a request to any other path is routed by the model its body
	// names (a JSON object's model member, a multipart/form-data body's
	// model field), on load alone.
	Path string
	// Method is the request's method, "" for POST: a request for a
	// Responses API response an engine stored (GET /v1/responses/{id},
	// POST /v1/responses/{id}/cancel) goes to the engine that made it
	// (see the package documentation), and is refused with 405 for
	// another method.
	Method string
	// Body is the request's body, whole.
	Body []byte
	// ContentType is the request's Content-Type header: a body of another
	// path than the completions' that is multipart/form-data names its
	// model in its model field, as vLLM's audio endpoints take it.
	ContentType string
	// Strategy is the request's routing-strategy header, "" for none.
	Strategy string
	// ModelRewrite is the request's HeaderModelRewrite header, "" for
	// none: the model the request goes to, whatever its body names.
	ModelRewrite string
	// ClientRequestID is the request id the client or its proxy sent
	// (X-Request-Id), "" for none: logs and GET /debug/slo show it beside
	// the gateway's own id, as the proxy's requests show theirs.
	ClientRequestID string
	// Objective is the request's HeaderInferenceObjective, "" for none:
	// the InferenceObjective whose priority the request takes, as through
	// the proxy.
	Objective string
	// FairnessID is the request's HeaderFairnessID, "" for none: the flow
	// the request belongs to among those of its priority, as through the
	// proxy.
	FairnessID string
	// NamesRank reports a request carrying its own X-Data-Parallel-Rank
	// header: the gateway pins it to no rank (Pick.DPRank is -1), and the
	// front end forwards the client's header.
	NamesRank bool
	// Subset, when not nil, restricts the candidates to the pods at these
	// addresses (ip:port): a request whose subset holds no candidate is
	// refused with 503.
	Subset []string
	// Received is when the request arrived; the zero time means now.
	Received time.Time
	// Waiting, when set, is called on Pick's goroutine when the request
	// starts waiting in its model's SLO queue, with the latest time Pick
	// returns for it: a front end whose peer bounds the wait can extend
	// the bound.
	Waiting func(until time.Time)
}

// Pick is a routed request: the pod chosen, the attempt opened on it in the
// request ledger, and the body to forward. The front end reports what
// becomes of the attempt (Response, Unreachable, Served, Fail, Cancel) and
// calls End once, when the request is over; a Pick must not be used after
// End. Its methods are for the goroutine that drives the request.
type Pick struct {
	g   *Gateway
	x   *exchange
	a   admitted
	rc  *types.RoutingContext
	req *inflight.Request
	h   *inflight.Handle
	// stream reports a request that asked for a streamed response.
	stream bool
}

// Pick decides where the request goes and records it: on success the
// attempt counts as running on the chosen pod and its prefill as queued
// there. It fails with the error the client is to be answered with: the
// gateway is not ready (503), the body cannot be read or names no model
// (400), the routing-strategy header names no algorithm (400), no pod
// serves the model (404) or none is ready (503), or the subset holds no
// candidate (503), or the request is sheddable and the candidates
// saturated (429 and a RetryAfter, see SaturationConfig). A completion or
// chat request naming an SLO-aware
// algorithm, or any algorithm under flow control (Config.FlowControl), waits
// in its model's queue as through the proxy, for as long as ctx lasts: it
// fails with 429 and a RetryAfter when the queue refuses it, it can no
// longer meet its objective or the pods stay saturated past the longest
// wait, and with 499 when ctx ends first.
func (p *Picker) Pick(ctx context.Context, in PickRequest) (*Pick, *Error) {
	g := p.g
	b := g.ready()
	if b == nil {
		return nil, notReady()
	}
	start := in.Received
	if start.IsZero() {
		start = time.Now()
	}
	k := &Pick{g: g, x: exchanges.Get().(*exchange), a: admitted{b: b, override: in.ModelRewrite}}
	path, _, _ := strings.Cut(in.Path, "?")
	kd := kindModel
	switch path {
	case PathCompletions:
		kd = kindCompletion
	case PathChatCompletions:
		kd = kindChat
	case PathMessages:
		kd = kindMessages
	case PathResponses:
		kd = kindResponses
	default:
		if id, method, label, ok := storedPath(path); ok {
			if m := cmp.Or(in.Method, http.MethodPost); m != method {
				putExchange(k.x)
				return nil, &Error{Status: http.StatusMethodNotAllowed, Type: typeInvalidRequest, Code: codeMethodNotAllowed,
					Message: m + " is not allowed; use " + method}
			}
			kd, k.x.in.storedID, k.x.in.storedLabel = kindStored, id, label
		}
	}
	err := g.check(&k.a, kd, in.Body, in.ContentType, in.Strategy, k.x)
	k.stream = k.x.in.stream().Stream
	if err == nil && in.Subset != nil {
		err = k.restrict(in.Subset)
	}
	if err != nil {
		err.Model, err.Algorithm = k.a.model, k.a.algorithm
		putExchange(k.x)
		return nil, err
	}
	k.a.priority = g.priority(in.Objective)
	k.a.fairness = g.fairnessID(in.FairnessID)
	if err := g.shed(&k.a, k.x); err != nil {
		putExchange(k.x)
		return nil, err
	}
	k.rc, k.req = g.begin(ctx, &k.a, k.x, start, in.ClientRequestID)
	k.x.ownRank = in.NamesRank
	if g.queued(kd, &k.a) {
		h, err := g.queueSLO(ctx, &k.a, k.rc, k.req, k.x, in.Waiting)
		if h == nil {
			k.End()
			if err == nil {
				err = &Error{Status: statusClientClosed, Type: typeInvalidRequest, Code: codeClientClosed,
					Message: "the request ended while it waited for a pod"}
			}
			err.Model, err.Algorithm = k.a.model, k.a.algorithm
			return nil, err
		}
		k.h = h
		return k, nil
	}
	h, rerr := g.open(ctx, b, k.rc, k.a.pods, k.x, k.req)
	if rerr != nil {
		k.End()
		return nil, &Error{Status: http.StatusServiceUnavailable, Type: typeServiceUnavailable, Code: codeNoReadyPod,
			Message: rerr.Error(), Model: k.a.model, Algorithm: k.a.algorithm}
	}
	k.h = h
	return k, nil
}

// checkModel checks the body of a request to an endpoint the gateway does
// not tokenize (kindModel), as check does the others: the body, whose
// Content-Type is contentType, must name a model a ready pod serves, in
// its model member when it is a JSON object, in its model field when it is
// a multipart/form-data body (as vLLM's audio endpoints take), among its
// first maxFormParts parts. The body is forwarded as received.
func (g *Gateway) checkModel(a *admitted, body []byte, contentType, strategy string, x *exchange) *Error {
	x.in = inference{kind: kindModel}
	model, found, err := formModel(body, contentType)
	switch {
	case errors.Is(err, errNotForm):
		var e *Error
		if model, e = jsonModel(body); e != nil {
			return e
		}
		if body, model, e = g.renamed(a, body, model); e != nil {
			return e
		}
	case err != nil:
		return &Error{Status: http.StatusBadRequest, Type: typeInvalidRequest, Code: codeUnreadableBody,
			Message: "reading the multipart form failed: " + err.Error()}
	case !found:
		return &Error{Status: http.StatusBadRequest, Type: typeInvalidRequest, Code: codeMissingField, Param: "model",
			Message: fmt.Sprintf("the request names no model: its form has no model field among its first %d parts", maxFormParts)}
	}
	if err := g.candidates(a, model, strategy, x); err != nil {
		return err
	}
	a.body = body
	return nil
}

// jsonModel returns the model a JSON body names, "" for none, failing when
// the body is not a JSON object or its model is not a string.
func jsonModel(body []byte) (string, *Error) {
	if i := jsonscan.SkipSpace(body, 0); i == len(body) || body[i] != '{' {
		return "", &Error{Status: http.StatusBadRequest, Type: typeInvalidRequest, Code: codeMissingField, Param: "model",
			Message: "the request names no model: its body is not a JSON object"}
	}
	var model string
	if err := jsonscan.Members(body, func(name, value []byte) error {
		if string(jsonscan.Name(name)) == "model" {
			return decodeString(name, value, &model)
		}
		return nil
	}); err != nil {
		return "", &Error{Status: http.StatusBadRequest, Type: typeInvalidRequest, Code: codeInvalidJSON, Message: jsonError(err)}
	}
	return model, nil
}

// restrict keeps the candidates whose address is in subset.
func (k *Pick) restrict(subset []string) *Error {
	kept := inSubset(k.a.pods, subset)
	if len(kept) == 0 {
		return &Error{Status: http.StatusServiceUnavailable, Type: typeServiceUnavailable, Code: codeNoReadyPod,
			Message: fmt.Sprintf("none of the %d endpoints the proxy allows serves the model `%s` and is ready", len(subset), k.a.model)}
	}
	k.a.pods, k.a.subset = kept, subset
	return nil
}

// inSubset returns, in a new slice, the pods of pods whose address is
// among subset: those a front end allows a request to go to.
func inSubset(pods []*endpoint.Endpoint, subset []string) []*endpoint.Endpoint {
	var kept []*endpoint.Endpoint
	for _, p := range pods {
		if slices.Contains(subset, p.Address) {
			kept = append(kept, p)
		}
	}
	return kept
}

func notReady() *Error {
	return &Error{Status: http.StatusServiceUnavailable, Type: typeServiceUnavailable, Code: codeNotReady, Message: errNotReady.Error()}
}

// Endpoint returns the pod the request is sent to.
func (k *Pick) Endpoint() *endpoint.Endpoint { return k.x.d.Endpoint }

// Decision returns the routing decision. It is the Pick's: do not keep it
// after End.
func (k *Pick) Decision() *routing.Decision { return &k.x.d }

// RequestID returns the id the request is recorded under.
func (k *Pick) RequestID() string { return k.rc.RequestID }

// LoggedClientRequestID returns PickRequest.ClientRequestID as logs show it
// (see types.RoutingContext.LoggedClientRequestID).
func (k *Pick) LoggedClientRequestID() string { return k.rc.LoggedClientRequestID() }

// Model returns the model the request asks for.
func (k *Pick) Model() string { return k.a.model }

// Algorithm returns the routing algorithm that decided.
func (k *Pick) Algorithm() string { return k.x.d.Algorithm }

// Attempt returns the request's attempt on its pod.
func (k *Pick) Attempt() *inflight.Handle { return k.h }

// DPRank returns the data-parallel rank of the pod the request is pinned
// to, which the front end names in the request's X-Data-Parallel-Rank
// header (HeaderDataParallelRank), as the proxy does; -1 for none: the
// engine then balances the request over its ranks (see the package
// documentation).
func (k *Pick) DPRank() int { return pinnedRank(k.h) }

// Body returns the body to forward, and whether it differs from the
// client's: a streamed request that did not ask for the usage chunk is
// forwarded asking for it (see the package documentation), and the chunk
// is withheld from the client by Response.Body; a request whose model is
// rewritten (PickRequest.ModelRewrite, the rewrite rules) names the model
// it goes to.
func (k *Pick) Body() (body []byte, changed bool) { return k.a.body, k.a.dropUsage || k.a.renamed }

// Unreachable records that the proxy could not connect to the pod, so that
// nothing reached it: the pod is ejected from routing for reason's backoff
// (see cache.Store.EjectPod) and the attempt closed as failed.
func (k *Pick) Unreachable(reason cache.EjectionReason) {
	k.a.b.store.EjectPod(k.x.d.Endpoint, reason)
	k.h.Close(inflight.Failed, string(reason))
	k.g.metrics.upstreamFails.WithLabelValues(string(reason)).Inc()
}

// Served records that the proxy sent the request to the pod at address
// (ip:port) rather than to the chosen one, as it does when it falls back to
// another endpoint: the attempt on the chosen pod is closed as failed and
// one is opened on the pod at address, when it is a candidate. It reports
// whether the attempt moved.
func (k *Pick) Served(address string) bool {
	if address == "" || address == k.x.d.Endpoint.Address {
		return false
	}
	var pod *endpoint.Endpoint
	for _, p := range k.a.pods {
		if p.Address == address {
			pod = p
		}
	}
	k.h.Close(inflight.Failed, "the proxy served the request from "+address)
	if pod == nil {
		return false
	}
	load := k.a.b.store.PodLoad(pod.Key)
	if load == nil {
		return false
	}
	k.h = k.req.Route(inflight.Route{Pod: load, Endpoint: pod, PromptTokens: k.rc.InputTokens(),
		PendingLoad: k.g.requestLoad(k.rc, pod)})
	k.x.d.Endpoint, k.x.d.PodKey = pod, pod.ID
	return true
}

// Reasons a front end gives Pick.Fail, as the proxy counts them in
// kvgate_gateway_upstream_failures_total.
const (
	// FailSend: the request was sent, or partly, and no response came.
	FailSend = failSend
	// FailBody: the response broke off after its headers.
	FailBody = failBody
)

// Fail closes the attempt as failed for reason, FailSend or FailBody; the
// pod stays in routing, since the request may have reached it.
func (k *Pick) Fail(reason string) {
	if k.h.Close(inflight.Failed, reason) {
		k.g.metrics.upstreamFails.WithLabelValues(reason).Inc()
	}
}

// Cancel closes the attempt as cancelled: the client went away.
func (k *Pick) Cancel(reason string) { k.h.Close(inflight.Cancelled, reason) }

// End records that the request is over and releases the Pick; an attempt
// still open is closed as cancelled. Only the first call counts.
func (k *Pick) End() {
	if k.x == nil {
		return
	}
	if k.req != nil {
		k.req.End()
	}
	putExchange(k.x)
	k.x = nil
}

// Response follows the response to a Pick as a front end that sees it in
// pieces relays it, and closes the attempt when it ends.
type Response struct {
	k      *Pick
	status int
	sse    bool
	// events reads the events of an event stream; partial holds the bytes
	// of an event not complete yet, and oversized reports that the event
	// being read outgrew maxEvent and is relayed as it comes, uninspected,
	// the bytes relayed of it leaving off within a line as passed says;
	// oversizedEvents counts such events.
	events          eventReader
	partial         []byte
	maxEvent        int
	oversized       bool
	passed          linePos
	oversizedEvents int
	// partialLine is where the line under way of partial starts and
	// partialSeen how much of partial was searched for the event's end,
	// so that each piece is searched once however many an event takes.
	partialLine, partialSeen int
	// whole keeps the first maxUsageScanBytes of any other successful
	// body, to read its usage; over reports a longer one.
	whole bytes.Buffer
	over  bool
	// read reports a whole body whose usage was read with its last piece
	// (into events), as a Responses response's is with its id.
	read bool
	// uninspected reports the response of an endpoint other than the
	// completions: its body is passed on unread, and carries no usage.
	uninspected bool
	// kind is the request's, whose shape the response's usage has.
	kind kind
}

// Response records that the response has status and the content type
// contentType, and returns the Response that reads its body's pieces. The
// pod is taken to be reachable unless the status is one a proxy answers
// itself for a pod it could not get a response from (502, 503, 504).
func (k *Pick) Response(status int, contentType string) *Response {
	switch status {
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
	default:
		k.a.b.store.PodReachable(k.x.d.Endpoint)
	}
	r := &Response{k: k, status: status, sse: isEventStream(k.stream, status, contentType), maxEvent: k.g.cfg.MaxStreamEventBytes,
		uninspected: !k.x.in.kind.generates(), kind: k.x.in.kind}
	r.events = eventReader{dropUsage: k.a.dropUsage, firstToken: k.h.FirstToken, kind: k.x.in.kind}
	if status == http.StatusOK {
		r.events.stored = k.g.recorder(&k.x.in, k.x.d.Endpoint, k.a.model)
	}
	return r
}

// EventStream reports whether the body is relayed event by event (Body
// then returns what to relay in place of each piece).
func (r *Response) EventStream() bool { return r.sse }

// OversizedEvents reports how many events so far were longer than
// Config.MaxStreamEventBytes: a Response holds an event back until it is
// complete, to read it, up to that bound; a longer one is relayed as its
// bytes come, and a first token or usage it carries is not read.
func (r *Response) OversizedEvents() int { return r.oversizedEvents }

// FirstToken reports whether a generated token has been relayed.
func (r *Response) FirstToken() bool { return r.events.seenToken }

// Body reads the next piece of the body, last telling whether it ends the
// body. For an event stream it appends to dst and returns what the client
// is to receive in its place: the events it completes, the usage chunk
// withheld when the gateway asked for it, and a final incomplete event at
// the end; the rest of an incomplete event waits for the next piece, up to
// Config.MaxStreamEventBytes, beyond which it is relayed as it comes (see
// OversizedEvents). An event ends only at a blank line, wherever the
// pieces split its lines and line endings. The first generated token is
// reported to the request ledger as it passes. For any other body, and for
// every body of an endpoint other than the completions, it returns piece
// itself, unchanged.
func (r *Response) Body(dst, piece []byte, last bool) []byte {
	if !r.sse {
		if r.status == http.StatusOK && !r.over && !r.uninspected {
			if r.whole.Len()+len(piece) <= maxUsageScanBytes {
				r.whole.Write(piece)
			} else {
				r.over = true
			}
			if last && !r.over && r.events.stored != nil {
				// The client gets the response's id with this piece: a
				// follow-up naming it finds the record. The same pass
				// reads the usage Done reports.
				var id string
				r.events.usage, r.events.hasUsage, id = responseUsageAndID(r.whole.Bytes(), r.kind)
				r.read = true
				r.events.stored(id)
				r.events.stored = nil
			}
		}
		return piece
	}
	data := piece
	// The search for the first event's end resumes where the held bytes'
	// left off; the events after it are searched from their start.
	lineAt, seen := 0, 0
	if len(r.partial) > 0 {
		r.partial = append(r.partial, piece...)
		data = r.partial
		lineAt, seen = r.partialLine, r.partialSeen
	}
	for len(data) > 0 {
		if r.oversized {
			end := eventEndAfter(r.passed, data)
			if end < 0 {
				break
			}
			dst = append(dst, data[:end]...)
			r.oversized = false
			data = data[end:]
			continue
		}
		end, line := eventEndFrom(data, lineAt, seen)
		if end < 0 {
			lineAt, seen = line, len(data)
			break
		}
		if event := data[:end]; !r.events.inspect(event) {
			dst = append(dst, event...)
		}
		data = data[end:]
		lineAt, seen = 0, 0
	}
	if last || (r.oversized && len(data) > 0) || len(data) > r.maxEvent {
		dst = append(dst, data...)
		if !r.oversized {
			r.passed = lineStart // an event starts a line
			if !last {
				r.oversizedEvents++
			}
		}
		r.passed = r.passed.after(data)
		r.oversized = !last && len(data) > 0
		data = nil
	}
	if len(data) == 0 {
		lineAt, seen = 0, 0
	}
	// Held bytes none of which went out stay where they are.
	if len(data) != len(r.partial) || len(data) > 0 && &data[0] != &r.partial[0] {
		r.partial = append(r.partial[:0], data...)
	}
	r.partialLine, r.partialSeen = lineAt, seen
	return dst
}

// eventEnd returns the length of the first complete event of data, up to
// and including the blank line ending it, or -1 when data holds none.
func eventEnd(data []byte) int {
	end, _ := eventEndFrom(data, 0, 0)
	return end
}

// eventEndFrom is eventEnd for data of which the first seen bytes were
// searched already: their lines before lineAt, where the line under way
// starts, are not blank, and that line has no line feed before seen. When
// data holds no event's end, it returns -1 and where data's last line
// starts.
func eventEndFrom(data []byte, lineAt, seen int) (end, line int) {
	for i := seen; ; {
		j := bytes.IndexByte(data[i:], '\n')
		if j < 0 {
			return -1, lineAt
		}
		i += j + 1
		if isBlankLine(data[lineAt:i]) {
			return i, i
		}
		lineAt = i
	}
}

// linePos tells where within a line the bytes of an event relayed so far
// left off.
type linePos uint8

const (
	// lineStart: at the start of a line (after a line feed).
	lineStart linePos = iota
	// lineCR: after a carriage return that starts a line, which a line
	// feed makes a blank line.
	lineCR
	// lineMid: within a line holding more than a carriage return.
	lineMid
)

// after returns where the line stands once b follows p.
func (p linePos) after(b []byte) linePos {
	n := len(b)
	switch {
	case n == 0:
		return p
	case b[n-1] == '\n':
		return lineStart
	case b[n-1] != '\r':
		return lineMid
	case n > 1 && b[n-2] == '\n', n == 1 && p == lineStart:
		return lineCR
	}
	return lineMid
}

// eventEndAfter is eventEnd for data that continues an event at p: a line
// feed ends the line under way first, and a blank line only when it starts
// its line.
func eventEndAfter(p linePos, data []byte) int {
	i := 0
	switch {
	case p == lineCR && data[0] == '\n':
		return 1
	case p != lineStart:
		j := bytes.IndexByte(data, '\n')
		if j < 0 {
			return -1
		}
		i = j + 1
	}
	end := eventEnd(data[i:])
	if end < 0 {
		return -1
	}
	return i + end
}

// Done closes the attempt, the response having ended: done, with the usage
// the engine reported in a successful completion response. The responses
// of other endpoints are not read for usage.
func (r *Response) Done() {
	var u usage
	var ok bool
	switch {
	case r.sse, r.read:
		u, ok = r.events.usage, r.events.hasUsage
	case r.status == http.StatusOK && !r.over && !r.uninspected:
		u, ok = responseUsage(r.whole.Bytes(), r.kind)
	}
	r.k.g.closeDone(r.k.h, !r.uninspected, r.status, u, ok)
}
