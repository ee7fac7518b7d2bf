package hf

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
)

// ErrNoChatTemplate is returned for a chat when the tokenizer files hold no
// chat template.
var ErrNoChatTemplate = errors.New("the tokenizer files hold no chat template")

// Chat is a chat request to render with the model's chat template, in the
// JSON of an OpenAI chat request. Absent or null values are left out.
type Chat struct {
	// Messages is the conversation, a JSON array of messages.
	Messages json.RawMessage
	// Tools and Documents are JSON arrays the template may render.
	Tools, Documents json.RawMessage
	// TemplateKwargs is a JSON object of extra template variables.
	TemplateKwargs json.RawMessage
	// AddGenerationPrompt ends the prompt with the opening of the
	// assistant's answer; ContinueFinalMessage ends it with the last
	// message, left open.
	AddGenerationPrompt, ContinueFinalMessage bool
	// Reasoning is how the engine passes an assistant message's
	// reasoning to the template. When it is not Known and the template
	// mentions reasoning, an assistant message carrying a reasoning or
	// reasoning_content that is not null fails with ErrEngineRenders.
	Reasoning ReasoningPassing
}

// ReasoningKeys is a set of the names under which a chat template sees an
// assistant message's reasoning.
type ReasoningKeys uint8

const (
	// KeyReasoning is the message's reasoning.
	KeyReasoning ReasoningKeys = 1 << iota
	// KeyReasoningContent is the message's reasoning_content.
	KeyReasoningContent
)

// ReasoningPassing is how an engine passes the reasoning of an assistant
// message to the chat template, which vLLM's versions do differently:
// earlier ones pass the message's reasoning_content as it is
// (VLLMReasoningContent); later ones pass its reasoning as both reasoning
// and reasoning_content, and drop its reasoning_content (VLLMReasoning).
// The zero value knows neither.
type ReasoningPassing struct {
	// Known tells that Reasoning and ReasoningContent hold.
	Known bool
	// Reasoning and ReasoningContent are the keys under which the
	// template sees a message's reasoning and reasoning_content members;
	// none drops the member. A message carrying both, not null, whose
	// keys overlap fails with ErrEngineRenders: which one the template
	// sees is not known.
	Reasoning, ReasoningContent ReasoningKeys
}

var (
	// VLLMReasoning is how recent vLLM versions pass reasoning.
	VLLMReasoning = ReasoningPassing{Known: true, Reasoning: KeyReasoning | KeyReasoningContent}
	// VLLMReasoningContent is how earlier vLLM versions pass it.
	VLLMReasoningContent = ReasoningPassing{Known: true, ReasoningContent: KeyReasoningContent}
)

// String names p as the configuration and the metrics do: "reasoning"
// (VLLMReasoning), "reasoning_content" (VLLMReasoningContent), "none"
// (both dropped), "unknown", or the keys of each member otherwise.
func (p ReasoningPassing) String() string {
	switch {
	case !p.Known:
		return "unknown"
	case p == VLLMReasoning:
		return "reasoning"
	case p == VLLMReasoningContent:
		return "reasoning_content"
	case p.Reasoning == 0 && p.ReasoningContent == 0:
		return "none"
	}
	return "reasoning as " + p.Reasoning.String() + ", reasoning_content as " + p.ReasoningContent.String()
}

// String lists the keys of k, "nothing" for none.
func (k ReasoningKeys) String() string {
	switch k {
	case 0:
		return "nothing"
	case KeyReasoning:
		return "reasoning"
	case KeyReasoningContent:
		return "reasoning_content"
	}
	return "reasoning and reasoning_content"
}

// configJSON is what Parse reads of tokenizer_config.json.
type configJSON struct {
	ChatTemplate json.RawMessage `json:"chat_template"`
	BOS          json.RawMessage `json:"bos_token"`
	EOS          json.RawMessage `json:"eos_token"`
	UNK          json.RawMessage `json:"unk_token"`
	PAD          json.RawMessage `json:"pad_token"`
}

