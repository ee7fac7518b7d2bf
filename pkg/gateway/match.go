package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/internal/jsonscan"
	"github.com/kvgate/kvgate/pkg/routing"
	"github.com/kvgate/kvgate/pkg/tokenizer"
	"github.com/kvgate/kvgate/pkg/types"
)

// matchRequest is the body of POST /debug/match: a model and exactly one of
// a prompt (a string or token ids, tokenized as /v1/completions does),
// chat messages (rendered and tokenized as /v1/chat/completions does) or
// token ids.
type matchRequest struct {
	Model string `json:"model"`
	// Lora names a LoRA adapter of Model; the request is then matched as
	// one for the adapter.
	Lora     string          `json:"lora"`
	Prompt   json.RawMessage `json:"prompt"`
	Messages json.RawMessage `json:"messages"`
	Tokens   []uint32        `json:"tokens"`
}

// matchResponse is the answer of POST /debug/match.
type matchResponse struct {
	Model string `json:"model"`
	Lora  string `json:"lora,omitempty"`
	// PromptTokens is the prompt's length in tokens; TokenSource says
	// where they came from: "tokens" (the request), "tokenizer" (the
	// engines' /tokenize), or "none" when tokenization failed, with
	// TokenizeError saying why; the decisions are then on load alone.
	PromptTokens  int    `json:"promptTokens"`
	TokenSource   string `json:"tokenSource"`
	TokenizeError string `json:"tokenizeError,omitempty"`
	// BlockSize and PromptBlocks describe how the prompt was matched; 0
	// when the index knows no block of the model.
	BlockSize    int `json:"blockSize"`
	PromptBlocks int `json:"promptBlocks"`
	// Pods is how much of the prompt's prefix each candidate holds: the
	// ready pods that are not ejected, or all of them when all are.
	Pods []podMatchView `json:"pods"`
	// Ejected lists the ready pods that requests lately failed to connect
	// to: routing leaves them out (unless every pod is ejected), and the
	// decisions below are among the others.
	Ejected []ejectedPodView `json:"ejected,omitempty"`
	// DefaultAlgorithm serves requests without a routing-strategy header;
	// Decisions holds the decision each algorithm would take now.
	DefaultAlgorithm string             `json:"defaultAlgorithm"`
	Decisions        []routing.Decision `json:"decisions"`
}

// podMatchView is one pod's match.
type podMatchView struct {
	Pod              string `json:"pod"`
	MatchedBlocks    int    `json:"matchedBlocks"`
	MatchedGPUBlocks int    `json:"matchedGPUBlocks"`
	MatchedTokens    int    `json:"matchedTokens"`
	MatchedGPUTokens int    `json:"matchedGPUTokens"`
}

// ejectedPodView is one ejected pod.
type ejectedPodView struct {
	Pod string `json:"pod"`
	// Reason is why it was last ejected (connection_refused, dial), and
	// Ejections the ejections in a row, each doubling the backoff.
	Reason         string  `json:"reason"`
	Ejections      int     `json:"ejections"`
	BackoffSeconds float64 `json:"backoffSeconds"`
	// RemainingSeconds is how long it stays ejected unless a request or a
	// scrape reaches it first.
	RemainingSeconds float64 `json:"remainingSeconds"`
}

// ejectedViews describes the ejected pods of pods.
func ejectedViews(store *cache.Store, pods []*endpoint.Endpoint, now time.Time) []ejectedPodView {
	var out []ejectedPodView
	for _, p := range pods {
		if ej, ok := store.PodEjection(p); ok {
			out = append(out, ejectedPodView{Pod: p.ID, Reason: string(ej.Reason), Ejections: ej.Count,
				BackoffSeconds: ej.Backoff.Seconds(), RemainingSeconds: ej.Until.Sub(now).Seconds()})
		}
	}
	return out
}

// Bounds of /debug/match, which reads a whole prompt and matches it for
// every algorithm: an operator's tool, bounded so that it cannot take the
// gateway's memory or CPU from the requests.
const (
	// maxMatchBodyBytes bounds the body of a request.
	maxMatchBodyBytes = 8 << 20
	// maxMatchTokens bounds the prompt, in tokens: more than any model's
	// context.
	maxMatchTokens = 1 << 20
	// maxConcurrentMatches bounds the requests served at once; others are
	// answered 429.
	maxConcurrentMatches = 2
)

