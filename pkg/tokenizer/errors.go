package tokenizer

import (
	"context"
	"errors"
	"fmt"
	"net"
)

// Reason classifies why a tokenization failed. Its values are stable and
// short, so that a caller can use them as metric label values.
type Reason string

const (
	// ReasonInput means the request cannot be tokenized as vLLM would
	// tokenize it: for example it carries several prompts, messages that are
	// not valid JSON, truncation fields vLLM rejects, or the base URL is
	// malformed.
	ReasonInput Reason = "input"
	// ReasonTimeout means the call did not complete within Config.Timeout.
	ReasonTimeout Reason = "timeout"
	// ReasonCanceled means the caller's context ended before the result
	// arrived, or the Tokenizer was closed.
	ReasonCanceled Reason = "canceled"
	// ReasonConnection means no HTTP exchange completed: the connection was
	// refused, reset, or could not be established.
	ReasonConnection Reason = "connection"
	// ReasonStatus means the server answered with a status other than 200.
	ReasonStatus Reason = "status"
	// ReasonBadBody means the server answered 200 with a body that is not a
	// valid vLLM TokenizeResponse (one naming "tokens" twice included), or
	// one larger than Config.MaxResponseBytes.
	ReasonBadBody Reason = "bad_body"
	// ReasonTooLarge means the request's model is tokenized in process and
	// its text exceeds Config.LocalMaxBytes: it is tokenized neither in
	// process nor by the engine, and is best routed on load alone.
	ReasonTooLarge Reason = "too_large"
	// ReasonUnsupported means the request is one vLLM accepts but renders
	// into a prompt that cannot be reproduced exactly: for example an
	// Anthropic Messages request holding images, or a tool_use block
	// without an id, which vLLM names after the current time. It is best
	// routed on load alone.
	ReasonUnsupported Reason = "unsupported"
)

// callReasons lists the reasons an HTTP call can end with, besides success.
var callReasons = []Reason{ReasonTimeout, ReasonCanceled, ReasonConnection, ReasonStatus, ReasonBadBody}

// ErrMultiplePrompts is wrapped in the *Error returned for a completion
// request that carries several prompts: vLLM runs each prompt as a request
// of its own, so no single token sequence describes what the pod will cache,
// and such a request is best routed on load alone.
var ErrMultiplePrompts = errors.New("completion request carries several prompts")

// Error reports a failed tokenization. Every error returned by a Tokenizer
// is an *Error; use errors.As to read its Reason.
type Error struct {
	// Reason classifies the failure.
	Reason Reason
	// Model is the model named in the request.
	Model string
	// Endpoint is the URL of the call that failed; empty when the failure
	// is not a call's (ReasonInput, or a caller that stopped waiting).
	Endpoint string
	// StatusCode is the HTTP status for ReasonStatus, otherwise 0.
	StatusCode int
	// Err is the underlying error.
	Err error
}

// Error implements error.
func (e *Error) Error() string {
	if e.Endpoint == "" {
		return fmt.Sprintf("tokenize for model %q: %s: %v", e.Model, e.Reason, e.Err)
	}
	return fmt.Sprintf("tokenize for model %q at %s: %s: %v", e.Model, e.Endpoint, e.Reason, e.Err)
}

// Unwrap returns the underlying error.
func (e *Error) Unwrap() error { return e.Err }

func inputError(model string, err error) *Error {
	return &Error{Reason: ReasonInput, Model: model, Err: err}
}

func unsupportedError(model string, err error) *Error {
	return &Error{Reason: ReasonUnsupported, Model: model, Err: err}
}

// transportReason classifies an error from sending a request or reading its
// response. callCtx is the context the call ran under: it ends on timeout or
// when the Tokenizer is closed.
func transportReason(callCtx context.Context, err error) Reason {
	switch {
	case errors.Is(callCtx.Err(), context.DeadlineExceeded):
		return ReasonTimeout
	case callCtx.Err() != nil:
		return ReasonCanceled
	}
	var netErr net.Error
	if errors.As(err, &netErr) && netErr.Timeout() {
		return ReasonTimeout
	}
	return ReasonConnection
}