// parseConfig compiles the chat template and records the special tokens
// it reads.
func (t *Tokenizer) parseConfig(config []byte, template string) error {
	var c configJSON
	if len(config) > 0 {
		if err := json.Unmarshal(config, &c); err != nil {
			return fmt.Errorf("%s: %w", ConfigFile, err)
		}
	}
	t.specials = map[string]jinja.Value{}
	for name, raw := range map[string]json.RawMessage{"bos_token": c.BOS, "eos_token": c.EOS, "unk_token": c.UNK, "pad_token": c.PAD} {
		if s, ok := tokenContent(raw); ok {
			t.specials[name] = jinja.NewString(s)
		}
	}
	if template == "" && present(c.ChatTemplate) {
		var err error
		if template, err = chooseTemplate(c.ChatTemplate); err != nil {
			return fmt.Errorf("%s: chat_template: %w", ConfigFile, err)
		}
	}
	if template == "" {
		return nil
	}
	tmpl, err := jinja.Compile(template)
	if err != nil {
		return fmt.Errorf("chat template: %w", err)
	}
	t.template, t.reads = tmpl, readsOf(template)
	return nil
}

// templateReads tells which of the values and string methods that could
// make a rendering here differ from vLLM's a chat template's source
// mentions. Each is judged from the source text, erring towards yes.
type templateReads struct {
	// reasoning: the source mentions reasoning, so it may read a
	// message's reasoning or reasoning_content.
	reasoning bool
	// strip: the trim filter, or strip() or split() without arguments,
	// which Python applies to U+001C to U+001F as well.
	strip bool
	// sideStrip: lstrip() or rstrip() without arguments, which Python
	// applies to all Unicode white space, and the template engine here
	// only to space, tab, newline and carriage return.
	sideStrip bool
}

var (
	stripCall     = regexp.MustCompile(`\btrim\b|\b(?:strip|split)\(\s*\)`)
	sideStripCall = regexp.MustCompile(`\b[lr]strip\(\s*\)`)
)

// readsOf judges a chat template's source (see templateReads).
func readsOf(template string) templateReads {
	return templateReads{
		reasoning: strings.Contains(template, "reasoning"),
		strip:     stripCall.MatchString(template),
		sideStrip: sideStripCall.MatchString(template),
	}
}

// tokenContent reads a special token given as a string or as an added
// token object.
func tokenContent(raw json.RawMessage) (string, bool) {
	if !present(raw) {
		return "", false
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, true
	}
	var obj struct {
		Content string `json:"content"`
	}
	if json.Unmarshal(raw, &obj) == nil {
		return obj.Content, true
	}
	return "", false
}

// chooseTemplate returns a chat_template given as a string, or the one
// named "default" of a list of named templates.
func chooseTemplate(raw json.RawMessage) (string, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return "", errors.New("neither a string nor a list of named templates")
	}
	for _, n := range named {
		if n.Name == "default" {
			return n.Template, nil
		}
	}
	return "", errors.New("no template is named default")
}

// HasChatTemplate reports whether the files held a chat template.
func (t *Tokenizer) HasChatTemplate() bool { return t.template != nil }

// MentionsReasoning reports whether the chat template's source mentions
// reasoning, so that how the engine passes an assistant message's
// reasoning (Chat.Reasoning) may change its rendering. A template that
// does not renders every chat alike whatever Chat.Reasoning says.
func (t *Tokenizer) MentionsReasoning() bool { return t.template != nil && t.reads.reasoning }

