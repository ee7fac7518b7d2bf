package extproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/gateway"
	"github.com/kvgate/kvgate/pkg/routing"
)

// stream is one request's external processing stream, driven by one
// goroutine: the messages Envoy sends and the Server's answers.
type stream struct {
	s   *Server
	srv extprocv3.ExternalProcessor_ProcessServer
	ctx context.Context
	log klog.Logger

	// reqMode and respMode are the body send modes, learned from the
	// first message's protocol configuration (BUFFERED and STREAMED
	// without one); configured reports that it came. waitBody reports that
	// the request headers' answer waits for the body.
	reqMode, respMode filterv3.ProcessingMode_BodySendMode
	configured        bool
	sendWithoutWait   bool
	waitBody          bool

	start   time.Time
	hdr     requestHeaders
	subset  []string
	headers bool // the request headers arrived

	// The request's body and the lengths of its messages, answered once
	// the endpoint is known when the headers' answer waits for the body.
	body   []byte
	pieces []int
	// held is the bytes of the gateway's request byte bound the body
	// holds (Picker.HoldBody), given back when the stream ends.
	held     int
	trailers bool // trailers ended the request body

	algorithm string
	decided   bool
	// pick is the request's, nil before the decision and for a request
	// continued without an endpoint, whose messages are answered
	// unchanged.
	pick *gateway.Pick

	// The response: its status (0 before its headers), the Response
	// following an attempt's, whether it ended, and the oversized events
	// counted so far.
	status    int
	resp      *gateway.Response
	respEnded bool
	firstSeen bool
	oversized int
	// answered is the status of an immediate response sent, 0 for none,
	// and refusedModel the model the refusal named; closed reports that
	// the stream has nothing more to do.
	answered     int
	refusedModel string
	closed       bool
	// cancelled reports an attempt cancelled before its response ended.
	cancelled bool

	out []byte // scratch for the pieces of a response body
}

// newStream returns the stream of srv, holding one of the Server's
// MaxStreams slots until finish, or nil when all are taken.
func (s *Server) newStream(srv extprocv3.ExternalProcessor_ProcessServer) *stream {
	if !s.streams.Take(1) {
		return nil
	}
	s.metrics.inFlight.Inc()
	return &stream{s: s, srv: srv, ctx: srv.Context(), log: s.log, start: time.Now(),
		reqMode: filterv3.ProcessingMode_BUFFERED, respMode: filterv3.ProcessingMode_STREAMED}
}

// run receives and answers messages until the stream ends.
func (st *stream) run() error {
	for !st.closed {
		req, err := st.srv.Recv()
		if err != nil {
			return st.ended(err)
		}
		if err := st.handle(req); err != nil {
			return err
		}
	}
	return nil
}

// handle answers one message.
func (st *stream) handle(req *extprocv3.ProcessingRequest) error {
	if pc := req.GetProtocolConfig(); pc != nil && !st.configured {
		st.configured = true
		st.reqMode, st.respMode = pc.GetRequestBodyMode(), pc.GetResponseBodyMode()
		st.sendWithoutWait = pc.GetSendBodyWithoutWaitingForHeaderResponse()
	}
	if req.GetObservabilityMode() {
		st.s.metrics.errors.WithLabelValues(errMisconfigure).Inc()
		return status.Error(codes.FailedPrecondition, "kvgate picks endpoints, which Envoy's observability_mode ignores: turn it off")
	}
	switch m := req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return st.requestHeaders(req, m.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		return st.requestBody(m.RequestBody)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return st.requestTrailers()
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return st.responseHeaders(req, m.ResponseHeaders)
	case *extprocv3.ProcessingRequest_ResponseBody:
		return st.responseBody(m.ResponseBody)
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		return st.responseTrailers()
	}
	return st.protocolError("a message with no request part")
}

