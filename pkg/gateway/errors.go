package gateway

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Error types of the JSON errors the gateway answers with, OpenAI's where
// OpenAI has one.
const (
	typeInvalidRequest     = "invalid_request_error"
	typeNotFound           = "not_found_error"
	typeServiceUnavailable = "service_unavailable_error"
	typeUpstream           = "upstream_error"
	typeRateLimit          = "rate_limit_error"
)

// Error codes of the gateway's own errors. Errors an engine answers with
// are passed through as the engine sent them.
const (
	codeInvalidJSON       = "invalid_json"
	codeUnreadableBody    = "unreadable_body"
	codeMissingField      = "missing_field"
	codeInvalidField      = "invalid_field"
	codeUnknownStrategy   = "unknown_routing_strategy"
	codeModelNotFound     = "model_not_found"
	codeNoReadyPod        = "no_ready_pod"
	codeRequestTooLarge   = "request_too_large"
	codeMethodNotAllowed  = "method_not_allowed"
	codeNotFound          = "not_found"
	codeNotReady          = "gateway_not_ready"
	codePodsUnreachable   = "pods_unreachable"
	codeUpstreamFailed    = "upstream_failed"
	codeUpstreamTimeout   = "upstream_timeout"
	codeRequestTimeout    = "request_timeout"
	codeTooManyRequests   = "too_many_requests"
	codeTokenizerDisabled = "tokenizer_disabled"
	codeOverloaded        = "gateway_overloaded"
	codeClientClosed      = "client_closed"
)

// apiError is an OpenAI-style error body: {"error": {...}}.
type apiError struct {
	Error apiErrorBody `json:"error"`
}

type apiErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
}

// Error is a request the gateway refuses: the HTTP status and the
// OpenAI-style error it answers with (in Anthropic's shape to Anthropic's
// Messages endpoints: see BodyFor). Model and Algorithm are what was known
// of the request when it was refused ("" before each was resolved), for the
// labels of a front end's metrics.
type Error struct {
	Status int
	// Type and Code are the error's type and code (see the package
	// documentation); Param names the request field at fault, "" for none.
	Type, Code, Param string
	Message           string
	Model, Algorithm  string
	// RetryAfter is when the request may be sent again, for a 429 and for
	// a 503 that says: the Retry-After header's value, in whole seconds.
	RetryAfter time.Duration
}

// RetryAfterHeader returns the value of the Retry-After header the error
// is answered with, and whether it has one: a 429 always has.
func (e *Error) RetryAfterHeader() (string, bool) {
	return strconv.Itoa(int(e.RetryAfter.Seconds())), e.Status == http.StatusTooManyRequests || e.RetryAfter > 0
}

// Error returns the message.
func (e *Error) Error() string { return e.Message }

// Body returns the error as the gateway answers it: the JSON object
// {"error": {"message", "type", "param", "code"}} and a newline.
func (e *Error) Body() []byte { return errorBody(e.Type, e.Code, e.Param, e.Message) }

// BodyFor returns the error as the gateway answers it to a request to path
// (with or without its query): in Anthropic's shape,
// {"type": "error", "error": {"type", "message"}} and a newline, for
// Anthropic's Messages endpoints (see IsAnthropicPath), as vLLM answers
// its own errors there; else as Body.
func (e *Error) BodyFor(path string) []byte {
	if IsAnthropicPath(path) {
		return anthropicErrorBody(e.Type, e.Message)
	}
	return e.Body()
}

// IsAnthropicPath reports whether path (with or without its query) is one
// of Anthropic's Messages endpoints, /v1/messages and
// /v1/messages/count_tokens, whose errors are in Anthropic's shape.
func IsAnthropicPath(path string) bool {
	path, _, _ = strings.Cut(path, "?")
	return path == PathMessages || path == pathCountTokens
}

// anthropicError is an Anthropic-style error body:
// {"type": "error", "error": {"type", "message"}}.
type anthropicError struct {
	Type  string              `json:"type"`
	Error anthropicErrorInner `json:"error"`
}

type anthropicErrorInner struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// anthropicErrorBody encodes an Anthropic-style error of type typ (the
// type the OpenAI-style error would have, as vLLM keeps it).
func anthropicErrorBody(typ, message string) []byte {
	data, err := json.Marshal(anthropicError{Type: "error", Error: anthropicErrorInner{Type: typ, Message: message}})
	if err != nil {
		// A struct of strings always encodes.
		panic(err)
	}
	return append(data, '\n')
}

// errorBody encodes an OpenAI-style error, param "" encoding as null.
func errorBody(typ, code, param, message string) []byte {
	body := apiError{Error: apiErrorBody{Message: message, Type: typ, Code: code}}
	if param != "" {
		body.Error.Param = &param
	}
	data, err := json.Marshal(body)
	if err != nil {
		// A struct of strings always encodes.
		panic(err)
	}
	return append(data, '\n')
}

// writeError answers with status and an OpenAI-style JSON error. param
// names the request field at fault, "" for none.
func writeError(w http.ResponseWriter, status int, typ, code, param, message string) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Del("Content-Length")
	w.WriteHeader(status)
	_, _ = w.Write(errorBody(typ, code, param, message))
}

// writeErrorShaped answers as writeError, in Anthropic's shape instead
// when anthropic is set: type and message alone, code and param left out.
func writeErrorShaped(w http.ResponseWriter, anthropic bool, status int, typ, code, param, message string) {
	if !anthropic {
		writeError(w, status, typ, code, param, message)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Del("Content-Length")
	w.WriteHeader(status)
	_, _ = w.Write(anthropicErrorBody(typ, message))
}