// RenderChat renders c with the chat template as vLLM's chat endpoints
// do: message contents given as lists of text parts are joined with
// newlines, assistant tool calls are passed as vLLM passes them (see
// decodeArguments; an empty list of tool calls is left out), tools as
// vLLM dumps them (see toolsValue), and the template sees the special
// tokens of tokenizer_config (bos_token, eos_token, ...), tools,
// documents, add_generation_prompt and the extra variables. It fails on a
// message with content other than text, on invalid JSON, on a number that
// is not an int64 integer (ErrInexactNumber), on tool calls or tools vLLM
// would refuse or not render alike in all its versions, and with
// ErrEngineRenders on chats that vLLM versions or Python would render
// differently from the template here (see templateReads); and when the
// template fails.
func (t *Tokenizer) RenderChat(c Chat) (string, error) {
	if t.template == nil {
		return "", ErrNoChatTemplate
	}
	passing := c.Reasoning
	if !t.reads.reasoning {
		// A template that never mentions reasoning renders alike
		// whatever the engine passes.
		passing = ReasoningPassing{Known: true}
	}
	msgs, final, err := chatMessages(c.Messages, passing)
	if err != nil {
		return "", err
	}
	vars := make(map[string]jinja.Value, len(t.specials)+8)
	for k, v := range t.specials {
		vars[k] = v
	}
	if present(c.TemplateKwargs) {
		kw, err := templateValue(c.TemplateKwargs)
		if err != nil {
			return "", fmt.Errorf("chat_template_kwargs: %w", err)
		}
		if !kw.IsDict() {
			return "", errors.New("chat_template_kwargs is not a JSON object")
		}
		d := kw.AsDict()
		for _, k := range d.OrderedKeys() {
			vars[k], _ = d.Get(k)
		}
	}
	vars["messages"] = msgs
	vars["tools"] = jinja.None()
	if present(c.Tools) {
		if vars["tools"], err = toolsValue(c.Tools); err != nil {
			return "", fmt.Errorf("tools: %w", err)
		}
	}
	if present(c.Documents) {
		if vars["documents"], err = templateValue(c.Documents); err != nil {
			return "", fmt.Errorf("documents: %w", err)
		}
	}
	if err := t.checkStrips(vars); err != nil {
		return "", err
	}
	vars["add_generation_prompt"] = jinja.NewBool(c.AddGenerationPrompt && !c.ContinueFinalMessage)
	out, err := t.template.RenderValues(vars)
	if err != nil {
		return "", fmt.Errorf("chat template: %w", err)
	}
	if c.ContinueFinalMessage {
		return continueFinal(out, final)
	}
	return out, nil
}

// EncodeChat renders c and encodes the result; addSpecialTokens is vLLM's
// add_special_tokens for chats, false by default since templates write
// their own.
func (t *Tokenizer) EncodeChat(c Chat, addSpecialTokens bool) ([]uint32, error) {
	text, err := t.RenderChat(c)
	if err != nil {
		return nil, err
	}
	return t.Encode(text, addSpecialTokens), nil
}

// continueFinal cuts rendered after the final message's content, as
// transformers' apply_chat_template does for continue_final_message: at
// the last occurrence of the content stripped of white space, it keeps the
// content's trailing white space only when the rendered chat holds the
// whole content, unchanged, there.
func continueFinal(rendered, final string) (string, error) {
	trimmed := strings.TrimFunc(final, pythonSpace)
	loc := strings.LastIndex(rendered, trimmed)
	if loc < 0 {
		return "", errors.New("continue_final_message: the final message does not appear in the rendered chat")
	}
	if lead := strings.TrimLeftFunc(final, pythonSpace); lead == final && strings.HasPrefix(rendered[loc:], final) {
		return rendered[:loc+len(final)], nil
	}
	return rendered[:loc+len(trimmed)], nil
}

// pythonSpace reports whether Python's str.strip() removes r: Unicode
// white space and the separators U+001C to U+001F.
func pythonSpace(r rune) bool {
	return unicode.IsSpace(r) || r >= 0x1c && r <= 0x1f
}

// ErrEngineRenders is the error of RenderChat for a chat that vLLM, in
// some of its versions, or Python's string methods would render otherwise
// than the template here: the engine renders it.
var ErrEngineRenders = errors.New("vLLM could render this chat otherwise; the engine renders it")