// requestHeaders reads the request's headers and answers them, unless the
// answer waits for the body.
func (st *stream) requestHeaders(req *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) error {
	if st.headers {
		return st.protocolError("request headers twice")
	}
	st.headers = true
	st.hdr = readRequestHeaders(h.GetHeaders())
	st.subset = subset(req.GetMetadataContext())
	path, _, _ := strings.Cut(st.hdr.path, "?")
	if path == gateway.PathModels && (st.hdr.method == http.MethodGet || st.hdr.method == http.MethodHead) {
		body, err := st.s.picker.Models()
		if err != nil {
			return st.refuse(err)
		}
		st.answered = http.StatusOK
		return st.sendLast(immediate(http.StatusOK, body, "kvgate_models"))
	}
	alg, err := st.s.picker.Algorithm(st.hdr.strategy)
	if err != nil {
		return st.refuse(err)
	}
	st.algorithm = alg
	if h.GetEndOfStream() {
		return st.decideAndAnswer(atHeaders)
	}
	switch {
	case st.reqMode == filterv3.ProcessingMode_NONE:
		return st.misconfigured("request_body_mode is NONE, so kvgate never sees the body it picks the pod by: use BUFFERED or FULL_DUPLEX_STREAMED")
	case st.reqMode == filterv3.ProcessingMode_STREAMED && !st.sendWithoutWait:
		return st.misconfigured("request_body_mode STREAMED sends the body after Envoy picked the pod: set " +
			"send_body_without_waiting_for_header_response, or use BUFFERED or FULL_DUPLEX_STREAMED")
	case st.reqMode == filterv3.ProcessingMode_BUFFERED || st.reqMode == filterv3.ProcessingMode_BUFFERED_PARTIAL:
		return st.send(requestHeadersResponse(st.headersAnswer(nil)))
	}
	st.waitBody = true
	return nil
}

// headersAnswer is the answer to the request headers: the endpoint's
// headers when pick is not nil, else the destination headers a client may
// not set removed; routing-strategy set and the route cache cleared, as
// AIBrix's Envoy configuration expects.
func (st *stream) headersAnswer(pick *gateway.Pick) *extprocv3.CommonResponse {
	hm := &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{set(routing.HeaderRoutingStrategy, st.algorithm)}}
	if pick != nil {
		hm.SetHeaders = st.endpointHeaders()
	} else {
		hm.RemoveHeaders = destinationHeaders
	}
	return &extprocv3.CommonResponse{HeaderMutation: hm, ClearRouteCache: true}
}

// endpointHeaders are the request headers naming the picked endpoint, the
// algorithm that picked it, and the data-parallel rank the request is
// pinned to, if any (a client's own rank header is left as it is).
func (st *stream) endpointHeaders() []*corev3.HeaderValueOption {
	addr := st.pick.Endpoint().Address
	hs := []*corev3.HeaderValueOption{set(HeaderDestination, addr), set(gateway.HeaderTargetPod, addr),
		set(routing.HeaderRoutingStrategy, st.pick.Algorithm())}
	if r := st.pick.DPRank(); r >= 0 {
		hs = append(hs, set(headerDPRank, strconv.Itoa(r)))
	}
	return hs
}

// requestBody takes a piece of the request's body; the last one decides.
func (st *stream) requestBody(b *extprocv3.HttpBody) error {
	if !st.headers || st.decided {
		return st.protocolError("a request body piece after the request was decided, or before its headers")
	}
	if limit := st.s.picker.MaxBodyBytes(); int64(len(st.body)+len(b.GetBody())) > limit {
		st.s.metrics.errors.WithLabelValues(errTooLarge).Inc()
		return st.refuse(&gateway.Error{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
			Code: "request_too_large", Message: fmt.Sprintf("the request body exceeds %d bytes", limit)})
	}
	if e := st.s.picker.HoldBody(len(b.GetBody())); e != nil {
		st.s.metrics.errors.WithLabelValues(errOverloaded).Inc()
		return st.refuse(e)
	}
	st.held += len(b.GetBody())
	st.body = append(st.body, b.GetBody()...)
	if !st.waitBody {
		// BUFFERED and BUFFERED_PARTIAL send the body in one message: the
		// whole body, without end_of_stream when trailers follow it (Envoy
		// sends a buffered body once the trailers arrive), or, in
		// BUFFERED_PARTIAL, the body cut at Envoy's buffer limit. Without
		// the announced mode, a piece without end_of_stream may as well be
		// the first of a streamed body.
		if !b.GetEndOfStream() && !st.configured {
			return st.misconfigured("the request body comes without end_of_stream after its headers were answered, and " +
				"Envoy (before 1.34) does not say whether it streams it or trailers end it: use request_body_mode BUFFERED " +
				"and Envoy 1.34 or later for requests with trailers")
		}
		return st.decideAndAnswer(atBody)
	}
	if len(st.pieces) == maxBodyPieces {
		st.s.metrics.errors.WithLabelValues(errTooLarge).Inc()
		return st.refuse(&gateway.Error{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
			Code: "request_too_large", Message: fmt.Sprintf("the request body comes in more than %d pieces", maxBodyPieces)})
	}
	st.pieces = append(st.pieces, len(b.GetBody()))
	if b.GetEndOfStream() {
		return st.decideAndAnswer(afterBody)
	}
	return nil
}

