package gateway

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/inflight"
	"github.com/kvgate/kvgate/pkg/internal/budget"
	"github.com/kvgate/kvgate/pkg/routing"
	"github.com/kvgate/kvgate/pkg/tokenizer"
	"github.com/kvgate/kvgate/pkg/types"
)

// Response headers the gateway adds.
const (
	// HeaderTargetPod is the address (ip:port) of the pod that served the
	// request, as AIBrix names it.
	HeaderTargetPod = "target-pod"
	// HeaderTargetPodName is that pod's namespace/name.
	HeaderTargetPodName = "target-pod-name"
	// HeaderServerTiming carries the gateway's time on the request, in
	// milliseconds: its own (ServerTimingGateway) and that of each phase
	// (read, tokenize, route, upstream, relay), e.g.
	// "gateway;dur=0.210, read;dur=0.020, tokenize;dur=0.001,
	// route;dur=0.015, upstream;dur=4.800, relay;dur=0.050". A streamed
	// response carries the relay's and the total time in a trailer.
	HeaderServerTiming = "Server-Timing"
)

// statusClientClosed labels requests whose client went away before the
// response ended (nginx's convention); it is never sent.
const statusClientClosed = 499

// maxUsageScanBytes bounds how much of a response that is not streamed is
// read before it is written to the client: the usage of a longer response
// is not recorded, and its relay time is left out of its Server-Timing.
const maxUsageScanBytes = 4 << 20

// exchange is the working memory of one proxied request, pooled.
type exchange struct {
	body   bytes.Buffer // the client's body
	sent   bytes.Buffer // the body with stream_options added
	resp   bytes.Buffer // a whole response, kept to read its usage
	head   []byte       // the head of the request to the pod
	res    podResponse  // the pod's response
	timing []byte       // a Server-Timing value being written
	vals   headerValues // the values of the response's headers
	limit  io.LimitedReader
	in     inference
	d      routing.Decision
	snaps  []cache.PodSnapshot // the candidates' snapshots
	buf    []byte
	reader *bufio.Reader
	relay  sseRelay
	// held is the bytes of budget taken for the body, given back when
	// the exchange returns to the pool.
	held   int64
	budget *budget.Budget
	// ownRank reports a client that named the data-parallel rank itself
	// (X-Data-Parallel-Rank): the gateway pins none.
	ownRank bool
}

var exchanges = sync.Pool{New: func() any {
	return &exchange{buf: make([]byte, 32<<10), reader: bufio.NewReaderSize(nil, 64<<10)}
}}

// maxPooledBuffer is the largest buffer an exchange keeps when returned to
// the pool, so that one huge request does not pin its memory.
const maxPooledBuffer = 1 << 20

// maxPooledFields is the most header fields of a pod's response an
// exchange keeps room for when returned to the pool.
const maxPooledFields = 1 << 10

func putExchange(x *exchange) {
	if x.held > 0 {
		x.budget.Give(x.held)
		x.held = 0
	}
	for _, b := range []*bytes.Buffer{&x.body, &x.sent, &x.resp} {
		if b.Cap() > maxPooledBuffer {
			*b = bytes.Buffer{}
		}
		b.Reset()
	}
	x.in = inference{}
	x.ownRank = false
	clear(x.snaps)
	x.snaps = x.snaps[:0]
	x.reader.Reset(nil)
	x.relay = sseRelay{event: x.relay.event[:0]}
	if cap(x.relay.event) > maxPooledBuffer {
		x.relay.event = nil
	}
	x.res.body = podBody{}
	x.vals.reset()
	if cap(x.res.headerBytes) > maxPooledBuffer {
		x.res.headerBytes = nil
	}
	if cap(x.res.fields) > maxPooledFields {
		x.res.fields = nil
	}
	x.head = x.head[:0]
	if cap(x.head) > maxPooledBuffer {
		x.head = nil
	}
	exchanges.Put(x)
}

// call is what the metrics record of one inference request.
type call struct {
	clock
	model     string // "" until the model is known to serve
	algorithm string // "" until resolved
	status    int
	// anthropic answers errors in Anthropic's shape (see IsAnthropicPath).
	anthropic bool
}