// checkStrips fails with ErrEngineRenders when a string the template sees
// holds white space its strip methods treat unlike Python's: U+001C to
// U+001F where it trims or strips, any white space but space, tab,
// newline and carriage return where it calls lstrip() or rstrip().
func (t *Tokenizer) checkStrips(vars map[string]jinja.Value) error {
	if !t.reads.strip && !t.reads.sideStrip {
		return nil
	}
	for _, v := range vars {
		if holdsSpace(v, t.reads.sideStrip) {
			return fmt.Errorf("%w: a string holds white space the template strips unlike Python", ErrEngineRenders)
		}
	}
	return nil
}

// holdsSpace reports whether a string of v, a key of its dicts included,
// holds one of U+001C to U+001F, which Python's strip() and split() take
// for white space and the template engine's do not, or with side any
// white space Python's lstrip() and rstrip() remove and the template
// engine's do not (all but space, tab, newline and carriage return).
func holdsSpace(v jinja.Value, side bool) bool {
	switch {
	case v.IsString():
		return stringHoldsSpace(v.AsString(), side)
	case v.IsList():
		for _, item := range v.AsList().Items {
			if holdsSpace(item, side) {
				return true
			}
		}
	case v.IsDict():
		d := v.AsDict()
		for _, k := range d.OrderedKeys() {
			if stringHoldsSpace(k, side) {
				return true
			}
			if item, _ := d.Get(k); holdsSpace(item, side) {
				return true
			}
		}
	}
	return false
}

// stringHoldsSpace is holdsSpace for one string. U+001C to U+001F,
// vertical tab and form feed are single bytes that no multi-byte sequence
// contains.
func stringHoldsSpace(s string, side bool) bool {
	for c := byte(0x1c); c <= 0x1f; c++ {
		if strings.IndexByte(s, c) >= 0 {
			return true
		}
	}
	if !side {
		return false
	}
	if strings.IndexByte(s, '\v') >= 0 || strings.IndexByte(s, '\f') >= 0 {
		return true
	}
	for _, r := range s {
		if r >= utf8.RuneSelf && unicode.IsSpace(r) {
			return true
		}
	}
	return false
}

// toolsValue returns the tools as vLLM hands them to templates: each
// validated as its ChatCompletionToolsParam and dumped by pydantic, so
// type ("function" when absent) comes first, then function with name,
// description and parameters (null when absent), then the keys vLLM does
// not know, in the request's order, inside function and after it. It
// fails on what vLLM refuses: tools that are not a list of objects, a
// type other than "function", a function that is not an object, a name
// that is not a string, a description that is not a string or null,
// parameters that are not an object or null.
func toolsValue(raw json.RawMessage) (jinja.Value, error) {
	v, err := templateValue(raw)
	if err != nil {
		return v, err
	}
	if !v.IsList() {
		return v, errors.New("not a JSON array")
	}
	items := v.AsList().Items
	out := make([]jinja.Value, len(items))
	for i, item := range items {
		if out[i], err = toolValue(item); err != nil {
			return v, fmt.Errorf("tools[%d]: %w", i, err)
		}
	}
	return jinja.NewList(out), nil
}

