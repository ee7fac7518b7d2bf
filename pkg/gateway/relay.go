package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/inflight"
	"github.com/kvgate/kvgate/pkg/internal/jsonscan"
	"github.com/kvgate/kvgate/pkg/leanhttp"
	"github.com/kvgate/kvgate/pkg/routing"
	"github.com/kvgate/kvgate/pkg/types"
)

// usage is the token usage an engine reports in a response: OpenAI's
// prompt and completion tokens and, when the engine reports
// prompt_tokens_details (vLLM with --enable-prompt-tokens-details), the
// prompt tokens it found cached.
type usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	CachedTokens     int64 `json:"-"`
	CachedReported   bool  `json:"-"`
}

// responseUsage reads the usage of a whole (not streamed) response body
// to a request of kind k: the top-level "usage" object, found without
// decoding the rest, in the shape of the request's API: OpenAI's chat and
// completions (see readUsage), Anthropic's Messages (see
// readMessagesUsage) or OpenAI's Responses (see readResponsesUsage).
func responseUsage(body []byte, k kind) (usage, bool) {
	u, ok, _ := responseUsageAndID(body, k)
	return u, ok
}

// responseUsageAndID is responseUsage that also returns, of a Responses
// response, its id ("" when it has none that is a string; see
// storedResponses), in the same pass over the body.
func responseUsageAndID(body []byte, k kind) (u usage, ok bool, id string) {
	found := false
	err := jsonscan.Members(body, func(name, value []byte) error {
		switch string(jsonscan.Name(name)) {
		case "usage":
			u, found = readUsageOf(k, value)
		case "id":
			if k == kindResponses && value[0] == '"' {
				id, _ = jsonscan.String(value)
			}
		}
		return nil
	})
	return u, found && err == nil, id
}

// readUsageOf reads a usage object in the shape of the API of requests of
// kind k.
func readUsageOf(k kind, value []byte) (usage, bool) {
	switch k {
	case kindMessages:
		return readMessagesUsage(value)
	case kindResponses:
		return readResponsesUsage(value)
	}
	return readUsage(value)
}

// readResponsesUsage reads the usage object of an OpenAI Responses
// response as vLLM writes it: input_tokens, the prompt's tokens,
// output_tokens, the generated ones (reasoning included), and
// input_tokens_details.cached_tokens, the prompt tokens the engine found
// cached. It fails as readUsage does, and when the object has neither
// input_tokens nor output_tokens.
func readResponsesUsage(value []byte) (usage, bool) { return readTokensUsage(value, true) }

// readMessagesUsage reads the usage object of an Anthropic Messages
// response as vLLM writes it: input_tokens, the prompt's tokens, and
// output_tokens, the generated ones. It fails as readUsage does, and when
// the object has neither count.
func readMessagesUsage(value []byte) (usage, bool) { return readTokensUsage(value, false) }

// readTokensUsage reads a usage object counting input_tokens and
// output_tokens, the shape of both Anthropic's Messages and OpenAI's
// Responses, and, when details is set, input_tokens_details.cached_tokens.
// It fails as readUsage does, and when the object has neither count.
func readTokensUsage(value []byte, details bool) (usage, bool) {
	var u usage
	if len(value) == 0 || value[0] != '{' {
		return u, false
	}
	var in, out bool
	err := jsonscan.Members(value, func(name, v []byte) error {
		switch string(jsonscan.Name(name)) {
		case "input_tokens":
			return readCount(v, &u.PromptTokens, &in)
		case "output_tokens":
			return readCount(v, &u.CompletionTokens, &out)
		case "input_tokens_details":
			if !details {
				return nil
			}
			return readCachedTokens(v, &u)
		}
		return nil
	})
	return u, err == nil && (in || out)
}

// readUsage reads a usage object's token counts; false when value is not
// an object (null, for one) or a count is not a non-negative integer, so
// that a usage no engine could mean feeds neither the request traces nor
// the output predictors.
func readUsage(value []byte) (usage, bool) {
	var u usage
	if len(value) == 0 || value[0] != '{' {
		return u, false
	}
	err := jsonscan.Members(value, func(name, v []byte) error {
		switch string(jsonscan.Name(name)) {
		case "prompt_tokens":
			return readCount(v, &u.PromptTokens, nil)
		case "completion_tokens":
			return readCount(v, &u.CompletionTokens, nil)
		case "prompt_tokens_details":
			return readCachedTokens(v, &u)
		}
		return nil
	})
	return u, err == nil
}

