// Package chatkwargs gives the template variables vLLM's chat endpoint
// passes a chat template beside the messages, so that the gateway's
// tokenizer (package tokenizer) and the simulated engines (package
// simserver) render a chat alike.
package chatkwargs

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Merge returns the chat_template_kwargs vLLM's chat endpoint renders a
// chat with: the request's own kwargs (a JSON object; absent or null for
// none), with the request's documents (unless absent or null) and
// reasoning_effort (unless empty) set over kwargs' own members of those
// names, and enable_thinking set to reasoningEffort != "none" when there is
// a reasoning effort and kwargs does not set enable_thinking itself. With
// neither documents nor a reasoning effort it returns kwargs as it is (nil
// when null). It fails when kwargs must be merged into and is not a JSON
// object.
func Merge(kwargs, documents json.RawMessage, reasoningEffort string) (json.RawMessage, error) {
	own := value(kwargs)
	if !present(documents) && reasoningEffort == "" {
		return own, nil
	}
	merged := map[string]json.RawMessage{}
	if own != nil {
		if err := json.Unmarshal(own, &merged); err != nil {
			return nil, fmt.Errorf("chat_template_kwargs is not a JSON object: %w", err)
		}
	}
	_, ownThinking := merged["enable_thinking"]
	if present(documents) {
		merged["documents"] = documents
	}
	if reasoningEffort != "" {
		effort, err := json.Marshal(reasoningEffort)
		if err != nil {
			return nil, err
		}
		merged["reasoning_effort"] = effort
		if !ownThinking {
			merged["enable_thinking"] = json.RawMessage(fmt.Sprint(reasoningEffort != "none"))
		}
	}
	return json.Marshal(merged)
}

var jsonNull = []byte("null")

// present reports whether raw holds a JSON value other than null.
func present(raw json.RawMessage) bool {
	return len(raw) > 0 && !bytes.Equal(raw, jsonNull)
}

// value returns raw, or nil when it is absent or null.
func value(raw json.RawMessage) json.RawMessage {
	if present(raw) {
		return raw
	}
	return nil
}