// fail answers with a JSON error, in the shape of the request's API, and
// records its status.
func (c *call) fail(w http.ResponseWriter, status int, typ, code, param, message string) {
	c.status = status
	writeErrorShaped(w, c.anthropic, status, typ, code, param, message)
}

// failWith answers the request with e, and e's Retry-After when it has one.
func (c *call) failWith(w http.ResponseWriter, e *Error) {
	if v, ok := e.RetryAfterHeader(); ok {
		w.Header().Set(HeaderRetryAfter, v)
	}
	c.fail(w, e.Status, e.Type, e.Code, e.Param, e.Message)
}

// serveInference returns the handler of an OpenAI inference endpoint.
func (g *Gateway) serveInference(k kind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		// The mux calls this handler for its own paths alone.
		g.serveRequest(w, r, k, r.URL.Path, http.MethodPost, "")
	}
}

// serveRequest serves a request of kind k that takes method, counted under
// the endpoint label endpoint; storedID is the response a request of
// kindStored asks for.
func (g *Gateway) serveRequest(w http.ResponseWriter, r *http.Request, k kind, endpoint, method, storedID string) {
	c := call{status: http.StatusOK, anthropic: IsAnthropicPath(endpoint)}
	c.begin(r)
	g.metrics.inFlight.Inc()
	x := exchanges.Get().(*exchange)
	x.in.storedID, x.in.storedLabel = storedID, endpoint
	x.ownRank = namesRank(r.Header)
	defer func() {
		putExchange(x)
		g.metrics.inFlight.Dec()
		g.metrics.requests.WithLabelValues(c.model, g.metrics.status(c.status), c.algorithm, endpoint).Inc()
		g.metrics.duration.WithLabelValues(c.model, endpoint).Observe(c.total().Seconds())
		for p := range numPhases {
			if c.reached[p] {
				g.metrics.phases[p].Observe(c.spent[p].Seconds())
			}
		}
	}()
	if r.Method != method {
		w.Header().Set("Allow", method)
		c.fail(w, http.StatusMethodNotAllowed, typeInvalidRequest, codeMethodNotAllowed, "", r.Method+" is not allowed; use "+method)
		c.lap(phaseRead)
		return
	}
	if g.proxy(w, r, k, x, &c) {
		// The response broke off after its headers: the client must
		// see it broken, not ended, so the connection is cut.
		panic(http.ErrAbortHandler)
	}
}

// routingStrategyKey is the routing-strategy header's canonical name, which
// the request header map is keyed by: looking it up as such allocates
// nothing.
var routingStrategyKey = http.CanonicalHeaderKey(routing.HeaderRoutingStrategy)

// admitted is a request that passed the gateway's checks.
type admitted struct {
	b *backend
	// model and algorithm are the request's, each set once resolved.
	model, algorithm string
	// pods are the candidates: the model's ready pods that are not
	// ejected, or all of them when all are; ready counts the ready pods.
	pods  []*endpoint.Endpoint
	ready int
	// body is what is forwarded: the client's, or the one asking for the
	// usage chunk when dropUsage is set.
	body      []byte
	dropUsage bool
	// override is the request's HeaderModelRewrite value, "" for none;
	// renamed reports a body whose model was rewritten (see rewriteModel).
	override string
	renamed  bool
	// pinned reports a request whose one candidate is the engine that
	// made the stored response it needs (see storedResponses): it is
	// neither tokenized nor held in an SLO queue, which predicts from the
	// prompt.
	pinned bool
	// priority is the priority of the InferenceObjective the request
	// names (see Gateway.priority).
	priority int
	// fairness is the request's flow (see Gateway.fairnessID).
	fairness string
	// subset is the addresses a front end allows the request to go to,
	// nil for any (see Pick.restrict).
	subset []string
}