// toolValue dumps one tool as toolsValue does.
func toolValue(tool jinja.Value) (jinja.Value, error) {
	if !tool.IsDict() {
		return tool, errors.New("not an object")
	}
	in := tool.AsDict()
	if typ, ok := in.Get("type"); ok && (!typ.IsString() || typ.AsString() != "function") {
		return tool, errors.New(`type is not "function"`)
	}
	fn, ok := in.Get("function")
	if !ok || !fn.IsDict() {
		return tool, errors.New("function is not an object")
	}
	f := fn.AsDict()
	name, _ := f.Get("name")
	if !name.IsString() {
		return tool, errors.New("function name is not a string")
	}
	dumped := jinja.NewDict()
	d := dumped.AsDict()
	d.Set("name", name)
	for _, field := range []struct {
		key string
		ok  func(jinja.Value) bool
	}{{"description", jinja.Value.IsString}, {"parameters", jinja.Value.IsDict}} {
		v, given := f.Get(field.key)
		switch {
		case !given || v.IsNone():
			v = jinja.None()
		case !field.ok(v):
			return tool, fmt.Errorf("function %s has the wrong type", field.key)
		}
		d.Set(field.key, v)
	}
	for _, k := range f.OrderedKeys() {
		if k != "name" && k != "description" && k != "parameters" {
			v, _ := f.Get(k)
			d.Set(k, v)
		}
	}
	out := jinja.NewDict()
	o := out.AsDict()
	o.Set("type", jinja.NewString("function"))
	o.Set("function", dumped)
	for _, k := range in.OrderedKeys() {
		if k != "type" && k != "function" {
			v, _ := in.Get(k)
			o.Set(k, v)
		}
	}
	return out, nil
}

// chatMessages converts the messages as vLLM does before rendering, and
// returns the text of the last one. An assistant message's reasoning is
// passed as reasoning says (see chatMessage).
func chatMessages(raw json.RawMessage, reasoning ReasoningPassing) (jinja.Value, string, error) {
	v, err := templateValue(raw)
	if err != nil {
		return jinja.Value{}, "", fmt.Errorf("messages: %w", err)
	}
	if !v.IsList() {
		return jinja.Value{}, "", errors.New("messages is not a JSON array")
	}
	items := v.AsList().Items
	out := make([]jinja.Value, len(items))
	final := ""
	for i, m := range items {
		if !m.IsDict() {
			return jinja.Value{}, "", fmt.Errorf("messages[%d] is not an object", i)
		}
		msg, text, err := chatMessage(m.AsDict(), reasoning)
		if err != nil {
			return jinja.Value{}, "", fmt.Errorf("messages[%d]: %w", i, err)
		}
		out[i], final = msg, text
	}
	return jinja.NewList(out), final, nil
}

// chatMessage builds the message the template sees: role, content as a
// string, tool_calls, an assistant's reasoning under the keys reasoning
// gives, and tool_call_id and name when present. When reasoning is not
// known, an assistant message with a reasoning or reasoning_content that
// is not null fails with ErrEngineRenders.
func chatMessage(m *jinja.Dict, reasoning ReasoningPassing) (jinja.Value, string, error) {
	out := jinja.NewDict()
	d := out.AsDict()
	role, _ := m.Get("role")
	if !role.IsString() {
		return out, "", errors.New("role is not a string")
	}
	d.Set("role", role)
	content, _ := m.Get("content")
	text, err := contentText(content)
	if err != nil {
		return out, "", err
	}
	d.Set("content", jinja.NewString(text))
	if calls, ok := m.Get("tool_calls"); ok && role.AsString() == "assistant" && !calls.IsNone() {
		if !calls.IsList() {
			return out, "", errors.New("tool_calls is not a list")
		}
		for i, c := range calls.AsList().Items {
			if err := decodeArguments(c); err != nil {
				return out, "", fmt.Errorf("tool_calls[%d]: %w", i, err)
			}
		}
		// vLLM drops an empty list, so that templates take the path of an
		// assistant message without tool calls.
		if calls.AsList().Len() > 0 {
			d.Set("tool_calls", calls)
		}
	}
	if role.AsString() == "assistant" {
		if err := passReasoning(m, d, reasoning); err != nil {
			return out, "", err
		}
	}
	if id, ok := m.Get("tool_call_id"); ok && role.AsString() == "tool" {
		d.Set("tool_call_id", id)
	}
	if name, ok := m.Get("name"); ok && name.IsString() {
		d.Set("name", name)
	}
	return out, text, nil
}

