// Package tokenizer computes the token ids a vLLM engine will compute for a
// request, by asking the engine's own tokenizer: POST /tokenize on a pod
// serving the model.
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
// # Cache
//
// Results are cached in an LRU cache bounded by the total number of token
// ids it holds. The key is a 128-bit digest of the form, the model and the
// fields that change the result, not the text itself, so that a long prompt
// is not held twice. A hit costs the digest and a map lookup and allocates
// nothing; the returned slice is shared and must not be modified.
// Concurrent identical misses share one call. Failed calls are not cached.
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
//	kvgate_tokenizer_cache_entries             tokenizations held by the cache
package tokenizer