// proxy serves one inference request: admit, record in the request
// ledger, tokenize, route and forward. It reports whether the response
// broke off after its headers were sent, and the client's connection must
// be cut.
func (g *Gateway) proxy(w http.ResponseWriter, r *http.Request, k kind, x *exchange, c *call) (abort bool) {
	a, ok := g.admit(w, r, k, x, c)
	c.lap(phaseRead)
	if !ok {
		return false
	}
	rc, req := g.begin(r.Context(), &a, x, c.start, r.Header.Get(headerRequestID))
	defer req.End()
	c.lap(phaseTokenize)
	var first *inflight.Handle
	if g.queued(k, &a) {
		// The time waiting in the model's queue counts as routing.
		var ok bool
		if first, ok = g.routeSLO(w, r, &a, rc, req, x, c); !ok {
			return false
		}
	}
	return g.forward(w, r, a, rc, req, x, c, first)
}

// admit reads and checks a request, answering the client when it fails a
// check (see check). It sets c's model and algorithm as they become known.
func (g *Gateway) admit(w http.ResponseWriter, r *http.Request, k kind, x *exchange, c *call) (admitted, bool) {
	a := admitted{b: g.ready(), override: r.Header.Get(modelRewriteKey)}
	if a.b == nil {
		c.fail(w, http.StatusServiceUnavailable, typeServiceUnavailable, codeNotReady, "", errNotReady.Error())
		return a, false
	}
	body, ok := g.readBody(w, r, x, c)
	if !ok {
		return a, false
	}
	contentType := ""
	if !k.generates() {
		contentType = r.Header.Get("Content-Type")
	}
	err := g.check(&a, k, body, contentType, r.Header.Get(routingStrategyKey), x)
	c.model, c.algorithm = a.model, a.algorithm
	if err != nil {
		c.fail(w, err.Status, err.Type, err.Code, err.Param, err.Message)
		return a, false
	}
	a.priority = g.priority(r.Header.Get(HeaderInferenceObjective))
	a.fairness = g.fairnessID(r.Header.Get(HeaderFairnessID))
	if err := g.shed(&a, x); err != nil {
		c.failWith(w, err)
		return a, false
	}
	return a, true
}

// check decodes and checks the body of a request of kind k whose
// routing-strategy header is strategy, into a and x: the body decodes, the
// routing algorithm is known, and a ready pod serves the model. It sets
// a's algorithm and model as they become known, and fails with the error
// the client is answered with. A request of kindModel, whose Content-Type
// is contentType, is checked by checkModel.
func (g *Gateway) check(a *admitted, k kind, body []byte, contentType, strategy string, x *exchange) *Error {
	switch k {
	case kindModel:
		return g.checkModel(a, body, contentType, strategy, x)
	case kindStored:
		x.in.kind = kindStored
		return g.checkStored(a, x.in.storedID, strategy, x.in.storedLabel, body)
	}
	if err := x.in.decode(k, body); err != nil {
		return &Error{Status: http.StatusBadRequest, Type: typeInvalidRequest, Code: codeInvalidJSON, Message: jsonError(err)}
	}
	body, model, rerr := g.renamed(a, body, x.in.model())
	if rerr != nil {
		return rerr
	}
	if a.renamed {
		x.in.setModel(model, body)
	}
	if err := g.candidates(a, model, strategy, x); err != nil {
		return err
	}
	if id := x.in.conv.PreviousResponseID; k == kindResponses && id != "" {
		g.pinStored(a, id)
	}
	a.body = body
	sf := x.in.stream()
	if !sf.Stream || k.converted() {
		// vLLM ends every Messages stream with its usage (message_delta),
		// every Responses stream with it (response.completed).
		return nil
	}
	wants, err := sf.clientWantsUsage()
	if err != nil {
		return &Error{Status: http.StatusBadRequest, Type: typeInvalidRequest, Code: codeInvalidField, Param: "stream_options",
			Message: jsonError(err)}
	}
	if !wants {
		a.dropUsage = true
		if a.body, err = withStreamUsage(&x.sent, body, sf.StreamOptions); err != nil {
			return &Error{Status: http.StatusBadRequest, Type: typeInvalidRequest, Code: codeInvalidField, Param: "stream_options",
				Message: "stream_options: " + err.Error()}
		}
	}
	return nil
}

