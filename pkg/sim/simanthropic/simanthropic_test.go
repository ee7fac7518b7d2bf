package simanthropic

import (
	"errors"
	"testing"

	"github.com/kvgate/kvgate/pkg/sim/simserver"
)

func TestConvertTellsUnsupportedBodiesFromRefusedOnes(t *testing.T) {
	for _, c := range []struct {
		name, body         string
		countTokens        bool
		fails, unsupported bool
		maxTokens          int
	}{
		{name: "a conversation", body: `{"model":"m","max_tokens":7,"messages":[{"role":"user","content":"hi"}]}`, maxTokens: 7},
		{name: "a token count", body: `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, countTokens: true},
		{name: "no max_tokens", body: `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, fails: true},
		{name: "an image", body: `{"model":"m","max_tokens":7,"messages":[{"role":"user","content":[{"type":"image",` +
			`"source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}}]}]}`, fails: true, unsupported: true},
	} {
		chat, err := Convert([]byte(c.body), c.countTokens)
		switch {
		case c.fails != (err != nil) || c.unsupported != errors.Is(err, simserver.ErrAnthropicUnsupported):
			t.Errorf("%s: %v", c.name, err)
		case err == nil && (chat.Model != "m" || chat.MaxTokens != c.maxTokens || len(chat.Messages) == 0):
			t.Errorf("%s: converted into %+v", c.name, chat)
		}
	}
}

func TestConvertGivesOutputConfigEffortAsTheReasoningEffort(t *testing.T) {
	body := `{"model":"m","max_tokens":7,"output_config":{"effort":"low"},"messages":[{"role":"user","content":"hi"}]}`
	for _, c := range []struct {
		countTokens bool
		want        string
	}{
		{false, "low"},
		{true, ""}, // vLLM's token count reads no output_config
	} {
		chat, err := Convert([]byte(body), c.countTokens)
		if err != nil || chat.ReasoningEffort != c.want {
			t.Errorf("countTokens %v: %+v, %v; want reasoning effort %q", c.countTokens, chat, err, c.want)
		}
	}
}
