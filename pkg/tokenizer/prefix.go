package tokenizer

import "errors"

// prefix answers a chat that the engine must tokenize with the cached ids
// of its longest message prefix, if any, when the request allows it: no
// truncation, since the prefix's ids are not the prompt's head once the
// prompt is truncated. The leader of the whole chat's call then makes it in
// the background, in one of the Config.MaxBackgroundCalls slots, so that
// the next turn finds it cached; with no slot free it makes the call as
// usual and ok is false, so that the caller waits for it.
func (t *Tokenizer) prefix(req *ChatRequest, key digest, cl *call, leader bool, baseURL string) ([]uint32, bool) {
	if !t.prefixReuse || req.TruncatePromptTokens != nil {
		return nil, false
	}
	var buf [32]digest
	keys := req.messageKeys(t.seed, buf[:0])
	var ids []uint32
	for k := len(keys) - 2; k >= 0 && ids == nil; k-- {
		if res, ok := t.cache.peek(keys[k]); ok {
			ids = res.tokens[:len(res.tokens):len(res.tokens)]
		}
	}
	if ids == nil {
		return nil, false
	}
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
