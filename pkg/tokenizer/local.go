package tokenizer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/pkg/tokenizer/hf"
)

// Form names, as metric labels and in LocalModel.
const (
	FormCompletion = "completion"
	FormChat       = "chat"
)

var forms = [...]string{FormCompletion, FormChat}

const (
	formIndexCompletion = 0
	formIndexChat       = 1
)

// LocalState is what a model's in-process tokenizer does for one form.
type LocalState string

const (
	// LocalUnverified: not yet compared with the engine; the engine
	// tokenizes until it is.
	LocalUnverified LocalState = "unverified"
	// LocalVerifying: the comparison with the engine is running.
	LocalVerifying LocalState = "verifying"
	// LocalActive: the comparison passed; prompts are tokenized in process.
	LocalActive LocalState = "active"
	// LocalFallback: the engine's ids differed; the engine tokenizes.
	LocalFallback LocalState = "fallback"
	// LocalUnavailable: the files hold no chat template; the engine
	// tokenizes chats.
	LocalUnavailable LocalState = "unavailable"
)

// localState values, as stored.
const (
	stateUnverified int32 = iota
	stateVerifying
	stateActive
	stateFallback
	stateUnavailable
)

var stateNames = [...]LocalState{LocalUnverified, LocalVerifying, LocalActive, LocalFallback, LocalUnavailable}

// verifyRetry is how long a verification that could not reach the engine
// waits before it is tried again.
const verifyRetry = 30 * time.Second

// mismatchLogEvery bounds the mismatch logs of a model and form.
const mismatchLogEvery = time.Minute

// localModel is a model's in-process tokenizer and its verification state.
type localModel struct {
	name string
	dir  string
	tk   *hf.Tokenizer

	state       [2]atomic.Int32
	retryAt     [2]atomic.Int64 // unix nanoseconds
	lastLog     [2]atomic.Int64 // unix nanoseconds of the last mismatch log
	maxModelLen atomic.Int64    // learned from the engine's answers
	// reasoning is how the engine passes an assistant message's
	// reasoning to the chat template, learned when the chat form is
	// verified; nil while it is not known.
	reasoning atomic.Pointer[hf.ReasoningPassing]

	mu     sync.Mutex
	reason [2]string // why the form falls back, or ""
}

// LocalModel describes a model's in-process tokenizer, for debugging.
type LocalModel struct {
	// Model is the served model name; Dir the directory of its files.
	Model string `json:"model"`
	Dir   string `json:"dir"`
	// Completion and Chat are the states of the two forms.
	Completion LocalState `json:"completion"`
	Chat       LocalState `json:"chat"`
	// CompletionReason and ChatReason say why a form falls back to the
	// engine.
	CompletionReason string `json:"completionReason,omitempty"`
	ChatReason       string `json:"chatReason,omitempty"`
	// Reasoning is how the engine passes an assistant message's reasoning
	// to the chat template, learned when the chat form was verified or set
	// by Config.Reasoning (hf.ReasoningPassing's names: "reasoning" for
	// recent vLLM versions, "reasoning_content" for earlier ones);
	// "unknown" while it is not known, when chats carrying reasoning are
	// tokenized by the engine. Absent when the chat template does not
	// mention reasoning.
	Reasoning string `json:"reasoning,omitempty"`
}

// reasoningPassing returns how the engine passes assistant reasoning, the
// zero value while it is not known.
func (lm *localModel) reasoningPassing() hf.ReasoningPassing {
	if p := lm.reasoning.Load(); p != nil {
		return *p
	}
	return hf.ReasoningPassing{}
}

// maxLocalDepth bounds how deep model directories are looked for: model
// names have one or two parts, and symbolic links could make a loop.
const maxLocalDepth = 6

