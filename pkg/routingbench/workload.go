package routingbench

import (
	"errors"
	"fmt"
	"time"
)

// Request is one request of a workload.
type Request struct {
	// ID names the request uniquely within its workload.
	ID string
	// Arrival is when the request reaches the gateway, counted from the
	// start of the workload.
	Arrival time.Duration
	// Prompt holds the prompt's token ids as the engines compute them, each
	// below the engines' vocabulary size. It is shared by every simulation
	// of the workload: treat it as read-only.
	Prompt []uint32
	// RouteTokens, when not nil, holds the token ids the gateway computes
	// for the prompt and routes on, which may differ from the engines' (see
	// TokenizeSharedPrefix); nil means Prompt. Shared like Prompt.
	RouteTokens []uint32
	// OutputTokens is how many tokens the request generates, at least 1.
	OutputTokens int
}

// Workload is a named list of requests in arrival order.
type Workload struct {
	Name     string
	Requests []Request
	// Load is the share of a fleet's capacity AtLoad scaled the workload
	// to, 0 for a workload at its own rate.
	Load float64
	// Tokenization compares the gateway's tokenization of a text workload
	// with the engines' (see TokenizeSharedPrefix); nil for a workload of
	// token ids.
	Tokenization *TokenizationStats
}

// WorkloadStats summarises a workload.
type WorkloadStats struct {
	Requests     int           `json:"requests"`
	PromptTokens int64         `json:"promptTokens"`
	OutputTokens int64         `json:"outputTokens"`
	Duration     time.Duration `json:"durationNanos"`
}

// Stats returns the workload's size and span.
func (w Workload) Stats() WorkloadStats {
	s := WorkloadStats{Requests: len(w.Requests)}
	for _, r := range w.Requests {
		s.PromptTokens += int64(len(r.Prompt))
		s.OutputTokens += int64(r.OutputTokens)
	}
	if n := len(w.Requests); n > 0 {
		s.Duration = w.Requests[n-1].Arrival - w.Requests[0].Arrival
	}
	return s
}

// routeTokens returns the ids the gateway routes r on.
func (r *Request) routeTokens() []uint32 {
	if r.RouteTokens != nil {
		return r.RouteTokens
	}
	return r.Prompt
}

// validate checks what a simulation relies on: requests in arrival order,
// unique ids, prompts in the vocabulary of vocab ids, at least one output
// token.
func (w Workload) validate(vocab uint32) error {
	if len(w.Requests) == 0 {
		return fmt.Errorf("workload %q has no requests", w.Name)
	}
	seen := make(map[string]struct{}, len(w.Requests))
	for i, r := range w.Requests {
		var err error
		switch {
		case r.ID == "":
			err = errors.New("empty id")
		case i > 0 && r.Arrival < w.Requests[i-1].Arrival:
			err = fmt.Errorf("arrives at %v, before the request before it (%v)", r.Arrival, w.Requests[i-1].Arrival)
		case r.Arrival < 0:
			err = fmt.Errorf("negative arrival %v", r.Arrival)
		case len(r.Prompt) == 0:
			err = errors.New("empty prompt")
		case r.OutputTokens < 1:
			err = fmt.Errorf("%d output tokens, want at least 1", r.OutputTokens)
		}
		if err == nil {
			if _, dup := seen[r.ID]; dup {
				err = errors.New("duplicate id")
			}
			seen[r.ID] = struct{}{}
		}
		if err == nil {
			for _, t := range r.Prompt {
				if t >= vocab {
					err = fmt.Errorf("token id %d is outside the vocabulary (%d ids)", t, vocab)
					break
				}
			}
		}
		if err != nil {
			return fmt.Errorf("workload %q, request %d (%q): %w", w.Name, i, r.ID, err)
		}
	}
	return nil
}
