package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/kvgate/kvgate/pkg/tokenizer/hf"
)

// Settings of Config.Reasoning.
const (
	// ReasoningAuto learns how a model's engine passes reasoning when
	// its chat form is verified.
	ReasoningAuto = "auto"
	// ReasoningRecent takes recent vLLM versions' way
	// (hf.VLLMReasoning) for every model.
	ReasoningRecent = "reasoning"
	// ReasoningEarlier takes earlier vLLM versions' way
	// (hf.VLLMReasoningContent) for every model.
	ReasoningEarlier = "reasoning_content"
	// ReasoningEngine leaves chats carrying reasoning to the engines.
	ReasoningEngine = "engine"
)

// ReasoningSettings are the settings of Config.Reasoning.
var ReasoningSettings = []string{ReasoningAuto, ReasoningRecent, ReasoningEarlier, ReasoningEngine}

// Results of a reasoning probe, as kvgate_tokenizer_reasoning_probes_total
// labels them.
const (
	probeMatch   = "match"   // the engine's ids are a candidate's
	probeNoMatch = "nomatch" // they are no candidate's
	probeRefused = "refused" // the engine refused the probe
	probeError   = "error"   // the engine did not answer
)

// reasoningMembers are the members of an assistant message that carry its
// reasoning, in the order of hf.ReasoningPassing's fields.
var reasoningMembers = [2]string{"reasoning", "reasoning_content"}

// reasoningCandidates are the key sets under which a template may see a
// reasoning member: none, reasoning, reasoning_content, both.
var reasoningCandidates = [4]hf.ReasoningKeys{0, hf.KeyReasoning, hf.KeyReasoningContent, hf.KeyReasoning | hf.KeyReasoningContent}

// probeThought is the reasoning the probes carry.
const probeThought = "The user asks for a product; 17 times 3 is 51. Check: 17 times 3 is 51."

// reasoningProbe is a chat shape in which common chat templates render an
// assistant message's reasoning.
type reasoningProbe struct {
	name string
	// messages are the chat's messages as JSON, the reasoning member and
	// its value written where %s is.
	messages string
	tools    string
	// addGenerationPrompt is the request's add_generation_prompt.
	addGenerationPrompt bool
}

// reasoningProbes are the shapes learnReasoning asks the engine about: the
// assistant's answer to the last user message left as the last message
// (Qwen3's, DeepSeek's and GLM's templates write its reasoning), a tool
// call whose result the assistant is to read (written too, the tool call
// being part of the turn under way), and an earlier turn (which most
// templates drop).
var reasoningProbes = []reasoningProbe{
	{
		name:     "last assistant turn",
		messages: `[{"role":"user","content":"What is 17 times 3?"},{"role":"assistant","content":"17 times 3 is 51.",%s}]`,
	},
	{
		name: "tool call",
		messages: `[{"role":"user","content":"What is the weather in Paris?"},` +
			`{"role":"assistant","content":"","tool_calls":[{"id":"call_1","type":"function",` +
			`"function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}],%s},` +
			`{"role":"tool","tool_call_id":"call_1","content":"{\"temperature\":18}"}]`,
		tools: `[{"type":"function","function":{"name":"get_weather","description":"The weather in a city.",` +
			`"parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]`,
		addGenerationPrompt: true,
	},
	{
		name:                "earlier turn",
		messages:            `[{"role":"user","content":"What is 17 times 3?"},{"role":"assistant","content":"51.",%s},{"role":"user","content":"And 17 times 4?"}]`,
		addGenerationPrompt: true,
	},
}

// request returns the probe's chat carrying member.
func (p reasoningProbe) request(model, member string) *ChatRequest {
	thought, _ := json.Marshal(probeThought)
	req := &ChatRequest{Model: model, Messages: json.RawMessage(fmt.Sprintf(p.messages, `"`+member+`":`+string(thought))),
		AddGenerationPrompt: &p.addGenerationPrompt}
	if p.tools != "" {
		req.Tools = json.RawMessage(p.tools)
	}
	return req
}