// loadLocalModels loads the tokenizer files under dir: every directory
// holding hf.TokenizerFile is a model, named by its path relative to dir
// ("Qwen/Qwen3-8B" for dir/Qwen/Qwen3-8B/tokenizer.json). Symbolic links
// are followed; entries whose names start with ".." (the bookkeeping of
// Kubernetes volumes) are skipped.
func loadLocalModels(dir string) (map[string]*localModel, error) {
	models := map[string]*localModel{}
	var errs []error
	var walk func(rel string, depth int) error
	walk = func(rel string, depth int) error {
		path := filepath.Join(dir, rel)
		entries, err := os.ReadDir(path)
		if err != nil {
			return err
		}
		for _, e := range entries {
			name := e.Name()
			if strings.HasPrefix(name, "..") {
				continue
			}
			info, err := os.Stat(filepath.Join(path, name))
			if err != nil {
				errs = append(errs, err)
				continue
			}
			switch {
			case info.IsDir() && depth < maxLocalDepth:
				if err := walk(filepath.Join(rel, name), depth+1); err != nil {
					errs = append(errs, err)
				}
			case !info.IsDir() && name == hf.TokenizerFile:
				if rel == "" {
					errs = append(errs, fmt.Errorf("%s: tokenizer files must be in a directory named after the model", filepath.Join(path, name)))
					continue
				}
				tk, err := hf.Load(path)
				if err != nil {
					errs = append(errs, err)
					continue
				}
				lm := &localModel{name: filepath.ToSlash(rel), dir: path, tk: tk}
				if !tk.HasChatTemplate() {
					lm.state[formIndexChat].Store(stateUnavailable)
					lm.reason[formIndexChat] = "the tokenizer files hold no chat template"
				}
				models[lm.name] = lm
			}
		}
		return nil
	}
	if err := walk("", 0); err != nil {
		return nil, fmt.Errorf("tokenizer directory %s: %w", dir, err)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("tokenizer directory %s: %w", dir, errors.Join(errs...))
	}
	if len(models) == 0 {
		return nil, fmt.Errorf("tokenizer directory %s holds no %s", dir, hf.TokenizerFile)
	}
	return models, nil
}

// LocalModels describes the in-process tokenizers, by model name.
func (t *Tokenizer) LocalModels() []LocalModel {
	out := make([]LocalModel, 0, len(t.local))
	for _, lm := range t.local {
		lm.mu.Lock()
		m := LocalModel{
			Model: lm.name, Dir: lm.dir,
			Completion: stateNames[lm.state[formIndexCompletion].Load()], Chat: stateNames[lm.state[formIndexChat].Load()],
			CompletionReason: lm.reason[formIndexCompletion], ChatReason: lm.reason[formIndexChat],
		}
		lm.mu.Unlock()
		if lm.tk.MentionsReasoning() {
			m.Reasoning = lm.reasoningPassing().String()
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Model < out[j].Model })
	return out
}

// localFor returns the model's in-process tokenizer when it is active for
// form. When the model has a form yet to be verified, it starts comparing
// the in-process tokenizer with the engine at baseURL, a ready pod of the
// model, for every such form, and the engine tokenizes meanwhile.
func (t *Tokenizer) localFor(model string, form int, baseURL string) *localModel {
	lm := t.local[model]
	if lm == nil {
		return nil
	}
	state := lm.state[form].Load()
	if state == stateActive {
		return lm
	}
	for f := range forms {
		if lm.state[f].Load() == stateUnverified && time.Now().UnixNano() >= lm.retryAt[f].Load() &&
			lm.state[f].CompareAndSwap(stateUnverified, stateVerifying) {
			if !t.goBackground(func() { t.verifyAtStart(lm, f, baseURL) }) {
				lm.state[f].Store(stateUnverified)
			}
		}
	}
	switch state {
	case stateUnverified, stateVerifying:
		t.m.localFallbacks[fallbackUnverified].Inc()
	case stateFallback:
		t.m.localFallbacks[fallbackMismatch].Inc()
	}
	return nil
}

// localCompletion tokenizes a text prompt in process. ok is false when
// the engine must; err is an *Error when the prompt is tokenized by
// neither: it is larger than Config.LocalMaxBytes (ReasonTooLarge), or ctx
// ended first (ReasonCanceled).
func (t *Tokenizer) localCompletion(ctx context.Context, req *CompletionRequest, text json.RawMessage, baseURL string) (res result, ok bool, err error) {
	lm := t.localFor(req.Model, formIndexCompletion, baseURL)
	if lm == nil {
		return result{}, false, nil
	}
	if len(text) > t.localMaxBytes {
		return result{}, false, t.tooLarge(req.Model, "prompt", len(text))
	}
	var s string
	if err := json.Unmarshal(text, &s); err != nil {
		return result{}, false, nil
	}
	ids, err := lm.tk.EncodeContext(ctx, s, boolOr(req.AddSpecialTokens, true))
	if err != nil {
		return result{}, false, t.localFailure(req.Model, err)
	}
	res = result{tokens: exactIDs(ids), maxModelLen: int(lm.maxModelLen.Load())}
	t.m.localTokenizations[formIndexCompletion].Inc()
	if t.sample() {
		body, err := req.body(text)
		if err == nil {
			t.verifyLive(lm, formIndexCompletion, baseURL, body, res.tokens)
		}
	}
	return res, true, nil
}

