package gateway

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/inflight"
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
	// HeaderServerTiming carries the gateway's own time (decode, tokenize,
	// route) as the Server-Timing metric ServerTimingGateway, in
	// milliseconds: "gateway;dur=0.412".
	HeaderServerTiming = "Server-Timing"
	// ServerTimingGateway names the gateway's metric in Server-Timing.
	ServerTimingGateway = "gateway"
)

// statusClientClosed labels requests whose client went away before the
// response began (nginx's convention); it is never sent.
const statusClientClosed = 499

// maxUsageScanBytes bounds how much of a response that is not streamed is
// kept to read its usage; the usage of a longer response is not recorded.
const maxUsageScanBytes = 4 << 20

// exchange is the working memory of one proxied request, pooled.
type exchange struct {
	body   bytes.Buffer // the client's body
	sent   bytes.Buffer // the body with stream_options added
	resp   bytes.Buffer // a whole response, kept to read its usage
	in     inference
	d      routing.Decision
	snaps  []cache.PodSnapshot // the candidates' snapshots
	buf    []byte
	reader *bufio.Reader
	relay  sseRelay
}

var exchanges = sync.Pool{New: func() any {
	return &exchange{buf: make([]byte, 32<<10), reader: bufio.NewReaderSize(nil, 64<<10)}
}}

// maxPooledBuffer is the largest buffer an exchange keeps when returned to
// the pool, so that one huge request does not pin its memory.
const maxPooledBuffer = 1 << 20

func putExchange(x *exchange) {
	for _, b := range []*bytes.Buffer{&x.body, &x.sent, &x.resp} {
		if b.Cap() > maxPooledBuffer {
			*b = bytes.Buffer{}
		}
		b.Reset()
	}
	x.in = inference{}
	clear(x.snaps)
	x.snaps = x.snaps[:0]
	x.reader.Reset(nil)
	x.relay = sseRelay{event: x.relay.event[:0]}
	if cap(x.relay.event) > maxPooledBuffer {
		x.relay.event = nil
	}
	exchanges.Put(x)
}

// call is what the metrics record of one inference request.
type call struct {
	start time.Time
	// overhead is the time from start to sending the request to its first
	// pod.
	overhead  time.Duration
	model     string // "" until the model is known to serve
	algorithm string // "" until resolved
	status    int
}

// fail answers with a JSON error and records its status.
func (c *call) fail(w http.ResponseWriter, status int, typ, code, param, message string) {
	c.status = status
	writeError(w, status, typ, code, param, message)
}

// serveInference returns the handler of an OpenAI inference endpoint.
func (g *Gateway) serveInference(k kind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c := call{start: time.Now(), status: http.StatusOK}
		g.metrics.inFlight.Inc()
		x := exchanges.Get().(*exchange)
		defer func() {
			putExchange(x)
			g.metrics.inFlight.Dec()
			g.metrics.requests.WithLabelValues(c.model, g.metrics.status(c.status), c.algorithm).Inc()
			g.metrics.duration.WithLabelValues(c.model).Observe(time.Since(c.start).Seconds())
		}()
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			c.fail(w, http.StatusMethodNotAllowed, typeInvalidRequest, codeMethodNotAllowed, "", r.Method+" is not allowed; use POST")
			return
		}
		g.proxy(w, r, k, x, &c)
	}
}

// admitted is a request that passed the gateway's checks.
type admitted struct {
	b *backend
	// pods are the candidates: the model's ready pods that are not
	// ejected, or all of them when all are; ready counts the ready pods.
	pods  []*endpoint.Endpoint
	ready int
	// body is what is forwarded: the client's, or the one asking for the
	// usage chunk when dropUsage is set.
	body      []byte
	dropUsage bool
}