// candidates resolves the algorithm of a request for model whose
// routing-strategy header is strategy, and its candidates: the model's
// ready pods that are not ejected, or all of them when all are. It sets
// a's algorithm and model as they become known, and fails when the request
// names no model, the header no algorithm, or no ready pod serves the
// model.
func (g *Gateway) candidates(a *admitted, model, strategy string, x *exchange) *Error {
	if model == "" {
		return &Error{Status: http.StatusBadRequest, Type: typeInvalidRequest, Code: codeMissingField, Param: "model",
			Message: "the request names no model"}
	}
	alg, rerr := resolveAlgorithm(a.b.router, strategy)
	if rerr != nil {
		return rerr
	}
	a.algorithm = alg
	var err error
	if a.pods, err = a.b.store.ListPodsByModel(model); err != nil {
		return &Error{Status: http.StatusNotFound, Type: typeInvalidRequest, Code: codeModelNotFound, Param: "model",
			Message: fmt.Sprintf("the model `%s` does not exist", model)}
	}
	a.model = model
	if len(a.pods) == 0 {
		return &Error{Status: http.StatusServiceUnavailable, Type: typeServiceUnavailable, Code: codeNoReadyPod, Param: "model",
			Message: fmt.Sprintf("no pod serving the model `%s` is ready", model)}
	}
	a.ready = len(a.pods)
	x.snaps = a.b.store.Snapshots(a.pods, x.snaps[:0])
	a.pods = withoutEjected(a.pods, x.snaps)
	return nil
}

// resolveAlgorithm returns the algorithm the routing-strategy header
// strategy selects, failing with 400 for a name that is no algorithm.
func resolveAlgorithm(r *routing.Router, strategy string) (string, *Error) {
	alg, err := r.Resolve(strategy)
	if err != nil {
		return "", &Error{Status: http.StatusBadRequest, Type: typeInvalidRequest, Code: codeUnknownStrategy,
			Message: "header " + routing.HeaderRoutingStrategy + ": " + err.Error()}
	}
	return alg, nil
}

// begin records an admitted request in the request ledger and prepares what
// routing reads of it: its routing context, with the client's request id
// clientID ("" for none), its priority and flow, the prompt's token ids when the request is a
// completion and the algorithm reads them, and its predicted output length.
// The caller ends the returned request.
func (g *Gateway) begin(ctx context.Context, a *admitted, x *exchange, start time.Time, clientID string) (*types.RoutingContext, *inflight.Request) {
	rc := types.NewRoutingContext(g.requestID(), a.model)
	rc.ClientRequestID = clientID
	rc.ReceivedAt = start
	rc.Algorithm = a.algorithm
	rc.Priority = a.priority
	rc.FairnessID = a.fairness
	rc.LoraAdapter = adapterOf(a.model, a.pods)
	req := g.ledger.Admit(rc.RequestID, rc.Model)
	if g.tokenizer != nil && x.in.kind.generates() && readsPrompt(a.algorithm) && !a.pinned {
		rc.PromptTokenIDs = g.tokenize(ctx, rc, &x.in, a.pods)
	}
	g.predictOutput(rc, x.in.maxTokens())
	return rc, req
}