// localChat renders and tokenizes a chat in process. ok is false when the
// engine must: requests that replace the chat template or carry
// multimodal settings, and conversations the template cannot render here
// (content other than text, for example). err is as for localCompletion;
// both the chat's JSON and the rendered chat must fit
// Config.LocalMaxBytes.
func (t *Tokenizer) localChat(ctx context.Context, req *ChatRequest, baseURL string) (res result, ok bool, err error) {
	lm := t.localFor(req.Model, formIndexChat, baseURL)
	if lm == nil {
		return result{}, false, nil
	}
	if req.ChatTemplate != "" || present(req.MMProcessorKwargs) || present(req.MediaIOKwargs) {
		t.m.localFallbacks[fallbackRequest].Inc()
		return result{}, false, nil
	}
	if n := len(req.Messages) + len(req.Tools) + len(req.Documents) + len(req.ChatTemplateKwargs); n > t.localMaxBytes {
		return result{}, false, t.tooLarge(req.Model, "chat", n)
	}
	chat, err := req.localChat(lm.reasoningPassing())
	var text string
	if err == nil {
		text, err = lm.tk.RenderChat(chat)
	}
	if err != nil {
		t.m.localFallbacks[fallbackRender].Inc()
		if log := t.log.V(4); log.Enabled() {
			log.Info("Tokenizing a chat with the engine: it does not render in process", "model", req.Model, "err", err)
		}
		return result{}, false, nil
	}
	if len(text) > t.localMaxBytes {
		return result{}, false, t.tooLarge(req.Model, "rendered chat", len(text))
	}
	ids, err := lm.tk.EncodeContext(ctx, text, boolOr(req.AddSpecialTokens, false))
	if err != nil {
		return result{}, false, t.localFailure(req.Model, err)
	}
	ids = exactIDs(ids)
	t.m.localTokenizations[formIndexChat].Inc()
	if t.sample() {
		if body, err := req.body(); err == nil {
			t.verifyLive(lm, formIndexChat, baseURL, body, ids)
		}
	}
	return result{tokens: ids, maxModelLen: int(lm.maxModelLen.Load())}, true, nil
}

// tooLarge counts and returns the error of a request whose text, what, of
// n bytes exceeds Config.LocalMaxBytes.
func (t *Tokenizer) tooLarge(model, what string, n int) error {
	t.m.localFallbacks[fallbackTooLarge].Inc()
	return &Error{Reason: ReasonTooLarge, Model: model,
		Err: fmt.Errorf("%s of %d bytes exceeds the %d bytes tokenized in process", what, n, t.localMaxBytes)}
}

// localFailure handles an in-process encoding that did not finish: a word
// too long to merge sends the request to the engine (nil), and the end of
// the caller's context fails it.
func (t *Tokenizer) localFailure(model string, err error) error {
	if errors.Is(err, hf.ErrWordTooLong) {
		t.m.localFallbacks[fallbackLongWord].Inc()
		return nil
	}
	return &Error{Reason: ReasonCanceled, Model: model, Err: fmt.Errorf("%w: %w", errLeft, err)}
}

// errLeft marks the error of a request whose caller left while it was
// tokenized in process: callers that shared its tokenization try again.
var errLeft = errors.New("the caller stopped waiting while the prompt was tokenized in process")

// localChat returns r as the in-process tokenizer renders it, with the
// template variables vLLM passes and assistant reasoning passed as
// reasoning says.
func (r *ChatRequest) localChat(reasoning hf.ReasoningPassing) (hf.Chat, error) {
	kwargs, err := r.templateKwargs()
	if err != nil {
		return hf.Chat{}, err
	}
	return hf.Chat{
		Messages: r.Messages, Tools: value(r.Tools), TemplateKwargs: kwargs,
		AddGenerationPrompt:  boolOr(r.AddGenerationPrompt, true),
		ContinueFinalMessage: boolOr(r.ContinueFinalMessage, false),
		Reasoning:            reasoning,
	}, nil
}