// requestTrailers answers the request's trailers, which end its body when
// the headers' answer waits for it.
func (st *stream) requestTrailers() error {
	if st.waitBody && !st.decided {
		st.trailers = true
		if err := st.decideAndAnswer(afterBody); err != nil || st.closed {
			return err
		}
	}
	return st.send(trailersResponse(false))
}

// answerPoint is the message a decision answers.
type answerPoint uint8

const (
	// atHeaders: the request has no body; its headers get the answer.
	atHeaders answerPoint = iota
	// atBody: BUFFERED modes; the one body message gets the answer, its
	// headers having been answered already.
	atBody
	// afterBody: the headers' answer waited; the headers and every body
	// piece get their answers.
	afterBody
)

// decideAndAnswer picks the pod of the complete request and answers the
// messages waiting for the decision.
func (st *stream) decideAndAnswer(at answerPoint) error {
	st.decided = true
	t0 := time.Now()
	in := gateway.PickRequest{Path: st.hdr.path, Method: st.hdr.method, Body: st.body, ContentType: st.hdr.contentType, Strategy: st.hdr.strategy,
		ClientRequestID: st.hdr.requestID, Objective: st.hdr.objective, FairnessID: st.hdr.fairnessID, NamesRank: st.hdr.namesRank,
		Subset: st.subset, Received: st.start}
	in.ModelRewrite = st.hdr.modelRewrite
	if st.s.cfg.MaxMessageTimeout > 0 {
		in.Waiting = st.extendMessageTimeout
	}
	pick, perr := st.s.picker.Pick(st.ctx, in)
	if perr != nil {
		if perr.Status != http.StatusServiceUnavailable || !st.s.cfg.FailOpen {
			return st.refuse(perr)
		}
		st.s.metrics.failOpen.WithLabelValues(st.s.metrics.status(perr.Status)).Inc()
		if l := st.log.V(2); l.Enabled() {
			l.Info("Continuing without an endpoint", "model", perr.Model, "code", perr.Code, "reason", perr.Message)
		}
	}
	st.pick = pick
	if l := st.log.V(4); l.Enabled() && pick != nil {
		l.Info("Picked", "requestID", pick.RequestID(), "clientRequestID", pick.LoggedClientRequestID(), "model", pick.Model(), "pod", pick.Endpoint().ID,
			"address", pick.Endpoint().Address, "algorithm", pick.Algorithm())
	}
	err := st.answerDecision(at)
	st.s.metrics.decision.Observe(time.Since(t0).Seconds())
	return err
}

// extendMessageTimeout asks Envoy to wait for the decision until the
// request leaves its model's SLO queue at the latest, and a second more to
// route and answer it, within Config.MaxMessageTimeout. Envoy takes one
// override per message it waits on. A send that fails is counted by send
// and not acted on here: the stream is gone, its context ends the wait,
// and the decision's answer fails the same way.
func (st *stream) extendMessageTimeout(until time.Time) {
	d := min(time.Until(until)+time.Second, st.s.cfg.MaxMessageTimeout)
	if d < time.Millisecond {
		return
	}
	st.s.metrics.timeoutOverrides.Inc()
	_ = st.send(&extprocv3.ProcessingResponse{OverrideMessageTimeout: durationpb.New(d)})
}

