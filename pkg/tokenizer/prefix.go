package tokenizer

import "errors"

// maxPrefixMessages bounds the message prefixes of a chat that prefix
// looks up: those that leave out at most its last 64 messages. A follow-up
// turn adds a few messages to the conversation it follows, and the bound
// keeps a chat of millions of messages to as many lookups.
const maxPrefixMessages = 64

// prefix answers a chat that the engine must tokenize with the cached ids
// of its longest message prefix, if any, among those that leave out at
// most its last maxPrefixMessages messages, when the request allows it: no
// truncation, since the prefix's ids are not the prompt's head once the
// prompt is truncated. The leader of the whole chat's call then makes it in
// the background, in one of the Config.MaxBackgroundCalls slots, so that
// the next turn finds it cached; with no slot free it makes the call as
// usual and ok is false, so that the caller waits for it.
func (t *Tokenizer) prefix(req *ChatRequest, key digest, cl *call, leader bool, baseURL string) ([]uint32, bool) {
	if !t.prefixReuse || req.TruncatePromptTokens != nil {
		return nil, false
	}
	var buf [maxPrefixMessages]digest
	keys := req.prefixKeys(t.seed, &buf)
	res, ok := t.cache.peekFirst(keys)
	if !ok {
		return nil, false
	}
	ids := res.tokens[:len(res.tokens):len(res.tokens)]
	if leader {
		if !t.tryBackgroundSlot() {
			t.m.backgroundDropped.Inc()
			return nil, false
		}
		// The body is built off the request path, from a copy: the
		// request's buffers go back to the caller.
		own := req.detach()
		if !t.goBackground(func() {
			body, err := own.body()
			if !t.start(key, cl, baseURL, own.Model, body, err, true) {
				t.releaseBackgroundSlot()
			}
		}) {
			t.releaseBackgroundSlot()
			t.cache.complete(key, cl, result{}, &Error{Reason: ReasonCanceled, Model: req.Model, Err: errors.New("tokenizer closed")})
		}
	}
	t.m.partialHits.Inc()
	return ids, true
}