// sample reports whether an in-process tokenization is checked against
// the engine.
func (t *Tokenizer) sample() bool {
	return t.verifyFraction > 0 && rand.Float64() < t.verifyFraction
}

// goBackground runs fn off the request path, counted so that Close waits
// for it. It does nothing once the Tokenizer is closed.
func (t *Tokenizer) goBackground(fn func()) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.calls.Add(1)
	go func() {
		defer t.calls.Done()
		fn()
	}()
	return true
}

// tryBackgroundSlot takes one of the Config.MaxBackgroundCalls slots of
// calls made off the request path, false when all are taken.
func (t *Tokenizer) tryBackgroundSlot() bool {
	select {
	case t.background <- struct{}{}:
		return true
	default:
		return false
	}
}

func (t *Tokenizer) releaseBackgroundSlot() { <-t.background }

// verifyLive compares an in-process tokenization with the engine's, off
// the request path; when every background slot is taken the check is
// skipped, and counted.
func (t *Tokenizer) verifyLive(lm *localModel, form int, baseURL string, body []byte, local []uint32) {
	if !t.tryBackgroundSlot() {
		t.m.verifications(lm.name, form, verifySkipped).Inc()
		return
	}
	if !t.goBackground(func() {
		defer t.releaseBackgroundSlot()
		res, err := t.callBody(baseURL, lm.name, body)
		if err != nil {
			t.m.verifications(lm.name, form, verifyError).Inc()
			return
		}
		lm.maxModelLen.Store(int64(res.maxModelLen))
		if slices.Equal(res.tokens, local) {
			t.m.verifications(lm.name, form, verifyMatch).Inc()
			return
		}
		t.mismatch(lm, form, "live traffic", body, local, res.tokens)
	}) {
		t.releaseBackgroundSlot()
	}
}

// callBody posts body to baseURL's /tokenize.
func (t *Tokenizer) callBody(baseURL, model string, body []byte) (result, error) {
	req, err := t.newCallRequest(baseURL, body)
	if err != nil {
		return result{}, inputError(model, err)
	}
	return t.call(req, model)
}

// mismatch records that the engine tokenized a request differently, and
// makes the engine tokenize the model's requests of that form from then
// on.
func (t *Tokenizer) mismatch(lm *localModel, form int, phase string, body []byte, local, engine []uint32) {
	reason := fmt.Sprintf("%s: the engine's ids differ (%s)", phase, firstDifference(local, engine))
	lm.mu.Lock()
	if lm.reason[form] == "" {
		lm.reason[form] = reason
	}
	lm.mu.Unlock()
	lm.state[form].Store(stateFallback)
	// Counted once the form fell back, so that what the counters show
	// LocalModels shows too.
	t.m.verifications(lm.name, form, verifyMismatch).Inc()
	t.m.mismatches(lm.name, form).Inc()
	now := time.Now().UnixNano()
	if last := lm.lastLog[form].Load(); now-last >= int64(mismatchLogEvery) && lm.lastLog[form].CompareAndSwap(last, now) {
		t.log.Error(nil, "In-process tokenizer differs from the engine's: the engine tokenizes this model's requests from now on",
			"model", lm.name, "form", forms[form], "phase", phase, "difference", firstDifference(local, engine),
			"request", truncateForLog(body))
	}
}

// firstDifference describes where two token sequences part.
func firstDifference(local, engine []uint32) string {
	i := 0
	for i < len(local) && i < len(engine) && local[i] == engine[i] {
		i++
	}
	window := func(s []uint32) []uint32 { return s[i:min(len(s), i+4)] }
	return fmt.Sprintf("%d ids in process, %d from the engine, first difference at %d: %v vs %v",
		len(local), len(engine), i, window(local), window(engine))
}

func truncateForLog(b []byte) string {
	const max = 512
	if len(b) > max {
		return string(b[:max]) + "…"
	}
	return string(b)
}

