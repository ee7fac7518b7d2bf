package simserver

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/kvgate/kvgate/pkg/sim"
)

// choice is one engine request serving one choice of an HTTP request.
type choice struct {
	runner   *runner
	engineID string
	prompt   int // index of the prompt it completes
	tokens   []uint32
	finish   sim.FinishReason
	done     bool
	stats    sim.RequestStats
}

// generation is an HTTP request's set of engine requests: n choices for
// each prompt, choice i completing prompt i/n.
type generation struct {
	id      string
	created int64
	model   string
	prompts [][]uint32
	choices []choice
	index   map[string]int // engine request id -> choice index
	box     *mailbox
	pending int
}

// generationSpec is what a completions or chat request asks for.
type generationSpec struct {
	idPrefix  string
	model     string
	lora      *sim.LoRA
	prompts   [][]uint32
	n         int
	maxTokens int
	seed      uint64
	// rank is the index of the rank the request asked for
	// (HeaderDataParallelRank), -1 for the least loaded.
	rank int
}

// startGeneration submits every choice of spec to the rank it asked for,
// or else to the least loaded ranks. On error it aborts what it
// submitted.
func (s *Server) startGeneration(spec generationSpec) (*generation, error) {
	g := &generation{
		id:      spec.idPrefix + randomHex(),
		created: time.Now().Unix(),
		model:   spec.model,
		prompts: spec.prompts,
		index:   make(map[string]int, len(spec.prompts)*spec.n),
		box:     newMailbox(),
	}
	for p, prompt := range spec.prompts {
		for j := range spec.n {
			i := len(g.choices)
			c := choice{runner: s.pickRunner(spec.rank), engineID: g.id + "-" + strconv.Itoa(i), prompt: p}
			err := c.runner.submit(sim.RequestSpec{
				ID:        c.engineID,
				Prompt:    prompt,
				MaxTokens: spec.maxTokens,
				LoRA:      spec.lora,
				Seed:      spec.seed + uint64(j),
			}, g.box)
			if err != nil {
				g.abort()
				return nil, err
			}
			g.choices = append(g.choices, c)
			g.index[c.engineID] = i
			g.pending++
		}
	}
	return g, nil
}

// abort drops the choices that have not finished.
func (g *generation) abort() {
	for i := range g.choices {
		if c := &g.choices[i]; !c.done {
			c.runner.abort(c.engineID)
		}
	}
}

// next waits for the next outputs and applies them to their choices. It
// aborts the generation when ctx ends or an engine stops.
func (g *generation) next(ctx context.Context) ([]sim.RequestOutput, error) {
	outs, err := g.box.take(ctx)
	if err != nil {
		g.abort()
		return nil, err
	}
	for _, out := range outs {
		c := &g.choices[g.index[out.RequestID]]
		c.tokens = append(c.tokens, out.Token)
		c.stats = out.Stats
		if out.Finished {
			c.done, c.finish = true, out.FinishReason
			g.pending--
		}
	}
	return outs, nil
}

// wait applies outputs until every choice has finished. It aborts the
// generation when ctx ends or an engine stops.
func (g *generation) wait(ctx context.Context) error {
	for g.pending > 0 {
		if _, err := g.next(ctx); err != nil {
			return err
		}
	}
	return nil
}

// waitFor waits for the generation of r, a whole (not streamed) response
// to be written to w, and reports whether it finished. When it did not,
// the failure is written with fail, in the shape of the request's API,
// unless r's client left, which leaves nobody to answer.
func (g *generation) waitFor(r *http.Request, w http.ResponseWriter, fail func(http.ResponseWriter, error)) bool {
	err := g.wait(r.Context())
	if err != nil && r.Context().Err() == nil {
		fail(w, err)
	}
	return err == nil
}

// choiceOf returns the index of the choice an output belongs to.
func (g *generation) choiceOf(out sim.RequestOutput) int { return g.index[out.RequestID] }

// usage totals the generation's tokens as vLLM does: each prompt counted
// once, every choice's output, and the prompt tokens the prefix cache held
// for each prompt's first choice.
func (g *generation) usage() *usage {
	u := &usage{}
	for i, c := range g.choices {
		u.CompletionTokens += c.stats.OutputTokens
		if i == 0 || g.choices[i-1].prompt != c.prompt {
			u.PromptTokens += len(g.prompts[c.prompt])
			u.PromptTokensDetails.CachedTokens += c.stats.CachedTokens
		}
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	return u
}

// randomHex returns 32 random hex digits for a response id.
func randomHex() string { return fmt.Sprintf("%016x%016x", rand.Uint64(), rand.Uint64()) }