// proxy serves one inference request: admit, record in the request
// ledger, tokenize, route and forward.
func (g *Gateway) proxy(w http.ResponseWriter, r *http.Request, k kind, x *exchange, c *call) {
	a, ok := g.admit(w, r, k, x, c)
	if !ok {
		return
	}
	rc := types.NewRoutingContext(g.requestID(), c.model)
	rc.ReceivedAt = c.start
	rc.Algorithm = c.algorithm
	rc.LoraAdapter = adapterOf(c.model, a.pods)
	req := g.ledger.Admit(rc.RequestID, rc.Model)
	defer req.End()
	if g.tokenizer != nil && readsPrompt(c.algorithm) {
		rc.PromptTokenIDs = g.tokenize(r.Context(), rc, &x.in, a.pods)
	}
	g.predictOutput(rc, x.in.maxTokens())
	var first *inflight.Handle
	if routing.IsSLOAware(c.algorithm) {
		var ok bool
		if first, ok = g.routeSLO(w, r, &a, rc, req, x, c); !ok {
			return
		}
	}
	g.forward(w, r, a, rc, req, x, c, first)
}

// admit reads and checks a request, answering the client when it fails a
// check: the gateway is ready, the body is within the limit and decodes,
// the routing algorithm is known, and a ready pod serves the model. It sets
// c's model and algorithm as they become known.
func (g *Gateway) admit(w http.ResponseWriter, r *http.Request, k kind, x *exchange, c *call) (admitted, bool) {
	a := admitted{b: g.ready()}
	if a.b == nil {
		c.fail(w, http.StatusServiceUnavailable, typeServiceUnavailable, codeNotReady, "", errNotReady.Error())
		return a, false
	}
	body, ok := g.readBody(w, r, x, c)
	if !ok {
		return a, false
	}
	if err := x.in.decode(k, body); err != nil {
		c.fail(w, http.StatusBadRequest, typeInvalidRequest, codeInvalidJSON, "", jsonError(err))
		return a, false
	}
	model := x.in.model()
	if model == "" {
		c.fail(w, http.StatusBadRequest, typeInvalidRequest, codeMissingField, "model", "the request names no model")
		return a, false
	}
	alg, err := a.b.router.Resolve(r.Header.Get(routing.HeaderRoutingStrategy))
	if err != nil {
		c.fail(w, http.StatusBadRequest, typeInvalidRequest, codeUnknownStrategy, "", "header "+routing.HeaderRoutingStrategy+": "+err.Error())
		return a, false
	}
	c.algorithm = alg
	if a.pods, err = a.b.store.ListPodsByModel(model); err != nil {
		c.fail(w, http.StatusNotFound, typeInvalidRequest, codeModelNotFound, "model", fmt.Sprintf("the model `%s` does not exist", model))
		return a, false
	}
	c.model = model
	if len(a.pods) == 0 {
		c.fail(w, http.StatusServiceUnavailable, typeServiceUnavailable, codeNoReadyPod, "model",
			fmt.Sprintf("no pod serving the model `%s` is ready", model))
		return a, false
	}
	a.ready = len(a.pods)
	x.snaps = a.b.store.Snapshots(a.pods, x.snaps[:0])
	a.pods = withoutEjected(a.pods, x.snaps)
	a.body = body
	if sf := x.in.stream(); sf.Stream && !sf.clientWantsUsage() {
		a.dropUsage = true
		if a.body, err = withStreamUsage(&x.sent, body, sf.StreamOptions); err != nil {
			c.fail(w, http.StatusBadRequest, typeInvalidRequest, codeInvalidField, "stream_options", "stream_options: "+err.Error())
			return a, false
		}
	}
	return a, true
}

