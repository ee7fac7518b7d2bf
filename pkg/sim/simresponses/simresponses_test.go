package simresponses

import (
	"errors"
	"testing"

	"github.com/kvgate/kvgate/pkg/sim/simserver"
)

func TestConvertTellsUnsupportedBodiesFromRefusedOnes(t *testing.T) {
	for _, c := range []struct {
		name, body         string
		fails, unsupported bool
	}{
		{name: "instructions and a string input", body: `{"model":"m","instructions":"Be brief.","input":"hi"}`},
		{name: "no input", body: `{"model":"m"}`, fails: true},
		{name: "an image", body: `{"model":"m","input":[{"role":"user","content":[` +
			`{"type":"input_image","image_url":"https://example.com/cat.png"}]}]}`, fails: true, unsupported: true},
	} {
		chat, err := Convert([]byte(c.body))
		switch {
		case c.fails != (err != nil) || c.unsupported != errors.Is(err, simserver.ErrResponsesUnsupported):
			t.Errorf("%s: %v", c.name, err)
		case err == nil && len(chat.Messages) == 0:
			t.Errorf("%s: converted into %+v", c.name, chat)
		}
	}
}

func TestConvertGivesReasoningEffortAsTheChats(t *testing.T) {
	chat, err := Convert([]byte(`{"model":"m","input":"hi","reasoning":{"effort":"none"}}`))
	if err != nil || chat.ReasoningEffort != "none" {
		t.Errorf("converted into %+v, %v; want reasoning effort none", chat, err)
	}
}