// answerDecision sends the answers the decision was waiting for: the
// endpoint's headers and metadata, and the body when it changed; without a
// pick (fail-open), the messages unchanged.
func (st *stream) answerDecision(at answerPoint) error {
	var md *structpb.Struct
	body, changed := st.body, false
	if st.pick != nil {
		md = endpointMetadata(st.pick.Endpoint().Address)
		body, changed = st.pick.Body()
	}
	switch at {
	case atHeaders:
		resp := requestHeadersResponse(st.headersAnswer(st.pick))
		resp.DynamicMetadata = md
		return st.send(resp)
	case atBody:
		c := &extprocv3.CommonResponse{}
		if st.pick != nil {
			// Applied before Envoy picks the host, the body being buffered.
			c.HeaderMutation = &extprocv3.HeaderMutation{SetHeaders: st.endpointHeaders()}
			if changed {
				c.HeaderMutation.SetHeaders = append(c.HeaderMutation.SetHeaders, set("content-length", strconv.Itoa(len(body))))
				c.BodyMutation = replaceBody(body).BodyMutation
			}
		}
		resp := requestBodyResponse(c)
		resp.DynamicMetadata = md
		return st.send(resp)
	}
	ha := st.headersAnswer(st.pick)
	if changed && st.hdr.hasLength {
		// Envoy drops the request's content-length when a streamed body
		// may change, unless allow_content_length_header keeps it: it then
		// needs the length of the body kvgate sends.
		ha.HeaderMutation.SetHeaders = append(ha.HeaderMutation.SetHeaders, set("content-length", strconv.Itoa(len(body))))
	}
	hr := requestHeadersResponse(ha)
	hr.DynamicMetadata = md
	if err := st.send(hr); err != nil {
		return err
	}
	if st.reqMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		return st.sendStreamed(body, !st.trailers, false)
	}
	for i := range st.pieces {
		c := &extprocv3.CommonResponse{}
		if changed {
			if i == 0 {
				c = replaceBody(body)
			} else {
				c = replaceBody(nil)
			}
		}
		if err := st.send(requestBodyResponse(c)); err != nil {
			return err
		}
	}
	return nil
}

// sendStreamed sends body back in FULL_DUPLEX_STREAMED pieces, the last
// one marked end of stream when end is set.
func (st *stream) sendStreamed(body []byte, end, response bool) error {
	for {
		n := min(len(body), maxBodyPiece)
		last := n == len(body)
		c := streamedBody(body[:n], end && last)
		var err error
		if response {
			err = st.send(responseBodyResponse(c))
		} else {
			err = st.send(requestBodyResponse(c))
		}
		if err != nil || last {
			return err
		}
		body = body[n:]
	}
}

// responseHeaders opens the attempt's response, or records the failure
// Envoy reports, and answers with the headers the proxy adds.
func (st *stream) responseHeaders(req *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) error {
	rh := readResponseHeaders(h.GetHeaders())
	st.status = rh.status
	if st.pick == nil || st.status == 0 {
		st.respEnded = h.GetEndOfStream()
		return st.send(responseHeadersResponse(&extprocv3.CommonResponse{}))
	}
	if st.upstreamFailed(codeDetails(req)) {
		st.respEnded = true
		return st.send(responseHeadersResponse(&extprocv3.CommonResponse{}))
	}
	if addr := served(req.GetMetadataContext()); addr != "" && st.pick.Served(addr) {
		st.log.V(2).Info("The proxy served the request from another endpoint", "requestID", st.pick.RequestID(),
			"clientRequestID", st.pick.LoggedClientRequestID(), "model", st.pick.Model(), "pod", st.pick.Endpoint().ID, "address", addr)
	}
	st.resp = st.pick.Response(rh.status, rh.contentType)
	ep := st.pick.Endpoint()
	hm := &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
		set(gateway.HeaderTargetPod, ep.Address), set(gateway.HeaderTargetPodName, ep.ID),
		set(routing.HeaderRoutingStrategy, st.pick.Algorithm()),
	}}
	if _, changed := st.pick.Body(); changed && st.resp.EventStream() && rh.contentLength != "" {
		hm.RemoveHeaders = []string{"content-length"} // the usage chunk is withheld
	}
	if h.GetEndOfStream() {
		st.endResponse()
	}
	return st.send(responseHeadersResponse(&extprocv3.CommonResponse{HeaderMutation: hm}))
}

// upstreamFailed closes the attempt when the response is Envoy's own,
// answering for a pod it could not get a response from (details, Envoy's
// response.code_details), and reports whether it did. A pod Envoy could not
// connect to is ejected, as the proxy ejects one.
func (st *stream) upstreamFailed(details string) bool {
	if st.status < 500 || details == "" {
		return false
	}
	var eject cache.EjectionReason
	switch {
	case strings.HasPrefix(details, "upstream_reset_before_response_started"):
		if strings.Contains(details, "connection_failure") || strings.Contains(details, "connection_timeout") {
			eject = cache.EjectDialFailed
			if strings.Contains(strings.ToLower(details), "refused") {
				eject = cache.EjectConnectionRefused
			}
		}
	case strings.HasPrefix(details, "upstream_response_timeout"), strings.HasPrefix(details, "upstream_per_try_timeout"):
	default:
		return false
	}
	if eject != "" {
		st.pick.Unreachable(eject)
	} else {
		st.pick.Fail(gateway.FailSend)
	}
	st.log.V(2).Info("Envoy reports an upstream failure", "requestID", st.pick.RequestID(),
		"clientRequestID", st.pick.LoggedClientRequestID(), "model", st.pick.Model(), "pod", st.pick.Endpoint().ID, "details", details, "ejected", eject != "")
	return true
}

