package tokenizer

import (
	"encoding/json"
	"strconv"
)

// verifySample is a request the in-process tokenizer and the engine both
// tokenize before the in-process one is used.
type verifySample struct {
	name string
	comp *CompletionRequest
	chat *ChatRequest
}

// run tokenizes s in process and returns the ids with the /tokenize body
// that asks the engine for the same.
func (s verifySample) run(lm *localModel) ([]uint32, []byte, error) {
	if s.comp != nil {
		req := *s.comp
		req.Model = lm.name
		text, _, err := req.prompt()
		if err != nil {
			return nil, nil, err
		}
		var str string
		if err := json.Unmarshal(text, &str); err != nil {
			return nil, nil, err
		}
		body, err := req.body(text)
		return lm.tk.Encode(str, boolOr(req.AddSpecialTokens, true)), body, err
	}
	req := *s.chat
	req.Model = lm.name
	chat, err := req.localChat(lm.reasoningPassing())
	if err != nil {
		return nil, nil, err
	}
	var ids []uint32
	if ids, err = lm.tk.EncodeChat(chat, boolOr(req.AddSpecialTokens, false)); err != nil {
		return nil, nil, err
	}
	body, err := req.body()
	return ids, body, err
}

// sampleTexts exercise what tokenizers get wrong: white space runs, new
// lines, contractions, digits, Unicode normalization, scripts, emoji, code
// and special tokens written in text.
var sampleTexts = []string{
	"Hello world! How are you doing today?",
	"  leading spaces,\ttabs,\n\nblank lines\r\nand trailing   ",
	"I'm sure they'll say it's what we'd've done. DON'T SHOUT",
	"Numbers: 7 42 123 1234 1234567890 3.14159 -17 1,000,000 ½ ١٢٣",
	"Unicode: café naïve e\u0301 Ångström ß ﬁ 日本語のテキスト 한국어 Русский العربية हिन्दी",
	"Emoji: 😀 👍🏽 👩‍👩‍👧‍👦 🇫🇷 ❤️",
	"func main() {\n\tfmt.Println(\"hi\")\n\tfor i := 0; i < 10; i++ {\n\t\tx += i\n\t}\n}\n",
	"Special tokens in text: <|im_start|>user\nhi<|im_end|> <s> </s> <|begin_of_text|><|eot_id|> <|endoftext|>",
}

// verifySamples returns the samples of form.
func verifySamples(form int) []verifySample {
	if form == formIndexCompletion {
		var out []verifySample
		for i, text := range sampleTexts {
			prompt, _ := json.Marshal(text)
			f := false
			out = append(out,
				verifySample{name: "completion " + strconv.Itoa(i), comp: &CompletionRequest{Prompt: prompt}},
				verifySample{name: "completion " + strconv.Itoa(i) + " without special tokens", comp: &CompletionRequest{Prompt: prompt, AddSpecialTokens: &f}})
		}
		return out
	}
	return chatSamples
}

var chatSamples = func() []verifySample {
	msg := func(role, content string) map[string]string {
		return map[string]string{"role": role, "content": content}
	}
	convs := []struct {
		name string
		msgs []map[string]string
	}{
		{"chat user", []map[string]string{msg("user", sampleTexts[0])}},
		{"chat system and user", []map[string]string{msg("system", "You are a helpful assistant."), msg("user", sampleTexts[4])}},
		{"chat turns", []map[string]string{
			msg("system", "Answer briefly."), msg("user", sampleTexts[2]), msg("assistant", sampleTexts[3]),
			msg("user", sampleTexts[6]), msg("assistant", sampleTexts[5]), msg("user", sampleTexts[1]),
		}},
		{"chat special tokens", []map[string]string{msg("user", sampleTexts[7])}},
	}
	var out []verifySample
	for _, c := range convs {
		raw, _ := json.Marshal(c.msgs)
		out = append(out, verifySample{name: c.name, chat: &ChatRequest{Messages: raw}})
	}
	f := false
	raw, _ := json.Marshal(convs[2].msgs)
	out = append(out, verifySample{name: "chat without generation prompt", chat: &ChatRequest{Messages: raw, AddGenerationPrompt: &f}})
	return out
}()