// readBody reads the request body into x, answering 413 when it exceeds
// the limit and 400 when it cannot be read.
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
	if r.ContentLength > 0 {
		x.body.Grow(int(r.ContentLength))
	}
	if _, err := x.body.ReadFrom(http.MaxBytesReader(w, r.Body, limit)); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			tooLarge()
		} else {
			c.fail(w, http.StatusBadRequest, typeInvalidRequest, codeUnreadableBody, "", "reading the request body failed: "+err.Error())
		}
		return nil, false
	}
	return x.body.Bytes(), true
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
// turn.
func (g *Gateway) tokenize(ctx context.Context, rc *types.RoutingContext, in *inference, pods []*endpoint.Endpoint) []uint32 {
	pod := pods[g.nextTokenize.Add(1)%uint64(len(pods))]
	ids, err := in.tokenize(ctx, g.tokenizer, g.tokenURL.forPod(pod))
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
			"model", rc.Model, "pod", pod.ID, "reason", reason, "err", err)
	}
	return nil
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
// is not held again: its retries go where kv-aware would send them.
func (g *Gateway) forward(w http.ResponseWriter, r *http.Request, a admitted, rc *types.RoutingContext, req *inflight.Request,
	x *exchange, c *call, first *inflight.Handle) {
	b, candidates := a.b, a.pods
	var tried []string
	for attempt := 0; ; attempt++ {
		h := first
		if attempt > 0 || h == nil {
			x.snaps = b.store.Snapshots(candidates, x.snaps[:0])
			err := b.router.Route(r.Context(), rc, x.snaps, &x.d)
			if errors.Is(err, cache.ErrLoadCapacityReached) || errors.Is(err, cache.ErrSLOFailureRequest) {
				rc.Algorithm = routing.KVAware
				err = b.router.Route(r.Context(), rc, x.snaps, &x.d)
			}
			if err != nil {
				c.fail(w, http.StatusServiceUnavailable, typeServiceUnavailable, codeNoReadyPod, "", err.Error())
				return
			}
			route := x.d.Route()
			route.PendingLoad = g.requestLoad(rc, x.d.Endpoint)
			h = req.Route(route)
		}
		pod := x.d.Endpoint
		if attempt == 0 {
			c.overhead = time.Since(c.start)
			g.metrics.overhead.Observe(c.overhead.Seconds())
		}
		addr := pod.Address
		resp, err := g.transport.RoundTrip(newUpstreamRequest(r.Context(), r, addr, a.body, rc.RequestID))
		if err == nil {
			b.store.PodReachable(pod)
			g.relay(w, resp, rc, x, c, h, a.dropUsage, addr)
			return
		}
		if r.Context().Err() != nil {
			h.Close(inflight.Cancelled, "client went away")
			c.status = statusClientClosed
			return
		}
		reason := failureReason(err)
		h.Close(inflight.Failed, reason)
		g.metrics.upstreamFails.WithLabelValues(reason).Inc()
		tried = append(tried, x.d.PodKey+" ("+addr+")")
		if reason == failSend {
			c.fail(w, http.StatusBadGateway, typeUpstream, codeUpstreamFailed, "",
				fmt.Sprintf("pod %s failed before answering: %v", tried[len(tried)-1], err))
			return
		}
		b.store.EjectPod(pod, cache.EjectionReason(reason))
		x.snaps = b.store.Snapshots(candidates, x.snaps[:0])
		if candidates = untriedReachable(candidates, x.snaps, pod); len(candidates) == 0 {
			msg := fmt.Sprintf("no pod of the model could be reached: %s: %v", strings.Join(tried, ", "), err)
			if others := a.ready - len(tried); others > 0 {
				msg += fmt.Sprintf("; the model's other ready pods (%d) are ejected after failed connections", others)
			}
			c.fail(w, http.StatusServiceUnavailable, typeServiceUnavailable, codePodsUnreachable, "", msg)
			return
		}
		g.metrics.retries.WithLabelValues(reason).Inc()
		if l := g.log.V(2); l.Enabled() {
			l.Info("Pod unreachable; routing the request to another pod", "requestID", rc.RequestID,
				"model", rc.Model, "pod", pod.ID, "err", err)
		}
	}
}

