// Writes the golden token ids the in-process tokenizer (pkg/tokenizer/hf)
// is tested against: for each model, a corpus of texts encoded and of chat
// requests rendered with the model's chat template and encoded, all by
// Hugging Face's JavaScript tokenizers and Jinja from the model's own
// tokenizer files.
//
// Usage: node golden.mjs OUT_DIR [MODELS_DIR]
//   writes OUT_DIR/<model>.json for every model of MODELS_DIR (default:
//   ./models, as hack/install-tokenizers.sh lays it out).
import { Tokenizer } from "@huggingface/tokenizers";
import { Template } from "@huggingface/jinja";
import fs from "node:fs";
import path from "node:path";

const [outDir, modelsDir = path.join(path.dirname(new URL(import.meta.url).pathname), "models")] = process.argv.slice(2);
if (!outDir) {
  console.error("usage: node golden.mjs OUT_DIR [MODELS_DIR]");
  process.exit(2);
}

// rng is a small deterministic generator, so that the corpus is the same
// on every run.
function rng(seed) {
  let s = seed >>> 0;
  return () => {
    s = (s * 1664525 + 1013904223) >>> 0;
    return s / 4294967296;
  };
}

// longText mixes words, numbers, punctuation, code and non-Latin scripts.
function longText(seed, words) {
  const r = rng(seed);
  const pool = ["the", "cache", "Prefix", "routing", "don't", "we'll", "GPU's", "1234567", "3.14159", "x+y", "==",
    "naïve", "café", "日本語", "тест", "مرحبا", "नमस्ते", "😀", "👩‍💻", "\t", "\n", "  ", "...", "(a, b)", "{\"k\": 1}",
    "snake_case", "camelCase", "https://example.com/a?b=c", "e\u0301", "Ω", "½", "٣"];
  const out = [];
  for (let i = 0; i < words; i++) out.push(pool[Math.floor(r() * pool.length)]);
  return out.join(" ");
}

const texts = [
  "", " ", "a", "Hello world!", "Hello   world!!  ", "  leading and trailing  ",
  "line one\nline two\r\nline three\n\n\n  indented\n\t\ttabs\n",
  "I'm sure you're right; they'll say it's what we'd've done. I'M SURE YOU'RE RIGHT. It'S",
  "numbers: 0 7 42 123 1234 12345 1234567890 3.14159 -17 1,000,000 1e-9 0x1F ²³ ½ ١٢٣ ४२",
  "func main() {\n\tfmt.Println(\"hello\")\n\tfor i := 0; i < 10; i++ {\n\t\tx += i * 2 // comment\n\t}\n}\n",
  "def f(x):\n    return {'a': [1, 2, 3], \"b\": None}  # tail\n\n\nclass C:\n    pass\n",
  "Unicode: café naïve coöperate Ångström ß ﬁ Ǆ Ⅳ ｆｕｌｌｗｉｄｔｈ",
  "Decomposed: e\u0301 a\u0308 o\u0302 n\u0303 and composed: é ä ô ñ",
  "中文字符和日本語のテキスト、한국어 텍스트。Русский текст. Ελληνικά. עברית. العربية. हिन्दी।",
  "Emoji: 😀😃😄 👍🏽 👩‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ ☕ 🧑🏿‍🚀",
  "Special tokens in text: <|im_start|>user\nhi<|im_end|>\n<|endoftext|> <s> </s> <unk> <|begin_of_text|><|eot_id|>",
  "Almost special: <|im_start <|im_end| <| |> < s > <think> </think> <tool_call>",
  "White space: a\u00a0b\u2003c\u3000d\u2028e\u2029f\u0085g\ufeffh\u200bi\u000bj\u000ck",
  "Controls: \u0000\u0001\u001f\u007f end",
  "Punctuation runs: !!! ??? ... --- ___ *** ### @@@ $$$ %%% ^^^ &&& ((( ))) [[[ ]]] {{{ }}} ;;; ::: ''' \"\"\" ```",
  "a".repeat(3000),
  "Supercalifragilisticexpialidocious".repeat(60),
  "9".repeat(1000),
  " ".repeat(500) + "x" + "\n".repeat(200),
  "🙂".repeat(400),
  "x" + "\u0301".repeat(300),
  longText(1, 2000),
  longText(2, 6000),
];