// responseBody relays a piece of the response body.
//
// BUFFERED and BUFFERED_PARTIAL send one body message, the last kvgate
// sees: it is relayed whole, event held back or not. Without end_of_stream
// it is, in BUFFERED, a body that trailers end (Envoy sends a buffered body
// once the trailers arrive, and sends the trailers only with
// response_trailer_mode SEND): the response ends with it. In
// BUFFERED_PARTIAL it may be a body cut at Envoy's buffer limit, whose
// rest passes unseen.
func (st *stream) responseBody(b *extprocv3.HttpBody) error {
	piece := b.GetBody()
	end := b.GetEndOfStream() || st.respMode == filterv3.ProcessingMode_BUFFERED
	last := end || st.respMode == filterv3.ProcessingMode_BUFFERED_PARTIAL
	out := piece
	if st.resp != nil && !st.respEnded {
		out = st.resp.Body(st.out[:0], piece, last)
		if st.resp.EventStream() {
			st.out = out[:0]
			st.countOversized()
		}
		if !st.firstSeen && st.resp.FirstToken() {
			st.firstSeen = true
			st.s.metrics.ttft.WithLabelValues(st.pick.Model()).Observe(time.Since(st.start).Seconds())
		}
		if end {
			st.endResponse()
		}
	} else if end {
		st.respEnded = true
	}
	if st.respMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		if len(out) == 0 && !end {
			return nil // the start of an event, sent with the piece that completes it
		}
		return st.sendStreamed(out, end, true)
	}
	c := &extprocv3.CommonResponse{}
	if !bytes.Equal(out, piece) {
		c = replaceBody(out)
	}
	return st.send(responseBodyResponse(c))
}

// responseTrailers answers the response's trailers, which end it.
//
// In FULL_DUPLEX_STREAMED, the start of an event held back from the last
// piece is sent before the trailers. In STREAMED every piece was answered
// before Envoy sent the trailers, and a trailers answer carries no body:
// held bytes, the start of an event the upstream never ended with a blank
// line, are lost. The BUFFERED modes hold none back (see responseBody).
func (st *stream) responseTrailers() error {
	if st.resp != nil && !st.respEnded {
		rest := st.resp.Body(st.out[:0], nil, true)
		switch {
		case len(rest) == 0:
		case st.respMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
			if err := st.sendStreamed(rest, false, true); err != nil {
				return err
			}
		default:
			if l := st.log.V(2); l.Enabled() {
				l.Info("Trailers ended the response within an event: its start, held back, is lost", "requestID",
					st.pick.RequestID(), "clientRequestID", st.pick.LoggedClientRequestID(), "model", st.pick.Model(),
					"bytes", len(rest))
			}
		}
		st.endResponse()
	}
	st.respEnded = true
	return st.send(trailersResponse(true))
}

// countOversized counts the events of the response found oversized since
// the last call.
func (st *stream) countOversized() {
	if n := st.resp.OversizedEvents(); n > st.oversized {
		st.s.metrics.oversized.Add(float64(n - st.oversized))
		st.oversized = n
	}
}

// endResponse closes the attempt: its response ended.
func (st *stream) endResponse() {
	st.respEnded = true
	st.resp.Done()
}

// ended handles the end of the stream, err being what Recv returned.
func (st *stream) ended(err error) error {
	clean := errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled || st.ctx.Err() != nil
	if !st.respEnded && st.status != 0 && st.respMode == filterv3.ProcessingMode_NONE && errors.Is(err, io.EOF) {
		// Envoy sent no response body: the stream's end is the response's.
		if st.resp != nil {
			st.endResponse()
		} else {
			st.respEnded = true
		}
	}
	if st.pick != nil && !st.respEnded && !st.cancelled {
		st.cancelled = true
		if st.resp != nil {
			st.pick.Cancel("the stream ended before the response did: the client went away or the proxy reset the request")
		} else {
			st.pick.Cancel("the stream ended before a response: the client went away")
		}
	}
	if clean {
		return nil
	}
	if st.pick != nil {
		st.log.V(2).Info("The stream broke off", "requestID", st.pick.RequestID(),
			"clientRequestID", st.pick.LoggedClientRequestID(), "model", st.pick.Model(), "err", err)
	}
	return err
}