// readBody reads the request body into x, answering 413 when it exceeds
// the limit, 408 when it takes longer than the body timeout and 400 when it
// cannot be read.
func (g *Gateway) readBody(w http.ResponseWriter, r *http.Request, x *exchange, c *call) ([]byte, bool) {
	limit := g.cfg.MaxRequestBodyBytes
	tooLarge := func() {
		c.fail(w, http.StatusRequestEntityTooLarge, typeInvalidRequest, codeRequestTooLarge, "",
			fmt.Sprintf("the request body exceeds %d bytes", limit))
	}
	if r.ContentLength > limit {
		tooLarge()
		return nil, false
	}
	overloaded := func() { c.failWith(w, g.heldRefusal()) }
	// A body of a declared length within the limit ends there: the HTTP
	// server reads no further.
	var body io.Reader = r.Body
	if r.ContentLength > 0 {
		if !g.holdBody(x, r.ContentLength) {
			overloaded()
			return nil, false
		}
	} else {
		body = &heldReader{r: http.MaxBytesReader(w, r.Body, limit), g: g, x: x}
	}
	growForDeclared(&x.body, r.ContentLength)
	rcw := http.NewResponseController(w)
	timeout := g.cfg.RequestBodyTimeout
	if r.ContentLength != 0 {
		_ = rcw.SetReadDeadline(time.Now().Add(timeout))
	}
	_, err := x.body.ReadFrom(body)
	var mbe *http.MaxBytesError
	var ne net.Error
	switch {
	case errors.Is(err, errBodyBudget):
		overloaded()
	case err == nil:
		if r.ContentLength != 0 {
			_ = rcw.SetReadDeadline(time.Time{})
		}
		return x.body.Bytes(), true
	case errors.As(err, &mbe):
		tooLarge()
	case errors.As(err, &ne) && ne.Timeout():
		// The deadline stays: net/http reads no more of the body, and the
		// connection closes after the answer.
		_ = r.Body.Close()
		w.Header().Set("Connection", "close")
		g.metrics.bodyTimeouts.Inc()
		c.fail(w, http.StatusRequestTimeout, typeInvalidRequest, codeRequestTimeout, "",
			fmt.Sprintf("the request body did not arrive within %v", timeout))
	default:
		c.fail(w, http.StatusBadRequest, typeInvalidRequest, codeUnreadableBody, "", "reading the request body failed: "+err.Error())
	}
	return nil, false
}

// queuesForSLO reports whether a request of kind k routed by alg waits in
// its model's SLO queue: a completion, chat, Messages or Responses request
// naming an SLO-aware algorithm. A request to another endpoint has no prompt to
// predict its latency from: it is routed at once, on load alone, as any
// algorithm routes it.
func queuesForSLO(k kind, alg string) bool {
	return k.generates() && routing.IsSLOAware(alg)
}

// readsPrompt reports whether an algorithm reads the prompt's tokens: the
// prefix algorithms (kv-aware and the SLO-aware ones among them) match
// them, least-latency predicts the output length from their count. The
// others route without tokenizing.
func readsPrompt(alg string) bool {
	switch alg {
	case routing.PrefixCache, routing.KVAware, routing.LeastLatency:
		return true
	}
	return routing.IsSLOAware(alg)
}

// adapterOf returns the LoRA adapter model resolves to among pods: "" when
// a pod serves it as its base model.
func adapterOf(model string, pods []*endpoint.Endpoint) string {
	for _, p := range pods {
		if p.Model == model {
			return ""
		}
	}
	return model
}

// tokenize returns the prompt's token ids from the engines' tokenizer, or
// nil when tokenization fails: the request is then routed on load alone,
// and the failure counted by reason. The pods take the /tokenize calls in
// turn, among those whose metrics are fresh when any is: a pod whose
// scrapes fail is likely gone. A pod that cannot be connected to is
// ejected, as a request that cannot reach it would eject it, and the call
// goes once more to another pod.
func (g *Gateway) tokenize(ctx context.Context, rc *types.RoutingContext, in *inference, pods []*endpoint.Endpoint) []uint32 {
	pod := g.tokenizerPod(pods, nil)
	ids, err := in.tokenize(ctx, g.tokenizer, g.tokenURL.forPod(pod))
	if err != nil && unreachable(err) {
		g.ejectUnreachable(pod, err)
		if other := g.tokenizerPod(pods, pod); other != nil {
			pod = other
			ids, err = in.tokenize(ctx, g.tokenizer, g.tokenURL.forPod(pod))
		}
	}
	if err == nil {
		return ids
	}
	reason := "other"
	var te *tokenizer.Error
	if errors.As(err, &te) {
		reason = string(te.Reason)
	}
	g.metrics.tokenizeFails.WithLabelValues(reason).Inc()
	if l := g.log.V(2); l.Enabled() {
		l.Info("Routing without prefix information: tokenization failed", "requestID", rc.RequestID,
			"clientRequestID", rc.LoggedClientRequestID(), "model", rc.Model, "pod", pod.ID, "reason", reason, "err", err)
	}
	return nil
}

