package tokenizer

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// agentTurns returns the pieces of an agent's conversation of about tokens
// tokens (4 bytes a token): instructions of 16 KiB (a quarter of the whole
// when that is less), then turns of a user
// message, a tool call with its JSON arguments, the tool's output and the
// assistant's text, each of about 2 KiB; and 8 tools with small schemas.
func agentTurns(tokens int) (instructions string, turns [][4]string, tools []map[string]any) {
	rng := rand.New(rand.NewPCG(uint64(tokens), 11))
	words := strings.Fields("the of and to in is that for it with as was on be by this are from at or an which")
	text := func(n int) string {
		var b strings.Builder
		for b.Len() < n {
			b.WriteString(words[rng.IntN(len(words))])
			b.WriteByte(' ')
		}
		return b.String()
	}
	instructions = text(min(16<<10, tokens))
	for size := len(instructions); size < 4*tokens; {
		args, _ := json.Marshal(map[string]any{"path": "src/" + text(20), "limit": rng.IntN(500), "pattern": text(60)})
		t := [4]string{text(512), string(args), text(2048), text(1024)}
		turns = append(turns, t)
		size += len(t[0]) + len(t[1]) + len(t[2]) + len(t[3])
	}
	for i := range 8 {
		tools = append(tools, map[string]any{"name": fmt.Sprintf("tool_%d", i), "description": text(200),
			"schema": map[string]any{"type": "object", "properties": map[string]any{
				"path":  map[string]any{"type": "string", "description": text(40)},
				"limit": map[string]any{"type": "integer", "minimum": 1, "maximum": 1000}},
				"required": []string{"path"}}})
	}
	return instructions, turns, tools
}

// responsesBody returns a Responses request of about tokens tokens as
// Codex CLI sends one: instructions, the history as input items.
func responsesBenchBody(b *testing.B, tokens int) []byte {
	instructions, turns, tools := agentTurns(tokens)
	var input []any
	for i, t := range turns {
		id := fmt.Sprintf("call_%d", i)
		input = append(input,
			map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": t[0]}}},
			map[string]any{"type": "function_call", "name": "tool_1", "arguments": t[1], "call_id": id},
			map[string]any{"type": "function_call_output", "call_id": id, "output": t[2]},
			map[string]any{"type": "message", "role": "assistant", "id": fmt.Sprintf("msg_%d", i), "status": "completed",
				"content": []any{map[string]any{"type": "output_text", "text": t[3], "annotations": []any{}}}})
	}
	var ts []any
	for _, t := range tools {
		ts = append(ts, map[string]any{"type": "function", "name": t["name"], "description": t["description"], "parameters": t["schema"], "strict": false})
	}
	body, err := json.Marshal(map[string]any{"model": "qwen3", "instructions": instructions, "input": input, "tools": ts,
		"tool_choice": "auto", "parallel_tool_calls": false, "reasoning": map[string]any{"effort": "medium"},
		"store": false, "stream": true, "max_output_tokens": 4096})
	if err != nil {
		b.Fatal(err)
	}
	return body
}

// anthropicBenchBody returns a Messages request of about tokens tokens as
// Claude Code sends one: a system prompt, tool uses and their results.
func anthropicBenchBody(b *testing.B, tokens int) []byte {
	instructions, turns, tools := agentTurns(tokens)
	var msgs []any
	for i, t := range turns {
		id := fmt.Sprintf("toolu_%d", i)
		var input map[string]any
		if err := json.Unmarshal([]byte(t[1]), &input); err != nil {
			b.Fatal(err)
		}
		msgs = append(msgs,
			map[string]any{"role": "user", "content": t[0]},
			map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "tool_use", "id": id, "name": "tool_1", "input": input}}},
			map[string]any{"role": "user", "content": []any{map[string]any{"type": "tool_result", "tool_use_id": id, "content": t[2]}}},
			map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "text", "text": t[3]}}})
	}
	var ts []any
	for _, t := range tools {
		ts = append(ts, map[string]any{"name": t["name"], "description": t["description"], "input_schema": t["schema"]})
	}
	body, err := json.Marshal(map[string]any{"model": "qwen3", "system": []any{map[string]any{"type": "text", "text": instructions}},
		"messages": msgs, "tools": ts, "max_tokens": 4096, "stream": true})
	if err != nil {
		b.Fatal(err)
	}
	return body
}

// BenchmarkChatFromResponses measures the conversion of an agent's
// Responses request, which the gateway makes for each such request it
// routes by its prompt.
func BenchmarkChatFromResponses(b *testing.B) {
	benchConversion(b, responsesBenchBody, ChatFromResponses)
}

// BenchmarkChatFromAnthropic measures the conversion of an agent's
// Messages request, as BenchmarkChatFromResponses does a Responses one's.
func BenchmarkChatFromAnthropic(b *testing.B) {
	benchConversion(b, anthropicBenchBody, ChatFromAnthropic)
}

// benchConversion measures convert on the body of each of benchSizes.
func benchConversion(b *testing.B, body func(*testing.B, int) []byte, convert func([]byte) (*ChatRequest, error)) {
	for _, tokens := range benchSizes {
		body := body(b, tokens)
		b.Run(fmt.Sprintf("tokens=%d", tokens), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := convert(body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