// readCachedTokens reads the cached_tokens member of details, a usage's
// prompt_tokens_details (OpenAI's chats and completions) or
// input_tokens_details (OpenAI's Responses), into u; details that are not
// an object are ignored.
func readCachedTokens(details []byte, u *usage) error {
	if details[0] != '{' {
		return nil
	}
	return jsonscan.Members(details, func(name, v []byte) error {
		if string(jsonscan.Name(name)) == "cached_tokens" {
			return readCount(v, &u.CachedTokens, &u.CachedReported)
		}
		return nil
	})
}

// errNegativeCount reports a token count below zero.
var errNegativeCount = errors.New("negative token count")

// readCount reads a token count into dst, and sets *set (when not nil)
// when there is one; null leaves both alone. It fails for a count that is
// not an integer or is negative.
func readCount(v []byte, dst *int64, set *bool) error {
	if v[0] == 'n' {
		return nil
	}
	n, err := jsonscan.Int(v)
	if err != nil {
		return err
	}
	if n < 0 {
		return errNegativeCount
	}
	*dst = int64(n)
	if set != nil {
		*set = true
	}
	return nil
}

// errClientGone reports that writing to the client failed: it went away.
var errClientGone = errors.New("client went away")

// maxPreGrow bounds the room made for a body from its declared length
// before any of it has arrived: beyond it the buffer grows as bytes come,
// so that a peer declaring a large body and sending none holds no more
// than this.
const maxPreGrow = 64 << 10

// growForDeclared makes room in buf for a body of the declared length (-1
// when unknown), up to maxPreGrow.
func growForDeclared(buf *bytes.Buffer, declared int64) {
	if declared > 0 {
		buf.Grow(int(min(declared, maxPreGrow)))
	}
}

// readWhole reads body into keep, which is empty, until its end or until
// keep holds more than max bytes; complete reports the former. size is the
// body's length when known, -1 otherwise. lr is scratch space.
func readWhole(body io.Reader, keep *bytes.Buffer, size int64, max int, lr *io.LimitedReader) (complete bool, err error) {
	if size <= int64(max) {
		growForDeclared(keep, size)
	}
	*lr = io.LimitedReader{R: body, N: int64(max) + 1}
	_, err = keep.ReadFrom(lr)
	complete = lr.N > 0
	lr.R = nil
	if err != nil {
		return false, err
	}
	return complete, nil
}

// sseRelay copies an engine's server-sent events to the client one event
// at a time, byte for byte, flushing whenever it has relayed everything the
// engine sent so far. On the way it reads what the gateway needs from the
// events: the first generated token, and the usage chunk (a chunk with no
// choices and a usage object), which it withholds from the client when
// dropUsage is set because the gateway asked for it on the client's behalf.
//
// Only events with a single data line holding a JSON object are read;
// every other event (comments, [DONE], errors) is relayed untouched. An
// event is held whole to be read, up to maxEvent bytes: once it holds
// more, what it holds is relayed and the rest of the event is relayed as
// it comes, unread, to the blank line that ends it (a first token or usage
// it carries is missed, and a usage chunk is relayed, not withheld); the
// events after it are read again.
type sseRelay struct {
	dst   io.Writer
	flush func() error
	src   *bufio.Reader
	// more returns how many bytes the engine sent that src has yet to
	// read (none when nil): the relay flushes only when there are none.
	more func() int
	// ended reports that the engine's body has ended (never when nil): the
	// last events then go out with the end of the response, in one write,
	// rather than flushed on their own.
	ended func() bool
	// maxEvent bounds the bytes of an event held to read it; 0 means no
	// bound.
	maxEvent int
	// oversized, when not nil, counts the events that outgrow maxEvent,
	// which are logged at verbosity 2 with the request's model and pod
	// (rc, when not nil, and pod).
	oversized prometheus.Counter
	log       klog.Logger
	rc        *types.RoutingContext
	pod       string
	// bound, when not nil, holds the response's bound: once it passed,
	// the relay ends with errResponseTimeout instead of flushing.
	bound *clock
	eventReader

	event []byte
}