// Chat requests in OpenAI form; the template sees them as vLLM passes
// them (see toTemplateMessages).
const system = { role: "system", content: "You are a careful assistant. Answer briefly." };
const tools = [{
  type: "function",
  function: {
    name: "get_weather", description: "Get the weather of a city",
    parameters: { type: "object", properties: { city: { type: "string", description: "The city" }, unit: { type: "string", enum: ["c", "f"] } }, required: ["city"] },
  },
}];
const turns = [];
for (let i = 0; i < 20; i++) {
  turns.push({ role: "user", content: `Turn ${i}: ` + longText(100 + i, 40) });
  turns.push({ role: "assistant", content: `Answer ${i}: ` + longText(200 + i, 30) });
}
const chats = [
  { name: "one_user_message", request: { messages: [{ role: "user", content: "Hello!" }] } },
  { name: "system_and_user", request: { messages: [system, { role: "user", content: "What is a KV cache?" }] } },
  { name: "multi_turn", request: { messages: [system, ...turns.slice(0, 7)] } },
  { name: "twenty_turns", request: { messages: [system, ...turns.slice(0, 39)] } },
  { name: "no_generation_prompt", request: { messages: [system, ...turns.slice(0, 4)], add_generation_prompt: false } },
  { name: "continue_final_message", request: { messages: [system, { role: "user", content: "Count to three." }, { role: "assistant", content: "One, two," }], add_generation_prompt: false, continue_final_message: true } },
  { name: "continue_final_message_with_trailing_space", request: { messages: [{ role: "user", content: "Count to three." }, { role: "assistant", content: "One, two, " }], add_generation_prompt: false, continue_final_message: true } },
  { name: "content_parts", request: { messages: [{ role: "user", content: [{ type: "text", text: "first part" }, { type: "text", text: "second part" }] }] } },
  { name: "unicode_and_specials", request: { messages: [system, { role: "user", content: texts[11] + "\n" + texts[8] + "\n" + texts[9] }] } },
  { name: "whitespace_edges", request: { messages: [{ role: "user", content: "  padded  \n\n" }, { role: "assistant", content: "\n\nreply\n" }, { role: "user", content: "\tnext" }] } },
  { name: "thinking_disabled", request: { messages: [{ role: "user", content: "Hi" }], chat_template_kwargs: { enable_thinking: false } } },
  { name: "assistant_with_thinking", request: { messages: [{ role: "user", content: "Q1" }, { role: "assistant", content: "<think>\nreasoning\n</think>\n\nA1" }, { role: "user", content: "Q2" }] } },
  { name: "tools", request: { messages: [system, { role: "user", content: "Weather in Paris?" }], tools } },
  {
    name: "tool_call_round_trip", request: {
      tools, messages: [
        { role: "user", content: "Weather in Paris?" },
        { role: "assistant", content: null, tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: "{\"city\": \"Paris\", \"unit\": \"c\"}" } }] },
        { role: "tool", tool_call_id: "call_1", content: "{\"temp\": 21}" },
      ],
    },
  },
  {
    name: "tool_calls_without_arguments", request: {
      tools, messages: [
        { role: "user", content: "Weather here and there?" },
        {
          role: "assistant", content: "", tool_calls: [
            { id: "call_1", type: "function", function: { name: "get_weather", arguments: "" } },
            { id: "call_2", type: "function", function: { name: "get_weather", arguments: null } },
            { id: "call_3", type: "function", function: { name: "get_weather" } },
          ],
        },
        { role: "tool", tool_call_id: "call_1", content: "sunny" },
      ],
    },
  },
  { name: "empty_tool_calls", request: { messages: [{ role: "user", content: "Hi" }, { role: "assistant", content: "Hello", tool_calls: [] }, { role: "user", content: "Bye" }] } },
];