// verifyAtStart compares the model's in-process tokenizer for form with
// the engine at baseURL on the sample requests, and activates it when
// every answer is equal. When the engine cannot be reached the model
// stays unverified, to be tried again after verifyRetry.
func (t *Tokenizer) verifyAtStart(lm *localModel, form int, baseURL string) {
	ctx := t.ctx
	for _, s := range verifySamples(form) {
		if ctx.Err() != nil {
			lm.state[form].Store(stateUnverified)
			return
		}
		local, body, err := s.run(lm)
		if err != nil {
			t.fail(lm, form, fmt.Sprintf("sample %q does not tokenize in process: %v", s.name, err))
			return
		}
		res, err := t.callBody(baseURL, lm.name, body)
		var terr *Error
		switch {
		case errors.As(err, &terr) && terr.Reason == ReasonStatus && terr.StatusCode < 500:
			t.m.verifications(lm.name, form, verifyError).Inc()
			t.fail(lm, form, fmt.Sprintf("the engine refused sample %q: %v", s.name, err))
			return
		case err != nil:
			t.m.verifications(lm.name, form, verifyError).Inc()
			lm.retryAt[form].Store(time.Now().Add(verifyRetry).UnixNano())
			lm.state[form].Store(stateUnverified)
			t.log.Info("In-process tokenizer not verified yet: the engine did not answer; the engine tokenizes meanwhile",
				"model", lm.name, "form", forms[form], "retryIn", verifyRetry, "err", err)
			return
		}
		lm.maxModelLen.Store(int64(res.maxModelLen))
		if !slices.Equal(local, res.tokens) {
			t.mismatch(lm, form, "verification of sample "+s.name, body, local, res.tokens)
			return
		}
		t.m.verifications(lm.name, form, verifyMatch).Inc()
	}
	if form == formIndexChat && lm.tk.MentionsReasoning() && !t.verifyReasoning(lm, baseURL) {
		lm.retryAt[form].Store(time.Now().Add(verifyRetry).UnixNano())
		lm.state[form].Store(stateUnverified)
		return
	}
	lm.state[form].Store(stateActive)
	t.log.Info("Tokenizing in process: the engine's /tokenize agreed on every sample",
		"model", lm.name, "form", forms[form], "samples", len(verifySamples(form)), "dir", lm.dir)
}

// verifyReasoning sets how the engine passes assistant reasoning to the
// model's chat template, for the chats the chat form then renders: as
// Config.Reasoning says, or learned from the engine at baseURL (see
// learnReasoning). Unknown, chats carrying reasoning are left to the
// engine. It returns false when the engine did not answer a probe: the
// chat form's verification is then tried again after verifyRetry, as when
// the engine does not answer a sample.
func (t *Tokenizer) verifyReasoning(lm *localModel, baseURL string) bool {
	var p hf.ReasoningPassing
	switch t.reasoning {
	case ReasoningEngine:
		lm.reasoning.Store(nil)
		t.log.V(2).Info("The engine tokenizes chats carrying assistant reasoning, as configured", "model", lm.name)
		return true
	case ReasoningRecent, ReasoningEarlier:
		p = hf.VLLMReasoning
		if t.reasoning == ReasoningEarlier {
			p = hf.VLLMReasoningContent
		}
		lm.reasoning.Store(&p)
		t.log.Info("Passing assistant reasoning to the chat template as configured", "model", lm.name, "reasoning", p.String())
		return true
	}
	p, reason, outcome := t.learnReasoning(lm, baseURL)
	switch outcome {
	case learnRetry:
		lm.reasoning.Store(nil)
		t.log.Info("In-process tokenizer not verified yet: the engine did not answer a reasoning probe; the engine tokenizes meanwhile",
			"model", lm.name, "form", forms[formIndexChat], "retryIn", verifyRetry, "reason", reason)
		return false
	case learnUnknown:
		lm.reasoning.Store(nil)
		t.log.Info("How the engine passes assistant reasoning to the chat template is not known: the engine tokenizes chats carrying it",
			"model", lm.name, "reason", reason)
		return true
	}
	lm.reasoning.Store(&p)
	t.log.Info("Learned how the engine passes assistant reasoning to the chat template", "model", lm.name, "reasoning", p.String())
	return true
}

// fail makes the engine tokenize the model's requests of form for good.
func (t *Tokenizer) fail(lm *localModel, form int, reason string) {
	lm.mu.Lock()
	lm.reason[form] = reason
	lm.mu.Unlock()
	lm.state[form].Store(stateFallback)
	t.log.Error(nil, "In-process tokenizer not used: the engine tokenizes this model's requests", "model", lm.name,
		"form", forms[form], "reason", reason)
}