// eventReader reads what the gateway needs from an engine's server-sent
// events, one complete event at a time: the first generated token, and the
// usage chunk (a chunk with no choices and a usage object).
type eventReader struct {
	// dropUsage withholds the usage chunk; firstToken is called once, at
	// the first event carrying generated output.
	dropUsage  bool
	firstToken func()
	// uninspected relays every event as it is, reading none: the stream
	// of an endpoint other than the completions (kindModel).
	uninspected bool
	// kind is the request's: the events of a Messages stream are read in
	// Anthropic's shapes (see inspectMessages), those of a Responses
	// stream in the Responses API's (see inspectResponses), any other's as
	// OpenAI's chunks.
	kind kind

	// stored, when not nil, is called once with the id of the response
	// a Responses stream opens with (see storedResponses).
	stored func(id string)

	seenToken bool
	usage     usage
	hasUsage  bool
}

// run relays until the engine ends the stream. It returns errClientGone
// when the client cannot be written to, errResponseTimeout when the
// response's bound passed before an event was flushed, and the engine's
// read error when the stream broke off; what was read of a final
// incomplete event is relayed first when the body ended.
func (s *sseRelay) run() error {
	s.event = s.event[:0]
	// midLine reports that the last read ended within a line (the
	// reader's buffer filled): a line ending read next ends that line, not
	// the event. passing reports that the event outgrew maxEvent and is
	// being relayed as it comes.
	midLine, passing := false, false
	for {
		line, err := s.src.ReadSlice('\n')
		ends := err == nil && !midLine && isBlankLine(line)
		midLine = errors.Is(err, bufio.ErrBufferFull)
		if passing {
			if err := s.write(line); err != nil {
				return err
			}
		} else {
			s.event = append(s.event, line...)
			if s.maxEvent > 0 && len(s.event) > s.maxEvent {
				s.passOn()
				if err := s.write(s.event); err != nil {
					return err
				}
				s.event, passing = s.event[:0], true
			}
		}
		switch {
		case midLine:
			// The line goes on.
		case err == io.EOF:
			// The body ended: what it ended with goes on as it came.
			return s.write(s.event)
		case err != nil:
			// The body broke off: an incomplete event is dropped, so that
			// the client's next event is the error the caller writes (one
			// passed on unread was relayed as far as it came).
			return err
		case ends && !passing:
			if err := s.endEvent(); err != nil {
				return err
			}
			continue
		case ends:
			passing = false
		}
		if passing || ends {
			if err := s.flushIfIdle(); err != nil {
				return err
			}
		}
	}
}

// passOn counts and logs an event that outgrew maxEvent.
func (s *sseRelay) passOn() {
	if s.oversized == nil {
		return
	}
	s.oversized.Inc()
	if l := s.log.V(2); l.Enabled() && s.rc != nil {
		l.Info("A server-sent event of the pod's stream exceeds the bound: relaying it unread", "requestID", s.rc.RequestID,
			"clientRequestID", s.rc.LoggedClientRequestID(), "model", s.rc.Model, "pod", s.pod, "maxEventBytes", s.maxEvent)
	}
}

// endEvent relays the complete event in s.event, unless it is a withheld
// usage chunk, and flushes when the engine has sent nothing more yet and
// has not ended its body.
func (s *sseRelay) endEvent() error {
	if !s.inspect(s.event) {
		if err := s.write(s.event); err != nil {
			return err
		}
	}
	s.event = s.event[:0]
	return s.flushIfIdle()
}

// flushIfIdle flushes what was relayed when the engine has sent nothing
// more yet and has not ended its body.
func (s *sseRelay) flushIfIdle() error {
	if s.src.Buffered() == 0 && (s.more == nil || s.more() == 0) && (s.ended == nil || !s.ended()) {
		if s.bound != nil && s.bound.overBound() {
			return errResponseTimeout
		}
		if err := s.flush(); err != nil {
			return errClientGone
		}
	}
	return nil
}