// toTemplateMessages converts messages as vLLM does before rendering:
// content as one string (text parts joined with newlines, null as ""),
// tool call arguments decoded from their JSON strings, absent, null or
// empty arguments as {}, and an empty list of tool calls left out.
function toTemplateMessages(messages) {
  return messages.map((m) => {
    let content = m.content;
    if (content == null) content = "";
    if (Array.isArray(content)) content = content.map((p) => p.text).join("\n");
    const out = { role: m.role, content };
    if (m.role === "assistant" && m.tool_calls && m.tool_calls.length > 0) {
      out.tool_calls = m.tool_calls.map((c) => {
        const args = c.function.arguments;
        return { ...c, function: { ...c.function, arguments: args ? JSON.parse(args) : {} } };
      });
    }
    if (m.role === "tool" && m.tool_call_id !== undefined) out.tool_call_id = m.tool_call_id;
    return out;
  });
}

// pyStrip and pyLstrip strip what Python's str.strip() and str.lstrip()
// do: Unicode white space and U+001C to U+001F (JavaScript's trim differs).
const pySpace = "[\\s\\x1c-\\x1f\\x85]";
const pyStrip = (s) => s.replace(new RegExp(`^(?:(?!\\ufeff)${pySpace})+|(?:(?!\\ufeff)${pySpace})+$`, "gu"), "");
const pyLstrip = (s) => s.replace(new RegExp(`^(?:(?!\\ufeff)${pySpace})+`, "u"), "");

// continueFinal cuts the rendered chat after the final message, as
// transformers' apply_chat_template does for continue_final_message: it
// keeps the message's trailing white space only when the whole message,
// unchanged, follows the last occurrence of the stripped message.
function continueFinal(rendered, final) {
  const trimmed = pyStrip(final);
  const loc = rendered.lastIndexOf(trimmed);
  const lead = pyLstrip(final);
  if (rendered.slice(loc, loc + lead.length) === final) return rendered.slice(0, loc + lead.length);
  return rendered.slice(0, loc + trimmed.length);
}

function tokenContent(v) {
  if (v == null) return undefined;
  return typeof v === "string" ? v : v.content;
}

fs.mkdirSync(outDir, { recursive: true });
for (const model of fs.readdirSync(modelsDir).sort()) {
  const dir = path.join(modelsDir, model);
  const tj = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
  const tc = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
  const tok = new Tokenizer(tj, tc);
  const golden = { model, texts: [], chats: [] };
  for (const text of texts) {
    for (const add_special_tokens of [true, false]) {
      golden.texts.push({ text, add_special_tokens, ids: tok.encode(text, { add_special_tokens }).ids });
    }
  }
  if (tc.chat_template) {
    const template = new Template(tc.chat_template);
    const specials = {};
    for (const name of ["bos_token", "eos_token", "unk_token", "pad_token"]) {
      const v = tokenContent(tc[name]);
      if (v !== undefined) specials[name] = v;
    }
    for (const { name, request } of chats) {
      const continueFinalMessage = request.continue_final_message ?? false;
      const vars = {
        ...specials, ...(request.chat_template_kwargs ?? {}),
        messages: toTemplateMessages(request.messages), tools: request.tools ?? null,
        add_generation_prompt: (request.add_generation_prompt ?? true) && !continueFinalMessage,
      };
      let rendered = template.render(vars);
      if (continueFinalMessage) rendered = continueFinal(rendered, vars.messages.at(-1).content);
      golden.chats.push({ name, request, rendered, ids: tok.encode(rendered, { add_special_tokens: false }).ids });
    }
  }
  fs.writeFileSync(path.join(outDir, `${model}.json`), JSON.stringify(golden) + "\n");
}