// passReasoning sets on out, the message the template sees, the reasoning
// and reasoning_content members of the assistant message m under the keys
// p gives them.
func passReasoning(m, out *jinja.Dict, p ReasoningPassing) error {
	if p.Known && p.Reasoning == 0 && p.ReasoningContent == 0 {
		return nil
	}
	members := [2]struct {
		name string
		keys ReasoningKeys
		v    jinja.Value
	}{{name: "reasoning", keys: p.Reasoning}, {name: "reasoning_content", keys: p.ReasoningContent}}
	var seen ReasoningKeys
	for i := range members {
		r := &members[i]
		v, ok := m.Get(r.name)
		if !ok || v.IsNone() {
			continue
		}
		if !p.Known {
			return fmt.Errorf("%w: an assistant message carries %s, which vLLM versions pass to templates differently", ErrEngineRenders, r.name)
		}
		if r.keys == 0 {
			continue
		}
		if !v.IsString() {
			return fmt.Errorf("%s is not a string", r.name)
		}
		if seen&r.keys != 0 {
			return fmt.Errorf("%w: an assistant message carries both reasoning and reasoning_content, which the template sees under one name", ErrEngineRenders)
		}
		seen |= r.keys
		r.v = v
	}
	for _, key := range []struct {
		name string
		k    ReasoningKeys
	}{{"reasoning", KeyReasoning}, {"reasoning_content", KeyReasoningContent}} {
		for _, r := range members {
			if r.keys&key.k != 0 && r.v.IsString() {
				out.Set(key.name, r.v)
			}
		}
	}
	return nil
}

// contentText returns a message's content as one string: the string
// itself, or its text parts joined with newlines.
func contentText(content jinja.Value) (string, error) {
	switch {
	case content.IsUndefined() || content.IsNone():
		return "", nil
	case content.IsString():
		return content.AsString(), nil
	case content.IsList():
		var texts []string
		for i, p := range content.AsList().Items {
			if !p.IsDict() {
				return "", fmt.Errorf("content[%d] is not an object", i)
			}
			typ, _ := p.AsDict().Get("type")
			text, _ := p.AsDict().Get("text")
			if !typ.IsString() || typ.AsString() != "text" || !text.IsString() {
				return "", fmt.Errorf("content[%d] is not a text part", i)
			}
			texts = append(texts, text.AsString())
		}
		return strings.Join(texts, "\n"), nil
	}
	return "", errors.New("content is neither a string nor a list of parts")
}

// decodeArguments gives a tool call's function arguments the value vLLM
// passes to templates: absent, null, empty or otherwise false arguments
// become an empty object, a JSON string holding an object becomes that
// object, and an object stays as it is. It fails on what vLLM versions
// disagree on or refuse, so that the engine renders such a chat itself: a
// call that is not an object, a function that is absent or not an object,
// a type other than "function", and arguments of another kind, including
// a string that is not valid JSON or holds no object.
func decodeArguments(call jinja.Value) error {
	if !call.IsDict() {
		return errors.New("not an object")
	}
	if typ, ok := call.AsDict().Get("type"); ok && (!typ.IsString() || typ.AsString() != "function") {
		return errors.New(`type is not "function"`)
	}
	fn, ok := call.AsDict().Get("function")
	if !ok || !fn.IsDict() {
		return errors.New("function is not an object")
	}
	args, _ := fn.AsDict().Get("arguments")
	switch {
	case !args.IsTruthy():
		fn.AsDict().Set("arguments", jinja.NewDict())
	case args.IsDict():
	case args.IsString():
		v, err := templateValue([]byte(args.AsString()))
		if err != nil {
			return fmt.Errorf("function arguments: %w", err)
		}
		if !v.IsDict() {
			return errors.New("function arguments do not hold a JSON object")
		}
		fn.AsDict().Set("arguments", v)
	default:
		return errors.New("function arguments are neither an object nor a JSON string")
	}
	return nil
}