// finish records the stream's end in the ledger and the metrics: the
// status of the response when it ended, of kvgate's own answer, or 499
// for a stream that ended before either.
func (st *stream) finish() {
	m := st.s.metrics
	// The slot is free once the gauge shows it.
	st.s.streams.Give(1)
	m.inFlight.Dec()
	st.s.picker.ReleaseBody(st.held)
	code := st.answered
	if code == 0 && st.respEnded && !st.cancelled {
		code = st.status
	}
	if code == 0 {
		code = statusClosedEarly
	}
	model, alg := st.refusedModel, st.algorithm
	if st.pick != nil {
		model, alg = st.pick.Model(), st.pick.Algorithm()
		st.pick.End()
	}
	if st.headers {
		m.requests.WithLabelValues(model, m.status(code), alg, gateway.Endpoint(st.hdr.path)).Inc()
	}
}

// refuse answers the request with the gateway's error, ending the stream.
func (st *stream) refuse(e *gateway.Error) error {
	st.answered, st.refusedModel = e.Status, e.Model
	if e.Algorithm != "" {
		st.algorithm = e.Algorithm
	}
	if l := st.log.V(2); l.Enabled() {
		l.Info("Refused a request", "model", e.Model, "status", e.Status, "code", e.Code, "reason", e.Message)
	}
	resp := immediate(e.Status, e.BodyFor(st.hdr.path), "kvgate_"+e.Code)
	if v, ok := e.RetryAfterHeader(); ok {
		h := resp.GetImmediateResponse().GetHeaders()
		h.SetHeaders = append(h.SetHeaders, set("retry-after", v))
	}
	return st.sendLast(resp)
}

// misconfigured answers a request that the processing mode keeps kvgate
// from routing: 500 naming the setting, or, with FailOpen, no endpoint.
func (st *stream) misconfigured(why string) error {
	st.s.metrics.errors.WithLabelValues(errMisconfigure).Inc()
	st.log.Error(nil, "Envoy's ext_proc configuration keeps kvgate from picking endpoints", "reason", why)
	return st.refuse(&gateway.Error{Status: http.StatusInternalServerError, Type: "server_error", Code: "extproc_misconfigured",
		Message: "the proxy's external processing configuration keeps the gateway from picking a pod: " + why})
}

// panicked ends a stream whose handling panicked with v, stack being where:
// it cancels the stream's request, counts and logs the panic, and returns
// the status that ends the stream.
func (st *stream) panicked(v any, stack []byte) error {
	st.s.metrics.errors.WithLabelValues(errPanic).Inc()
	st.closed = true
	requestID, clientRequestID := "", ""
	if st.pick != nil {
		requestID, clientRequestID = st.pick.RequestID(), st.pick.LoggedClientRequestID()
		if !st.respEnded && !st.cancelled {
			st.cancelled = true
			st.pick.Cancel("the gateway failed while serving the request's external processing stream")
		}
	}
	st.log.Error(fmt.Errorf("panic: %v", v), "Serving an external processing stream panicked: the stream ends with INTERNAL",
		"requestID", requestID, "clientRequestID", clientRequestID, "stack", string(stack))
	return status.Error(codes.Internal, "kvgate failed while serving this stream; the gateway's log has the details")
}

// protocolError ends a stream whose messages break the protocol.
func (st *stream) protocolError(what string) error {
	st.s.metrics.errors.WithLabelValues(errProtocol).Inc()
	st.log.Error(nil, "Envoy sent a message out of order", "what", what, "requestMode", st.reqMode.String(),
		"responseMode", st.respMode.String())
	return status.Error(codes.InvalidArgument, "kvgate: "+what)
}

// send sends an answer; a failure ends the stream.
func (st *stream) send(resp *extprocv3.ProcessingResponse) error {
	if err := st.srv.Send(resp); err != nil {
		st.s.metrics.errors.WithLabelValues(errSend).Inc()
		if st.pick != nil && !st.respEnded && !st.cancelled {
			st.pick.Cancel("the proxy went away")
			st.cancelled = true
		}
		return err
	}
	return nil
}

// sendLast sends the stream's last answer.
func (st *stream) sendLast(resp *extprocv3.ProcessingResponse) error {
	st.closed = true
	return st.send(resp)
}