// writeError tells the client, in an event of its own, that the stream
// broke off: an OpenAI error object as vLLM sends one in a stream, in an
// event named error when named is set (a Responses stream, whose events
// all have a name: OpenAI's SDKs raise the error of an error event's
// data), or, when anthropic is set, an error event in Anthropic's shape
// (event: error, its data {"type": "error", "error": {"type", "message"}}).
// What was read of an incomplete event is dropped.
func (s *sseRelay) writeError(anthropic, named bool, typ, code, message string) {
	if anthropic {
		s.event = append(append(append(s.event[:0], "\n\nevent: error\ndata: "...), anthropicErrorBody(typ, message)...), '\n')
	} else {
		data, err := json.Marshal(apiError{Error: apiErrorBody{Message: message, Type: typ, Code: code}})
		if err != nil {
			return
		}
		s.event = append(s.event[:0], "\n\n"...)
		if named {
			s.event = append(s.event, "event: error\n"...)
		}
		s.event = append(append(append(s.event, "data: "...), data...), "\n\n"...)
	}
	if s.write(s.event) == nil {
		_ = s.flush()
	}
}

func (s *sseRelay) write(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if _, err := s.dst.Write(b); err != nil {
		return errClientGone
	}
	return nil
}

// usageKey is what a chunk must contain to be read once the first token
// was seen.
var usageKey = []byte(`"usage"`)

// inspect reads an event and reports whether it is to be withheld. It
// reads a chunk's choices and usage by hand, without decoding the rest.
func (s *eventReader) inspect(event []byte) (withhold bool) {
	if s.uninspected {
		return false
	}
	payload, ok := dataPayload(event)
	if !ok || len(payload) == 0 || payload[0] != '{' {
		return false
	}
	switch s.kind {
	case kindMessages:
		s.inspectMessages(payload)
		return false
	case kindResponses:
		s.inspectResponses(payload)
		return false
	}
	if s.seenToken && !bytes.Contains(payload, usageKey) {
		return false
	}
	var choices, use []byte
	if jsonscan.Members(payload, func(name, value []byte) error {
		switch string(jsonscan.Name(name)) {
		case "choices":
			choices = value
		case "usage":
			use = value
		}
		return nil
	}) != nil {
		return false
	}
	if hasOutput(choices) {
		s.tokenSeen()
	}
	if len(choices) > 0 && choices[0] == '[' && emptyArray(choices) {
		if u, ok := readUsage(use); ok {
			s.usage, s.hasUsage = u, true
			return s.dropUsage
		}
	}
	return false
}

// messageDelta is the type of the Messages event that carries the
// response's usage, at its end.
const messageDelta = "message_delta"

// inspectMessages reads the data of an event of a Messages stream, as vLLM
// writes them: it converts its chat stream into events (message_start,
// content_block_start, content_block_delta, content_block_stop,
// message_delta, message_stop) whose data is an object naming its type,
// the first of them once the chat's first chunk, which comes with the
// first generated token, exists. So the first event of any type but error
// (and ping, which Anthropic's own API sends) marks the first token, and
// message_delta's usage is the response's. No event is withheld: vLLM
// sends the usage whatever the client asked.
func (s *eventReader) inspectMessages(payload []byte) {
	t, use, ok := s.typedEvent(payload, "usage")
	if !ok {
		return
	}
	if t != "error" && t != "ping" {
		s.tokenSeen()
	}
	if t == messageDelta {
		if u, ok := readMessagesUsage(use); ok {
			s.usage, s.hasUsage = u, true
		}
	}
}

// inspectResponses reads the data of an event of a Responses stream, as
// vLLM writes them (event: <type>, its data an object naming that type).
// vLLM sends response.created and response.in_progress as the request is
// scheduled, before anything is generated; every later event (an output
// item added, a content part added, a text, reasoning or function call
// delta, ...) comes with or after the first generated token, which the
// first of them marks (an error event marks none). The usage is that of
// the whole response the final event carries: response.completed as vLLM
// ends every stream, response.incomplete or response.failed as OpenAI's
// API also ends some, its response member's usage (see
// readResponsesUsage). No event is withheld: vLLM sends the usage whatever
// the client asked.
func (s *eventReader) inspectResponses(payload []byte) {
	t, resp, ok := s.typedEvent(payload, "response")
	if !ok {
		return
	}
	switch t {
	case "response.created", "response.in_progress", "response.queued":
		if s.stored != nil {
			if id := responseID(resp); id != "" {
				s.stored(id)
				s.stored = nil
			}
		}
		return
	case "error":
		return
	}
	s.tokenSeen()
	switch t {
	case "response.completed", "response.incomplete", "response.failed":
	default:
		return
	}
	if len(resp) == 0 || resp[0] != '{' {
		return
	}
	_ = jsonscan.Members(resp, func(name, value []byte) error {
		if string(jsonscan.Name(name)) == "usage" {
			if u, ok := readResponsesUsage(value); ok {
				s.usage, s.hasUsage = u, true
			}
		}
		return nil
	})
}

