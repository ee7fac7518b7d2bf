// Package tokenizer computes the token ids a vLLM engine will compute for a
// request: in process, from the model's own tokenizer files once the engine
// agreed with them, or by asking the engine's own tokenizer, POST /tokenize
// on a pod serving the model.
//
// The prefix index keys KV-cache blocks by the engine's token ids, so only
// those ids can be matched against it: ids from any other tokenizer would
// produce confident wrong matches. When tokenization fails the request
// should be routed on load alone; every error is an *Error whose Reason
// says why, for counting.
//
// # Requests
//
// TokenizeCompletion sends vLLM's completion form ({"model", "prompt",
// "add_special_tokens"}) and TokenizeChat its chat form, which renders the
// messages with the model's chat template exactly as /v1/chat/completions
// does. Their request types carry the fields of the OpenAI bodies that
// change the result, under the bodies' JSON names, with vLLM's defaults for
// those absent. The package imports no Kubernetes types: the caller picks a
// ready pod of the model and passes its base URL.
//
// # Anthropic Messages
//
// vLLM also serves Anthropic's Messages API (/v1/messages and
// /v1/messages/count_tokens) by converting each body into an OpenAI chat
// request and rendering that. ChatFromAnthropic and
// ChatFromAnthropicCountTokens make the same conversion, current vLLM's, so
// that TokenizeChat gives such a request the ids of the prompt vLLM
// renders for it: the system blocks joined, tool_use blocks as tool calls
// whose arguments are Python's json.dumps of the input byte for byte,
// tool_result blocks as tool messages, thinking as the assistant's
// reasoning, tools as OpenAI function tools, output_config.effort as
// reasoning_effort. What vLLM renders in a way that cannot be reproduced
// exactly (images, a tool_use block without an id, which vLLM names after
// the current time, system messages inside messages, JSON values Python
// reads unlike Go) fails with ReasonUnsupported, and a body vLLM refuses
// with ReasonInput: a wrong prompt would credit pods with blocks they do
// not hold, so such requests are best routed on load alone. The
// conversion reads the body once and is bounded by it: its result is at
// most five times larger, and free-form values (tool inputs, input
// schemas, chat_template_kwargs) nested deeper than 100 are refused.
//
// # OpenAI Responses
//
// vLLM serves OpenAI's Responses API (/v1/responses) for models it renders
// with their chat template (all but gpt-oss) by converting the body's
// instructions, input items and tools into chat messages and tools.
// ChatFromResponses makes the same conversion, current vLLM's: the
// instructions as a leading system message, input messages as they are,
// an assistant message as its first part's text, reasoning items as the
// assistant's reasoning and function calls as its tool calls (merged into
// the preceding assistant message as vLLM merges them, namespaced names
// flattened), function call outputs as tool messages, function and
// namespace tools as OpenAI function tools, chat_template_kwargs and
// reasoning.effort as a chat's, and a last item in progress continued. A
// request that continues a conversation the engine holds
// (previous_response_id and the like), or holds images, files, audio,
// tool search or items of other types, fails with ReasonUnsupported, and
// a body vLLM refuses (encrypted reasoning, a missing model or input)
// with ReasonInput. The conversion reads the body once; its result is at
// most five times larger, namespaces whose names repeated in each of
// their functions would make it larger are refused, and function
// parameters nested deeper than 100 are refused.
//
// # Cache
//
// Results, in process or from the engine, are cached in an LRU cache
// bounded in bytes (Config.CacheMaxTokens times 4): each result is charged
// 4 bytes per id and 192 bytes for the entry and its share of the map,
// what they take at most, so that many short results cannot hold more
// memory than the bound says. The key is a 128-bit digest of the form,
// the model and the fields that change the result, not the text itself,
// so that a long prompt is not held twice. A hit costs the digest and a
// map lookup and allocates nothing; the returned slice is shared and must
// not be modified. Concurrent identical misses share one call. Failed
// calls are not cached. The engine's reply is decoded by hand, without
// reflection.
//
// # In-process tokenization
//
// With Config.LocalDir, a model whose Hugging Face tokenizer files are in
// LocalDir/<model> is tokenized in process by package hf: its
// tokenizer.json, and the chat template of tokenizer_config.json or
// chat_template.jinja for chats, rendered with the messages prepared as
// vLLM prepares them. The files are loaded and checked by New. They are
// used for a form (completion, chat) only once the engine agreed with
// them: the first request for the model names a ready pod, and in the
// background every sample prompt of the form (white space, numbers,
// Unicode, emoji, code, special tokens written in text; chats with a system
// prompt and several turns) is tokenized both ways; the engine tokenizes
// meanwhile. Config.VerifyFraction of the prompts tokenized in process
// afterwards are compared too, off the request path. Any difference is
// counted (kvgate_tokenizer_mismatches_total{model,form}), logged at most
// once a minute with where the ids part, shown by LocalModels, and sends
// that model's form back to the engine for good. An engine that cannot be
// reached leaves the model unverified, to be tried again 30 seconds later;
// one that refuses a sample sends the form back to the engine. A request
// the files cannot render (content other than text, a chat_template of its
// own, multimodal settings, a JSON number that is not an int64 integer,
// which templates would print unlike Python) or could render unlike vLLM
// (white space Python strips and the template engine here does not, an
// assistant's reasoning while the engine's way of passing it is not known;
// see package hf) is tokenized by the engine.
//
// vLLM's versions pass an assistant message's reasoning to the chat
// template differently: recent ones its reasoning as both reasoning and
// reasoning_content (its reasoning_content dropped), earlier ones its
// reasoning_content as it is. When the model's template mentions
// reasoning, the chat form's verification therefore asks the engine too:
// probe chats carrying only reasoning, then only reasoning_content, on an
// assistant message (its last message; one calling a tool whose result
// follows; an earlier turn) are tokenized by the engine and rendered here
// with the member under each set of names (none, reasoning,
// reasoning_content, both). The names that give the engine's ids on every
// probe are adopted (vLLM's conventions first, among names that render
// every probe alike), shown by LocalModels (Reasoning) and logged, and
// chats carrying reasoning are then tokenized in process and compared on
// a share of the traffic as any other. When no names fit, or the engine
// refuses a probe, the way stays unknown until the gateway restarts and
// such chats are tokenized by the engine; when the engine does not answer
// a probe, the chat form's verification is tried again later, as for a
// sample. A template that renders no probe's reasoning (one that drops
// the reasoning of every message but in shapes no probe has, or only with
// a template variable set) leaves every name fitting, and vLLM's recent
// way is taken; the sampled comparisons with the engine watch such a
// choice as any other. Every probe
// is counted in kvgate_tokenizer_reasoning_probes_total{model,result}.
// Config.Reasoning (KVGATE_TOKENIZER_REASONING) may instead set vLLM's
// recent or earlier way for every model, without probing, or leave chats
// carrying reasoning to the engines.
//
// The work of one request in process is bounded. Its text, a prompt or a
// chat's JSON and the chat it renders, is at most Config.LocalMaxBytes
// (1 MiB by default, a 128k-token context in any language): a larger
// request fails with ReasonTooLarge and is tokenized by no one, since
// sending megabytes to the engine's /tokenize would cost more than the
// routing it allows; the caller routes it on load alone. A text holding a
// word longer than 2 KiB (hf.MaxWordBytes), such as a long run of letters,
// goes to the engine without being merged: the merges of one word cost
// more per byte the longer it is. The text is tokenized on the caller's
// goroutine, which looks at the request's context every 16 KiB of text and
// stops once it ended; callers that shared that tokenization tokenize the
// prompt again themselves. Each is counted in
// kvgate_tokenizer_local_fallbacks_total, with reason too_large or
// long_word.
//
// # Prefix reuse
//
// A chat the engine must tokenize whose first k messages were tokenized
// before, with the same other fields, is answered at once with those ids,
// the ids of its longest such prefix, while the whole chat is tokenized in
// the background (at most Config.MaxBackgroundCalls such calls at once;
// beyond it the chat waits) so that the next turn finds it. A follow-up
// turn extends the conversation it follows, so on the request path it
// costs no engine call. The cache keys chain the messages one by one,
// which makes the key of a prefix the key its own request had. Only the
// prefixes that leave out at most the chat's last 64 messages are looked
// up, in one hold of the cache's lock, so that a chat of millions of
// messages costs no more lookups than a turn.
//
// The ids of a prefix never make a router pick a pod with confidence that
// it does not deserve. The prefix index keys a block by a hash chained
// over every token before it, so matching a sequence of ids credits a pod
// only with blocks whose whole history it holds. The prefix's ids are the
// engine's own for the earlier turns: wherever the new prompt repeats them
// (the earlier turns rendered alike, which chat templates do), the blocks
// matched are blocks the pod really holds for this prompt. Where it does
// not (a template that renders the last turns differently, such as one
// that drops earlier reasoning), the first differing token only breaks the
// chain from its block on: the match stops early, and the pods look
// colder than they are, never warmer. The uncached tail of the prompt is
// left out, and it is work no pod holds: the same cost on every
// candidate, which does not change the ranking, only the load the router
// counts for the request.
//
// # Truncation
//
// vLLM truncates a tokenized prompt when the request sets
// truncate_prompt_tokens, and the engine's blocks then start where the
// kept tokens start. The request types carry the truncation fields, and
// the ids returned are the ones vLLM keeps: the last truncate_prompt_tokens
// ids, or the first ones with truncation_side "right"; -1 keeps the model's
// context length minus the request's max_tokens (max_completion_tokens
// first for chat, 16 when absent for completions), as current vLLM does.
// Truncation is applied to the cached ids, so truncated and whole requests
// for one prompt share a cache entry.
//
// # Metrics
//
// New registers these metrics:
//
//	kvgate_tokenizer_calls_total{result}       /tokenize calls: ok, timeout, canceled, connection, status, bad_body
//	kvgate_tokenizer_call_duration_seconds     duration of the calls
//	kvgate_tokenizer_cache_hits_total          tokenizations served from the cache
//	kvgate_tokenizer_cache_misses_total        tokenizations not in the cache
//	kvgate_tokenizer_cache_evictions_total     tokenizations evicted to stay within the budget
//	kvgate_tokenizer_cache_tokens              token ids held by the cache
//	kvgate_tokenizer_cache_bytes               bytes charged against the cache's budget
//	kvgate_tokenizer_cache_entries             tokenizations held by the cache
//	kvgate_tokenizer_cache_partial_hits_total  chats answered from a message prefix
//	kvgate_tokenizer_background_dropped_total  chats that waited: no background slot free
//	kvgate_tokenizer_local_tokenizations_total{form}         prompts tokenized in process
//	kvgate_tokenizer_local_fallbacks_total{reason}           prompts of models with files not tokenized in process
//	kvgate_tokenizer_local_forms{state}                      models' forms by state: active, unverified, ...
//	kvgate_tokenizer_verifications_total{model,form,result}  comparisons with the engine: match, mismatch, error, skipped
//	kvgate_tokenizer_mismatches_total{model,form}            prompts the engine tokenized differently
package tokenizer