// requestLoad is the share of pod's capacity the request takes by the GPU
// profile of the pod's deployment, 0 without one.
func (g *Gateway) requestLoad(rc *types.RoutingContext, pod *endpoint.Endpoint) float64 {
	load, err := g.pendingLoad.RequestLoad(rc, pod)
	if err != nil {
		if l := g.log.V(2); l.Enabled() {
			l.Info("No pending load for request", "requestID", rc.RequestID, "pod", pod.ID, "err", err)
		}
		return 0
	}
	return load
}

// relay writes the pod's response to the client: its status and headers
// with the gateway's, then its body, as server-sent events relayed as they
// come when the request streams, or copied whole otherwise. It closes the
// attempt h once the response ended: done when it was relayed to its end
// (with the usage the engine reported, when it was a success that reported
// one), cancelled when the client went away, failed when the response
// broke off.
func (g *Gateway) relay(w http.ResponseWriter, resp *http.Response, rc *types.RoutingContext, x *exchange, c *call,
	h *inflight.Handle, dropUsage bool, addr string) {
	defer resp.Body.Close()
	hd := w.Header()
	copyHeader(hd, resp.Header)
	hd.Set(HeaderTargetPod, addr)
	hd.Set(HeaderTargetPodName, x.d.PodKey)
	hd.Set(routing.HeaderRoutingStrategy, x.d.Algorithm)
	// The pod's values are shared with its response: append to a copy.
	hd[HeaderServerTiming] = append(slices.Clip(hd[HeaderServerTiming]), serverTiming(c.overhead))
	sse := x.in.stream().Stream && resp.StatusCode == http.StatusOK &&
		strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	if sse {
		hd.Del("Content-Length")
	}
	c.status = resp.StatusCode
	w.WriteHeader(resp.StatusCode)
	var u usage
	var ok bool
	var err error
	if sse {
		u, ok, err = g.relayStream(w, resp, rc, x, c, h, dropUsage)
	} else {
		var over bool
		over, err = relayWhole(w, resp.Body, x.buf, &x.resp, maxUsageScanBytes)
		if err == nil && !over {
			u, ok = responseUsage(x.resp.Bytes())
		}
	}
	switch {
	case errors.Is(err, errClientGone):
		h.Close(inflight.Cancelled, "client went away")
		return
	case err != nil:
		h.Close(inflight.Failed, failBody)
		g.metrics.upstreamFails.WithLabelValues(failBody).Inc()
		if l := g.log.V(2); l.Enabled() {
			l.Info("Response broke off", "requestID", rc.RequestID, "model", rc.Model, "pod", x.d.PodKey, "err", err)
		}
		return
	}
	if resp.StatusCode == http.StatusOK {
		if ok {
			h.ReportUsage(inflight.Usage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens})
		} else {
			g.metrics.usageMissing.Inc()
		}
	}
	h.Close(inflight.Done, "")
}

// relayStream relays a server-sent event stream, reporting the first token
// to the request ledger and to the TTFT metric.
func (g *Gateway) relayStream(w http.ResponseWriter, resp *http.Response, rc *types.RoutingContext, x *exchange, c *call,
	h *inflight.Handle, dropUsage bool) (usage, bool, error) {
	rcw := http.NewResponseController(w)
	if err := rcw.Flush(); err != nil {
		return usage{}, false, errClientGone
	}
	x.reader.Reset(resp.Body)
	s := &x.relay
	*s = sseRelay{dst: w, flush: rcw.Flush, src: x.reader, dropUsage: dropUsage, event: s.event[:0],
		firstToken: func() {
			h.FirstToken()
			g.metrics.ttft.WithLabelValues(rc.Model).Observe(time.Since(c.start).Seconds())
		}}
	err := s.run()
	return s.usage, s.hasUsage, err
}

// serverTiming formats the gateway's Server-Timing metric for overhead,
// in milliseconds with microsecond precision.
func serverTiming(overhead time.Duration) string {
	var buf [32]byte
	b := append(buf[:0], ServerTimingGateway+";dur="...)
	b = strconv.AppendFloat(b, float64(overhead.Microseconds())/1000, 'f', 3, 64)
	return string(b)
}