// typedEvent reads payload, the data object of an event of a Messages or
// Responses stream, whose type member names the event's type: it returns
// that type and the value of the member named member (nil when absent).
// ok is false when the event is not to be read further: the payload is
// not an object of those members, its type is not a string, or the first
// token was seen and the payload does not mention a usage.
func (s *eventReader) typedEvent(payload []byte, member string) (typ string, value []byte, ok bool) {
	if s.seenToken && !bytes.Contains(payload, usageKey) {
		return "", nil, false
	}
	rawType, value, err := jsonscan.TypeAnd(payload, member)
	if err != nil || len(rawType) == 0 || rawType[0] != '"' {
		return "", nil, false
	}
	if typ, err = jsonscan.String(rawType); err != nil {
		return "", nil, false
	}
	return typ, value, true
}

// tokenSeen marks the first generated token, calling firstToken the first
// time only.
func (s *eventReader) tokenSeen() {
	if !s.seenToken {
		s.seenToken = true
		s.firstToken()
	}
}

// emptyArray reports whether raw, a JSON array, has no element.
func emptyArray(raw []byte) bool {
	return raw[jsonscan.SkipSpace(raw, 1)] == ']'
}

// hasOutput reports whether a chunk's choices carry generated output:
// text, a chat delta other than the opening role, or a finish reason. vLLM
// opens a chat stream with a delta holding only the role.
func hasOutput(choices []byte) bool {
	if len(choices) == 0 || choices[0] != '[' {
		return false
	}
	found := false
	_ = jsonscan.ArrayElements(choices, func(choice []byte) {
		if found || choice[0] != '{' {
			return
		}
		_ = jsonscan.Members(choice, func(name, value []byte) error {
			switch string(jsonscan.Name(name)) {
			case "text":
				found = found || nonEmptyString(value)
			case "finish_reason":
				found = found || value[0] != 'n'
			case "delta":
				found = found || deltaHasOutput(value)
			}
			return nil
		})
	})
	return found
}

// deltaHasOutput reports whether a chat delta carries output: content,
// reasoning or tool calls.
func deltaHasOutput(delta []byte) bool {
	if delta[0] != '{' {
		return false
	}
	found := false
	_ = jsonscan.Members(delta, func(name, value []byte) error {
		switch string(jsonscan.Name(name)) {
		case "content", "reasoning_content", "reasoning":
			found = found || nonEmptyString(value)
		case "tool_calls":
			found = found || value[0] != 'n'
		}
		return nil
	})
	return found
}

// nonEmptyString reports whether value is a JSON string with characters.
func nonEmptyString(value []byte) bool {
	return value[0] == '"' && len(value) > 2
}

// dataPayload returns the value of the event's only data line, without the
// optional space after the colon and the line ending; false when the event
// has no data line or several.
func dataPayload(event []byte) ([]byte, bool) {
	var payload []byte
	found := false
	for len(event) > 0 {
		line := event
		if i := bytes.IndexByte(event, '\n'); i >= 0 {
			line, event = event[:i], event[i+1:]
		} else {
			event = nil
		}
		line = bytes.TrimSuffix(line, []byte{'\r'})
		v, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue
		}
		if found {
			return nil, false
		}
		payload, found = bytes.TrimPrefix(v, []byte{' '}), true
	}
	return payload, found
}

// isBlankLine reports whether line, with its ending, is empty: the end of
// an event.
func isBlankLine(line []byte) bool {
	return len(line) == 1 || (len(line) == 2 && line[0] == '\r')
}