// tokenizerPod returns the next pod of pods to ask for tokens, other than
// not (nil when there is none): the next in turn among those whose metrics
// are fresh and that are not ejected, or among all of them when none is.
func (g *Gateway) tokenizerPod(pods []*endpoint.Endpoint, not *endpoint.Endpoint) *endpoint.Endpoint {
	turn := g.nextTokenize.Add(1)
	var fallback *endpoint.Endpoint
	for i := range uint64(len(pods)) {
		p := pods[(turn+i)%uint64(len(pods))]
		if p == not {
			continue
		}
		if g.store.PodScrapeState(p.Key) == cache.ScrapeFresh {
			if _, ejected := g.store.PodEjection(p); !ejected {
				return p
			}
		}
		if fallback == nil {
			fallback = p
		}
	}
	return fallback
}

// unreachable reports a tokenization that failed because the pod could
// not be connected to.
func unreachable(err error) bool {
	var te *tokenizer.Error
	return errors.As(err, &te) && te.Reason == tokenizer.ReasonConnection &&
		(errors.Is(err, syscall.ECONNREFUSED) || isDialError(err))
}

// isDialError reports an error of dialling.
func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// ejectUnreachable ejects pod, which could not be connected to.
func (g *Gateway) ejectUnreachable(pod *endpoint.Endpoint, err error) {
	reason := cache.EjectDialFailed
	if errors.Is(err, syscall.ECONNREFUSED) {
		reason = cache.EjectConnectionRefused
	}
	g.store.EjectPod(pod, reason)
}

// predictOutput sets the request's predicted output length from the
// model's recent requests of a similar prompt length, capped by the
// request's own limit; it needs the prompt's length.
func (g *Gateway) predictOutput(rc *types.RoutingContext, maxTokens int) {
	n := rc.InputTokens()
	if n == 0 {
		return
	}
	p, err := g.predictors.GetOutputPredictor(rc.Model)
	if err != nil {
		return
	}
	out := p.Predict(n)
	if maxTokens > 0 && out > maxTokens {
		out = maxTokens
	}
	rc.PredictedOutputTokens = out
}

// forward routes the request, sends it to the chosen pod and relays the
// response, each attempt recorded in the request ledger as an attempt of
// req, opened when the request is sent and closed once it ended; first,
// when not nil, is the first attempt, routed and opened already (x.d its
// decision). A pod that cannot be connected to was sent nothing: it is
// ejected, its attempt closed as failed, and the request is routed again
// among the candidates not tried yet and not ejected meanwhile, until one
// answers or none is left. A request that waited for a pod meeting its SLO
// is not held again: its retries go where kv-aware would send them. It
// reports whether the response broke off after its headers and the
// client's connection must be cut.
func (g *Gateway) forward(w http.ResponseWriter, r *http.Request, a admitted, rc *types.RoutingContext, req *inflight.Request,
	x *exchange, c *call, first *inflight.Handle) (abort bool) {
	b, candidates := a.b, a.pods
	var tried []string
	for attempt := 0; ; attempt++ {
		h := first
		if attempt > 0 || h == nil {
			var err error
			if h, err = g.open(r.Context(), b, rc, candidates, x, req); err != nil {
				c.fail(w, http.StatusServiceUnavailable, typeServiceUnavailable, codeNoReadyPod, "", err.Error())
				return false
			}
		}
		pod := x.d.Endpoint
		addr := pod.Address
		x.head = appendForwardHead(x.head[:0], r, x.in.kind, addr, len(a.body), rc.RequestID, pinnedRank(h))
		pc, err := g.send(r.Context(), addr, x.head, a.body)
		c.lap(phaseRoute)
		if attempt == 0 {
			g.metrics.overhead.Observe(c.total().Seconds())
		}
		if err == nil {
			return g.respond(w, r, pc, rc, x, c, h, a.dropUsage, pod)
		}
		if r.Context().Err() != nil {
			h.Close(inflight.Cancelled, "client went away")
			c.status = statusClientClosed
			return false
		}
		reason := failureReason(err)
		h.Close(inflight.Failed, reason)
		g.metrics.upstreamFails.WithLabelValues(reason).Inc()
		tried = append(tried, x.d.PodKey+" ("+addr+")")
		if reason == failSend {
			c.fail(w, http.StatusBadGateway, typeUpstream, codeUpstreamFailed, "",
				fmt.Sprintf("pod %s failed before answering: %v", tried[len(tried)-1], err))
			return false
		}
		b.store.EjectPod(pod, cache.EjectionReason(reason))
		x.snaps = b.store.Snapshots(candidates, x.snaps[:0])
		if candidates = untriedReachable(candidates, x.snaps, pod); len(candidates) == 0 {
			msg := fmt.Sprintf("no pod of the model could be reached: %s: %v", strings.Join(tried, ", "), err)
			if a.pinned {
				msg = fmt.Sprintf("pod %s, which holds the stored response the request needs, could not be reached: %v",
					tried[0], err)
			} else if others := a.ready - len(tried); others > 0 {
				msg += fmt.Sprintf("; the model's other ready pods (%d) are ejected after failed connections", others)
			}
			c.fail(w, http.StatusServiceUnavailable, typeServiceUnavailable, codePodsUnreachable, "", msg)
			return false
		}
		g.metrics.retries.WithLabelValues(reason).Inc()
		if l := g.log.V(2); l.Enabled() {
			l.Info("Pod unreachable; routing the request to another pod", "requestID", rc.RequestID,
				"clientRequestID", rc.LoggedClientRequestID(), "model", rc.Model, "pod", pod.ID, "err", err)
		}
	}
}

