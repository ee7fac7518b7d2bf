package simserver

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/kvgate/kvgate/pkg/sim"
)

// maxBodyBytes bounds a request body.
const maxBodyBytes = 64 << 20

// maxChoices bounds n, the choices per prompt.
const maxChoices = 128

func (s *Server) handleCompletions(w http.ResponseWriter, r *http.Request) {
	var req completionRequest
	lora, ok := s.readRequest(w, r, &req, &req.Model)
	if !ok {
		return
	}
	prompts, err := parsePrompts(s.tokenizer, req.Prompt, req.AddSpecialTokens.or(true))
	if err != nil {
		s.writeError(w, err)
		return
	}
	s.serveGeneration(w, r, req.generationParams, "cmpl-", lora, prompts, req.MaxTokens, completionFormat)
}

func (s *Server) handleChatCompletions(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	lora, ok := s.readRequest(w, r, &req, &req.Model)
	if !ok {
		return
	}
	chat, err := req.chatPrompt()
	if err != nil {
		s.writeError(w, err)
		return
	}
	prompt, err := s.tokenizer.encodeChat(chat)
	if err != nil {
		s.writeError(w, err)
		return
	}
	maxTokens := req.MaxCompletionTokens
	if !maxTokens.given() {
		maxTokens = req.MaxTokens
	}
	s.serveGeneration(w, r, req.generationParams, "chatcmpl-", lora, [][]uint32{prompt}, maxTokens, chatFormat)
}

// serveGeneration runs the engine requests of a completions or chat request
// and answers with the whole result or, for stream, with server-sent events.
func (s *Server) serveGeneration(w http.ResponseWriter, r *http.Request, p generationParams, idPrefix string,
	lora *sim.LoRA, prompts [][]uint32, maxTokens laxInt, f *format) {
	spec := generationSpec{idPrefix: idPrefix, model: p.Model, lora: lora, prompts: prompts, n: 1}
	if spec.model == "" {
		spec.model = s.model
	}
	if spec.n = p.N.or(1); spec.n < 1 || spec.n > maxChoices {
		s.writeError(w, badRequestf("n must be between 1 and %d, got %d", maxChoices, spec.n))
		return
	}
	if maxTokens.given() {
		if maxTokens.n < 1 {
			s.writeError(w, badRequestf("max_tokens must be at least 1, got %d", maxTokens.n))
			return
		}
		spec.maxTokens = maxTokens.n
	}
	if p.Seed.given() {
		spec.seed = uint64(p.Seed.n)
	}
	var err error
	if spec.rank, err = s.requestedRank(r); err != nil {
		s.writeError(w, err)
		return
	}
	g, err := s.startGeneration(spec)
	if err != nil {
		s.writeError(w, err)
		return
	}
	if p.Stream.or(false) {
		s.stream(w, r, g, f, p.StreamOptions.wantsUsage())
		return
	}
	s.answer(w, r, g, f)
}

// answer waits for every choice of g and answers with the whole response.
func (s *Server) answer(w http.ResponseWriter, r *http.Request, g *generation, f *format) {
	if !g.waitFor(r, w, s.writeError) {
		return
	}
	choices := make([]any, len(g.choices))
	for i, c := range g.choices {
		choices[i] = f.fullChoice(i, sim.Tokenizer{}.Decode(c.tokens), finishReason(c.finish))
	}
	writeJSON(w, http.StatusOK, response{ID: g.id, Object: f.object, Created: g.created, Model: g.model,
		Choices: choices, Usage: g.usage()})
}

// handleModels lists the model and the adapters loaded now as vLLM does:
// the model with its path as root and its max_model_len, each adapter with
// its path as root and the model as parent.
func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	maxLen := s.maxModelLen
	card := func(id, root string, parent *string, maxLen *int) modelCard {
		return modelCard{ID: id, Object: "model", Created: s.created, OwnedBy: "vllm", Root: root, Parent: parent,
			MaxModelLen: maxLen, Permission: []modelPermission{newModelPermission(s.created)}}
	}
	cards := []modelCard{card(s.model, s.modelPath, nil, &maxLen)}
	for _, l := range s.loras.list() {
		cards = append(cards, card(l.lora.Name, l.path, &s.model, nil))
	}
	writeJSON(w, http.StatusOK, struct {
		Object string      `json:"object"`
		Data   []modelCard `json:"data"`
	}{"list", cards})
}