// respond reads the pod's response to the request sent on pc and relays it
// to the client: its status and headers with the gateway's, then its body,
// as server-sent events relayed as they come when the request streams, or
// whole otherwise. It closes the attempt h once the response ended: done
// when it was relayed to its end (with the usage the engine reported,
// when it was a success that reported one), cancelled when the client went
// away, failed when the pod failed to answer or its response broke off or
// was not written to its end within the response timeout, whose end the
// reads of the pod's connection and the writes to the client's both meet.
// It reports whether the response broke off after its headers were
// written, so that the client's connection must be cut.
func (g *Gateway) respond(w http.ResponseWriter, r *http.Request, pc *podConn, rc *types.RoutingContext, x *exchange, c *call,
	h *inflight.Handle, dropUsage bool, pod *endpoint.Endpoint) (abort bool) {
	res := &x.res
	c.boundResponse(pc.dr.end)
	// A client that goes away closes the connection to the pod, which
	// ends any wait for it.
	gc, lean := w.(leanhttp.GoneCloser)
	var stop func() bool
	if lean {
		gc.CloseWhenGone(pc)
	} else {
		stop = context.AfterFunc(r.Context(), pc.close)
	}
	defer func() {
		if lean && !gc.StopClosing() || !lean && !stop() {
			res.keepAlive = false
		}
		if res.body.conn == nil {
			pc.close()
			return
		}
		res.finish()
	}()
	err := pc.readResponse(res, g.cfg.UpstreamIdleTimeout)
	c.lap(phaseUpstream)
	if err != nil {
		return g.failResponse(w, r, err, stageHead, rc, x, c, h)
	}
	g.store.PodReachable(pod)
	// The response of an endpoint other than the completions streams when
	// the engine answers with an event stream, whatever asked for it.
	if isEventStream(x.in.stream().Stream || !x.in.kind.generates(), res.status, res.contentType) {
		return g.relayStream(w, r, res, rc, x, c, h, dropUsage, pod.Address)
	}
	return g.relayWhole(w, r, res, rc, x, c, h, pod.Address)
}

// gatewayHeaderKeys are the canonical names of the response headers the
// gateway sets (setHeader) under keys of its own spelling: a pod's fields
// of those names, in any case, are not copied, so that the client gets
// the gateway's values alone.
var gatewayHeaderKeys = []string{http.CanonicalHeaderKey(HeaderTargetPod), http.CanonicalHeaderKey(HeaderTargetPodName),
	routingStrategyKey}

// setHeader sets the response's headers: the pod's end-to-end headers,
// then the gateway's. Their values are held by vs, which the exchange
// keeps: the response's head must be written (WriteHeader, which fixes
// it) before the exchange returns to the pool.
func setHeader(hd http.Header, res *podResponse, d *routing.Decision, addr string, vs *headerValues) {
	copyResponseHeader(hd, res, vs)
	hd[HeaderTargetPod] = vs.one(addr)
	hd[HeaderTargetPodName] = vs.one(d.PodKey)
	hd[routing.HeaderRoutingStrategy] = vs.one(d.Algorithm)
}

// addServerTiming adds the gateway's Server-Timing value, for the phases
// timed so far, after the pod's.
func addServerTiming(hd http.Header, c *call, x *exchange) {
	x.timing = c.appendServerTiming(x.timing[:0])
	if pods := hd[HeaderServerTiming]; len(pods) > 0 {
		hd[HeaderServerTiming] = append(slices.Clip(pods), string(x.timing))
		return
	}
	hd[HeaderServerTiming] = x.vals.one(string(x.timing))
}