// send sends a request, head and body, to the pod at addr on a connection
// of the pool, dialling one when none is idle. A connection the pod reset
// while it was idle fails the write before anything reached the engine:
// the request is then sent once more on a new connection.
func (g *Gateway) send(ctx context.Context, addr string, head, body []byte) (*podConn, error) {
	for {
		pc, err := g.pods.conn(ctx, addr)
		if err != nil {
			return nil, err
		}
		err = pc.send(head, body, g.cfg.FirstByteTimeout, g.cfg.ResponseTimeout)
		if err == nil {
			return pc, nil
		}
		pc.close()
		if !pc.reused || !(errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)) {
			return nil, &sendError{err}
		}
	}
}

// sendError is a failure to write a request to a pod on an open
// connection: some of it may have reached the engine.
type sendError struct{ err error }

func (e *sendError) Error() string { return "send the request: " + e.err.Error() }
func (e *sendError) Unwrap() error { return e.err }

// open routes the request among candidates, describing the decision in
// x.d, and opens its attempt on the chosen pod as an attempt of req. It
// fails when the router finds no pod.
func (g *Gateway) open(ctx context.Context, b *backend, rc *types.RoutingContext, candidates []*endpoint.Endpoint, x *exchange,
	req *inflight.Request) (*inflight.Handle, error) {
	x.snaps = b.store.Snapshots(candidates, x.snaps[:0])
	err := b.router.Route(ctx, rc, x.snaps, &x.d)
	if errors.Is(err, cache.ErrLoadCapacityReached) || errors.Is(err, cache.ErrSLOFailureRequest) {
		// No pod is predicted to meet the SLO: the request, a retry after
		// its queue let it through, is not held again and goes where
		// kv-aware sends it.
		rc.Algorithm = routing.KVAware
		err = b.router.Route(ctx, rc, x.snaps, &x.d)
	}
	if err != nil {
		return nil, err
	}
	route := x.d.Route()
	route.PendingLoad = g.requestLoad(rc, x.d.Endpoint)
	return g.openAttempt(x, req, route), nil
}

// requestLoad is the share of pod's capacity the request takes by the GPU
// profile of the pod's deployment, 0 without one.
func (g *Gateway) requestLoad(rc *types.RoutingContext, pod *endpoint.Endpoint) float64 {
	load, err := g.pendingLoad.RequestLoad(rc, pod)
	if err != nil {
		if l := g.log.V(2); l.Enabled() {
			l.Info("No pending load for request", "requestID", rc.RequestID,
				"clientRequestID", rc.LoggedClientRequestID(), "pod", pod.ID, "err", err)
		}
		return 0
	}
	return load
}