// serveMatch answers POST /debug/match: how each pod matches a prompt and
// what every routing algorithm would decide, without routing anything.
func (g *Gateway) serveMatch(w http.ResponseWriter, r *http.Request) {
	if !allowMethod(w, r, http.MethodPost) {
		return
	}
	b := g.readyOr503(w)
	if b == nil {
		return
	}
	select {
	case g.matchSlots <- struct{}{}:
		defer func() { <-g.matchSlots }()
	default:
		g.metrics.matchRefusals.WithLabelValues("busy").Inc()
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusTooManyRequests, typeRateLimit, codeTooManyRequests, "",
			fmt.Sprintf("%d /debug/match requests are being served; try again", maxConcurrentMatches))
		return
	}
	req, status, code, msg := decodeMatch(w, r, min(g.cfg.MaxRequestBodyBytes, maxMatchBodyBytes))
	if status != 0 {
		if status == http.StatusRequestEntityTooLarge {
			g.metrics.matchRefusals.WithLabelValues("too_large").Inc()
		}
		writeError(w, status, typeInvalidRequest, code, "", msg)
		return
	}
	target := req.Model
	if req.Lora != "" {
		target = req.Lora
	}
	pods, err := b.store.ListPodsByModel(target)
	if err != nil {
		writeError(w, http.StatusNotFound, typeInvalidRequest, codeModelNotFound, "model", fmt.Sprintf("the model `%s` does not exist", target))
		return
	}
	if len(pods) == 0 {
		writeError(w, http.StatusServiceUnavailable, typeServiceUnavailable, codeNoReadyPod, "model",
			fmt.Sprintf("no pod serving the model `%s` is ready", target))
		return
	}
	resp := matchResponse{Model: req.Model, TokenSource: "tokens", Ejected: ejectedViews(b.store, pods, time.Now())}
	pods = withoutEjected(pods, b.store.Snapshots(pods, nil))
	rc := types.NewRoutingContext(g.requestID(), target)
	rc.LoraAdapter = req.Lora
	if req.Lora == "" {
		rc.LoraAdapter = adapterOf(target, pods)
	}
	resp.Lora = rc.LoraAdapter
	if req.Tokens != nil {
		rc.PromptTokenIDs = req.Tokens
	} else {
		if g.tokenizer == nil {
			writeError(w, http.StatusBadRequest, typeInvalidRequest, codeTokenizerDisabled, "",
				"the remote tokenizer is disabled: send token ids in \"tokens\"")
			return
		}
		resp.TokenSource = "tokenizer"
		in := inference{kind: kindCompletion, comp: completionBody{CompletionRequest: tokenizer.CompletionRequest{Model: target, Prompt: req.Prompt}}}
		if req.Messages != nil {
			in = inference{kind: kindChat, chat: chatBody{ChatRequest: tokenizer.ChatRequest{Model: target, Messages: req.Messages}}}
		}
		pod := g.tokenizerPod(pods, nil)
		if rc.PromptTokenIDs, err = in.tokenize(r.Context(), g.tokenizer, g.tokenURL.forPod(pod)); err != nil {
			resp.TokenSource, resp.TokenizeError = "none", err.Error()
		}
	}
	e, err := b.router.Explain(rc, b.store.Snapshots(pods, nil))
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, typeServiceUnavailable, codeNoReadyPod, "", err.Error())
		return
	}
	resp.PromptTokens = len(rc.PromptTokenIDs)
	resp.DefaultAlgorithm, resp.Decisions = e.DefaultAlgorithm, e.Decisions
	resp.Pods = []podMatchView{}
	if len(e.Decisions) > 0 {
		d := e.Decisions[0]
		resp.BlockSize, resp.PromptBlocks = d.BlockSize, d.PromptBlocks
		for _, c := range d.Candidates {
			resp.Pods = append(resp.Pods, podMatchView{Pod: c.Pod, MatchedBlocks: c.MatchedBlocks,
				MatchedGPUBlocks: c.MatchedGPUBlocks, MatchedTokens: c.MatchedTokens, MatchedGPUTokens: c.MatchedGPUTokens})
		}
	}
	writeJSON(w, resp)
}

// decodeMatch reads and checks a /debug/match body; a non-zero status
// describes what is wrong with it. The token ids are read by hand, and a
// prompt longer than maxMatchTokens is refused.
func decodeMatch(w http.ResponseWriter, r *http.Request, limit int64) (req matchRequest, status int, code, msg string) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return req, http.StatusRequestEntityTooLarge, codeRequestTooLarge, fmt.Sprintf("the request body exceeds %d bytes", limit)
		}
		return req, http.StatusBadRequest, codeUnreadableBody, "reading the request body failed: " + err.Error()
	}
	if err := req.decode(body); err != nil {
		if errors.Is(err, errTooManyTokens) {
			return req, http.StatusRequestEntityTooLarge, codeRequestTooLarge, err.Error()
		}
		return req, http.StatusBadRequest, codeInvalidJSON, jsonError(err)
	}
	if req.Model == "" {
		return req, http.StatusBadRequest, codeMissingField, "the request names no model"
	}
	given := 0
	for _, set := range []bool{len(req.Prompt) > 0, len(req.Messages) > 0, req.Tokens != nil} {
		if set {
			given++
		}
	}
	if given != 1 {
		return req, http.StatusBadRequest, codeInvalidField, `give exactly one of "prompt", "messages" and "tokens"`
	}
	return req, 0, "", ""
}

// errTooManyTokens reports a /debug/match prompt beyond maxMatchTokens.
var errTooManyTokens = fmt.Errorf("the prompt exceeds %d tokens", maxMatchTokens)

// decode reads a /debug/match body, which may hold no other member.
func (m *matchRequest) decode(body []byte) error {
	if i := jsonscan.SkipSpace(body, 0); i < len(body) && body[i] != '{' {
		return errNotObject
	}
	return jsonscan.Members(body, func(name, value []byte) error {
		switch string(jsonscan.Name(name)) {
		case "model":
			return decodeString(name, value, &m.Model)
		case "lora":
			return decodeString(name, value, &m.Lora)
		case "prompt":
			m.Prompt = value
		case "messages":
			m.Messages = value
		case "tokens":
			if value[0] == 'n' {
				m.Tokens = nil
				return nil
			}
			if value[0] != '[' {
				return wrongType(name, "an array of token ids", value)
			}
			// Each id takes two bytes at least: bound the ids before
			// reading them.
			if n := bytes.Count(value, []byte(",")) + 1; n > maxMatchTokens {
				return errTooManyTokens
			}
			ids, _, err := jsonscan.ParseTokenIDs(value, 0, nil)
			if err != nil {
				return &typeError{field: "tokens", want: "an array of token ids", got: err.Error()}
			}
			m.Tokens = ids
		default:
			return &unknownFieldError{name: string(jsonscan.Name(name))}
		}
		return nil
	})
}

// unknownFieldError reports a member a body may not hold.
type unknownFieldError struct{ name string }

func (e *unknownFieldError) Error() string { return fmt.Sprintf("unknown field %q", e.name) }