// relayWhole relays a response that does not stream: it reads the body
// (up to maxUsageScanBytes) before it writes anything, so that a body that
// breaks off is answered with an error, and the Server-Timing header
// covers the relay; the rest of a longer body is then copied as it comes.
func (g *Gateway) relayWhole(w http.ResponseWriter, r *http.Request, res *podResponse, rc *types.RoutingContext, x *exchange,
	c *call, h *inflight.Handle, addr string) (abort bool) {
	size := int64(-1)
	if res.body.mode == bodyLength {
		size = res.body.remaining
	}
	complete, err := readWhole(&res.body, &x.resp, size, maxUsageScanBytes, &x.limit)
	if err == nil && c.overBound() {
		err = errResponseTimeout
	}
	if err != nil {
		return g.failResponse(w, r, err, stageBody, rc, x, c, h)
	}
	// The response's id is recorded before the client can read it; the
	// same pass reads its usage.
	var u usage
	ok, read := false, false
	if complete && res.status == http.StatusOK {
		if record := g.recorder(&x.in, x.d.Endpoint, rc.Model); record != nil {
			var id string
			u, ok, id = responseUsageAndID(x.resp.Bytes(), x.in.kind)
			read = true
			record(id)
		}
	}
	hd := w.Header()
	setHeader(hd, res, &x.d, addr, &x.vals)
	g.closeWhenDraining(hd)
	switch {
	case complete:
		hd["Content-Length"] = x.vals.one(strconv.Itoa(x.resp.Len()))
	case size >= 0:
		hd["Content-Length"] = x.vals.one(strconv.FormatInt(size, 10))
	}
	c.lap(phaseRelay)
	addServerTiming(hd, c, x)
	c.status = res.status
	w.WriteHeader(res.status)
	if _, err := w.Write(x.resp.Bytes()); err != nil {
		return g.clientGone(c, h)
	}
	if !complete {
		for {
			n, rerr := res.body.Read(x.buf)
			if n > 0 {
				if _, err := w.Write(x.buf[:n]); err != nil {
					return g.clientGone(c, h)
				}
			}
			if rerr == io.EOF {
				break
			}
			if rerr != nil {
				return g.failResponse(w, r, rerr, stageRelay, rc, x, c, h)
			}
		}
	}
	if err := http.NewResponseController(w).Flush(); err != nil {
		return g.clientGone(c, h)
	}
	c.lap(phaseRelay)
	if x.in.kind.generates() && !read {
		u, ok = responseUsage(x.resp.Bytes(), x.in.kind)
	}
	g.closeDone(h, x.in.kind.generates(), res.status, u, complete && ok)
	return false
}

// isEventStream reports whether a response is relayed as server-sent
// events: the request streams and the pod answered 200 with an event
// stream.
func isEventStream(stream bool, status int, contentType string) bool {
	return stream && status == http.StatusOK && strings.HasPrefix(contentType, "text/event-stream")
}

// closeDone closes an attempt whose response was relayed to its end, with
// status: done, with the usage the engine reported (u, when ok) if it
// succeeded; a completion's (generates) success without usage is counted.
// The response of another endpoint reports no usage the gateway reads: its
// attempt is closed as done alone.
func (g *Gateway) closeDone(h *inflight.Handle, generates bool, status int, u usage, ok bool) {
	if status == http.StatusOK && generates {
		if ok {
			h.ReportUsage(inflight.Usage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens,
				CachedTokens: u.CachedTokens, CachedReported: u.CachedReported})
		} else {
			g.metrics.usageMissing.Inc()
		}
	}
	h.Close(inflight.Done, "")
}

// relayStream relays a server-sent event stream, reporting the first token
// to the request ledger and to the TTFT metric. Its Server-Timing header
// covers the phases up to the response's headers; a trailer adds the
// relay's and the whole time.
func (g *Gateway) relayStream(w http.ResponseWriter, r *http.Request, res *podResponse, rc *types.RoutingContext, x *exchange,
	c *call, h *inflight.Handle, dropUsage bool, addr string) (abort bool) {
	hd := w.Header()
	setHeader(hd, res, &x.d, addr, &x.vals)
	g.closeWhenDraining(hd)
	addServerTiming(hd, c, x)
	hd["Trailer"] = []string{HeaderServerTiming}
	c.status = http.StatusOK
	w.WriteHeader(http.StatusOK)
	rcw := http.NewResponseController(w)
	// The headers go out at once, unless the body has begun with them (an
	// engine writes an event at a time: its first event): then they go
	// out with it.
	if res.body.buffered() == 0 {
		if err := rcw.Flush(); err != nil {
			return g.clientGone(c, h)
		}
	}
	x.reader.Reset(&res.body)
	s := &x.relay
	*s = sseRelay{dst: w, flush: rcw.Flush, src: x.reader, more: res.body.buffered, ended: res.body.ended,
		maxEvent: g.cfg.MaxStreamEventBytes, oversized: g.metrics.oversizedEvents, log: g.log, rc: rc, pod: x.d.PodKey,
		bound: &c.clock, event: s.event[:0], eventReader: eventReader{dropUsage: dropUsage,
			uninspected: !x.in.kind.generates(), kind: x.in.kind, stored: g.recorder(&x.in, x.d.Endpoint, rc.Model),
			firstToken: func() {
				h.FirstToken()
				g.metrics.ttft.WithLabelValues(rc.Model).Observe(time.Since(c.start).Seconds())
			}}}
	err := s.run()
	c.lap(phaseRelay)
	if err != nil {
		if errors.Is(err, errClientGone) {
			return g.clientGone(c, h)
		}
		return g.failResponse(w, r, err, stageRelay, rc, x, c, h)
	}
	x.timing = appendTiming(x.timing[:0], phaseNames[phaseRelay], c.spent[phaseRelay])
	x.timing = append(x.timing, ", "...)
	x.timing = appendTiming(x.timing, serverTimingTotal, c.total())
	hd[HeaderServerTiming] = []string{string(x.timing)}
	g.closeDone(h, x.in.kind.generates(), http.StatusOK, s.usage, s.hasUsage)
	return false
}

