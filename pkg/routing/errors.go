package routing

import (
	"errors"
	"fmt"
)

var (
	// ErrUnknownAlgorithm reports a routing algorithm name the Router does
	// not know; the gateway answers it with 400 Bad Request.
	ErrUnknownAlgorithm = errors.New("unknown routing algorithm")
	// ErrNoPods reports a request with no candidate pod to route to; the
	// gateway answers it with 503 Service Unavailable.
	ErrNoPods = errors.New("no pod to route to")
)

// UnknownAlgorithmError reports a routing algorithm name the Router does not
// know. It wraps ErrUnknownAlgorithm.
type UnknownAlgorithmError struct {
	Name string
}

func (e *UnknownAlgorithmError) Error() string {
	return fmt.Sprintf("unknown routing algorithm %q (known: %s)", e.Name, knownAlgorithms)
}

// Unwrap returns ErrUnknownAlgorithm.
func (e *UnknownAlgorithmError) Unwrap() error { return ErrUnknownAlgorithm }