// withKeys returns the passing that gives the member of index member the
// keys k and drops the other.
func withKeys(member int, k hf.ReasoningKeys) hf.ReasoningPassing {
	p := hf.ReasoningPassing{Known: true}
	if member == 0 {
		p.Reasoning = k
	} else {
		p.ReasoningContent = k
	}
	return p
}

// learnOutcome is how learnReasoning ended.
type learnOutcome int

const (
	learnLearned learnOutcome = iota // the way was learned
	learnUnknown                     // the engine's answers tell no way
	learnRetry                       // the engine did not answer: ask again later
)

// learnReasoning asks the engine at baseURL how it passes an assistant
// message's reasoning to the model's chat template: for each member
// (reasoning, reasoning_content), every probe carrying it alone is
// tokenized by the engine and rendered here with the member under each
// candidate key set. A member's keys are those of a candidate whose ids
// equal the engine's on every probe; candidates that do on every probe
// render alike here, and the known vLLM conventions are preferred among
// them. It returns learnUnknown with the reason when a member has no such
// candidate or the engine refused a probe, and learnRetry when the engine
// did not answer one.
func (t *Tokenizer) learnReasoning(lm *localModel, baseURL string) (hf.ReasoningPassing, string, learnOutcome) {
	var fits [2]uint8 // by member, a bit per candidate
	for m, member := range reasoningMembers {
		fits[m] = 1<<len(reasoningCandidates) - 1
		for _, probe := range reasoningProbes {
			req := probe.request(lm.name, member)
			body, err := req.body()
			if err != nil {
				return hf.ReasoningPassing{}, fmt.Sprintf("probe %q with %s: %v", probe.name, member, err), learnUnknown
			}
			res, err := t.callBody(baseURL, lm.name, body)
			var terr *Error
			switch {
			case errors.As(err, &terr) && terr.Reason == ReasonStatus && terr.StatusCode < 500:
				t.m.reasoningProbes(lm.name, probeRefused).Inc()
				return hf.ReasoningPassing{}, fmt.Sprintf("the engine refused probe %q with %s: %v", probe.name, member, err), learnUnknown
			case err != nil:
				t.m.reasoningProbes(lm.name, probeError).Inc()
				return hf.ReasoningPassing{}, fmt.Sprintf("the engine did not answer probe %q with %s: %v", probe.name, member, err), learnRetry
			}
			var matched uint8
			for c, keys := range reasoningCandidates {
				chat, err := req.localChat(withKeys(m, keys))
				if err != nil {
					continue
				}
				if ids, err := lm.tk.EncodeChat(chat, false); err == nil && slices.Equal(ids, res.tokens) {
					matched |= 1 << c
				}
			}
			if matched == 0 {
				t.m.reasoningProbes(lm.name, probeNoMatch).Inc()
				return hf.ReasoningPassing{}, fmt.Sprintf("the engine's ids for probe %q with %s are no candidate's", probe.name, member), learnUnknown
			}
			t.m.reasoningProbes(lm.name, probeMatch).Inc()
			fits[m] &= matched
		}
		if fits[m] == 0 {
			return hf.ReasoningPassing{}, fmt.Sprintf("no way of passing %s fits every probe", member), learnUnknown
		}
	}
	fit := func(m int, k hf.ReasoningKeys) bool {
		return fits[m]&(1<<slices.Index(reasoningCandidates[:], k)) != 0
	}
	for _, p := range []hf.ReasoningPassing{hf.VLLMReasoning, hf.VLLMReasoningContent} {
		if fit(0, p.Reasoning) && fit(1, p.ReasoningContent) {
			return p, "", learnLearned
		}
	}
	p := hf.ReasoningPassing{Known: true}
	for m := range reasoningMembers {
		for _, k := range reasoningCandidates {
			if fit(m, k) {
				if m == 0 {
					p.Reasoning = k
				} else {
					p.ReasoningContent = k
				}
				break
			}
		}
	}
	return p, "", learnLearned
}