// clientGone records a request whose client went away: its attempt is
// cancelled, and nothing more is written. A client whose connection was
// closed because the response's end passed while it was written to fails
// the attempt instead, counted by the connection.
func (g *Gateway) clientGone(c *call, h *inflight.Handle) (abort bool) {
	if c.pastResponseEnd() {
		h.Close(inflight.Failed, failResponseTimeout)
		return false
	}
	h.Close(inflight.Cancelled, "client went away")
	c.status = statusClientClosed
	return false
}

// Stages of a response at which it can fail.
const (
	// stageHead: waiting for the status and headers.
	stageHead = iota
	// stageBody: reading the body, nothing written to the client yet.
	stageBody
	// stageRelay: the headers were written to the client.
	stageRelay
)

// failResponse records that the pod's response failed with err at stage,
// and tells the client: a JSON error in the shape of the request's API
// when nothing was written yet;
// after the headers, an error event on a stream and a cut connection
// (abort) either way, so that no client takes the broken response for a
// whole one. A client that went away meanwhile is no failure of the pod.
func (g *Gateway) failResponse(w http.ResponseWriter, r *http.Request, err error, stage int, rc *types.RoutingContext,
	x *exchange, c *call, h *inflight.Handle) (abort bool) {
	if r.Context().Err() != nil {
		return g.clientGone(c, h)
	}
	pod := x.d.PodKey + " (" + x.d.Endpoint.Address + ")"
	timeout := errors.Is(err, os.ErrDeadlineExceeded)
	reason, status, code := failBody, http.StatusBadGateway, codeUpstreamFailed
	msg := fmt.Sprintf("pod %s broke off its response: %v", pod, err)
	switch {
	case errors.Is(err, errResponseTimeout):
		reason, status, code = failResponseTimeout, http.StatusGatewayTimeout, codeUpstreamTimeout
		msg = fmt.Sprintf("pod %s did not end its response within %v", pod, g.cfg.ResponseTimeout)
	case timeout && stage == stageHead:
		reason, status, code = failFirstByteTimeout, http.StatusGatewayTimeout, codeUpstreamTimeout
		msg = fmt.Sprintf("pod %s sent no response within %v", pod, g.cfg.FirstByteTimeout)
	case timeout:
		reason, status, code = failIdleTimeout, http.StatusGatewayTimeout, codeUpstreamTimeout
		msg = fmt.Sprintf("pod %s sent nothing more of its response for %v", pod, g.cfg.UpstreamIdleTimeout)
	case stage == stageHead:
		reason = failSend
		msg = fmt.Sprintf("pod %s failed before answering: %v", pod, err)
	}
	h.Close(inflight.Failed, reason)
	g.metrics.upstreamFails.WithLabelValues(reason).Inc()
	if l := g.log.V(2); l.Enabled() {
		l.Info("The pod's response failed", "requestID", rc.RequestID,
			"clientRequestID", rc.LoggedClientRequestID(), "model", rc.Model, "pod", x.d.PodKey,
			"reason", reason, "headersSent", stage == stageRelay, "err", err)
	}
	// The error has the write timeout to reach the client, past the
	// response's end if need be.
	c.unboundResponse()
	if stage != stageRelay {
		c.fail(w, status, typeUpstream, code, "", msg)
		return false
	}
	if x.relay.dst != nil {
		// A stored response's events are a Responses stream's.
		named := x.in.kind == kindResponses || x.in.kind == kindStored
		x.relay.writeError(c.anthropic, named, typeUpstream, code, msg)
	}
	return true
}