func (s *Server) handleTokenize(w http.ResponseWriter, r *http.Request) {
	var req tokenizeRequest
	if _, ok := s.readRequest(w, r, &req, &req.Model); !ok {
		return
	}
	var tokens []uint32
	switch {
	case req.Prompt != nil && req.Messages == nil:
		tokens = s.tokenizer.encode(*req.Prompt, req.AddSpecialTokens.or(true))
	case req.Messages != nil && req.Prompt == nil:
		var err error
		if tokens, err = s.tokenizer.encodeChat(req.prompt()); err != nil {
			s.writeError(w, err)
			return
		}
	default:
		s.writeError(w, badRequestf("give either prompt or messages"))
		return
	}
	writeJSON(w, http.StatusOK, tokenizeResponse{Count: len(tokens), MaxModelLen: s.maxModelLen, Tokens: tokens})
}

// handleResetPrefixCache resets every rank's prefix cache. Unlike vLLM,
// which answers 200 whether or not the reset happened, it answers 409 when a
// rank refused because requests hold blocks.
func (s *Server) handleResetPrefixCache(w http.ResponseWriter, _ *http.Request) {
	var failed []string
	for _, r := range s.runners {
		if err := r.resetPrefixCache(); err != nil {
			failed = append(failed, fmt.Sprintf("rank %d: %v", r.rank, err))
		}
	}
	if len(failed) > 0 {
		s.log.Info("Prefix cache reset refused", "reasons", failed)
		writeJSON(w, http.StatusConflict, apiError{Error: apiErrorBody{
			Message: "reset prefix cache: " + strings.Join(failed, "; "), Type: "ConflictError", Code: http.StatusConflict,
		}})
		return
	}
	s.log.Info("Prefix cache reset", "ranks", len(s.runners))
	w.WriteHeader(http.StatusOK)
}

// readRequest decodes the request body into req and resolves *model, a
// field of req, to the LoRA adapter it names (nil for the base model). When
// either fails it answers with the error and returns false.
func (s *Server) readRequest(w http.ResponseWriter, r *http.Request, req any, model *string) (*sim.LoRA, bool) {
	if !s.readBody(w, r, req) {
		return nil, false
	}
	lora, err := s.lora(*model)
	if err != nil {
		s.writeError(w, err)
		return nil, false
	}
	return lora, true
}

// readBody decodes the request body into req and, when req has a check
// method, checks it; when either fails it answers with the error and
// returns false.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request, req any) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		s.writeError(w, badRequestf("read body: %v", err))
		return false
	}
	if err := decodeBody(body, req); err != nil {
		s.writeError(w, err)
		return false
	}
	if c, ok := req.(interface{ check() error }); ok {
		if err := c.check(); err != nil {
			s.writeError(w, err)
			return false
		}
	}
	return true
}

// writeError answers with the status and OpenAI error body err calls for.
func (s *Server) writeError(w http.ResponseWriter, err error) {
	status, kind := s.errorStatus(err)
	writeJSON(w, status, apiError{Error: apiErrorBody{Message: err.Error(), Type: kind, Code: status}})
}

// errorStatus returns the HTTP status and the error type err calls for,
// logging internal errors.
func (s *Server) errorStatus(err error) (status int, kind string) {
	status, kind = http.StatusInternalServerError, "InternalServerError"
	var br *badRequest
	var nf *notFound
	switch {
	case errors.As(err, &nf):
		status, kind = http.StatusNotFound, "NotFoundError"
	case errors.As(err, &br), errors.Is(err, sim.ErrTooLong), errors.Is(err, sim.ErrInvalidPrompt):
		status, kind = http.StatusBadRequest, "BadRequestError"
	case errors.Is(err, errStopped):
		status, kind = http.StatusServiceUnavailable, "ServiceUnavailableError"
	}
	if status == http.StatusInternalServerError {
		s.log.Error(err, "Request failed")
	}
	return status, kind
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func finishReason(r sim.FinishReason) *string {
	if r == "" {
		return nil
	}
	s := string(r)
	return &s
}
