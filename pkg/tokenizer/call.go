package tokenizer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/kvgate/kvgate/pkg/internal/jsonscan"
)

// tokenizePath is vLLM's tokenization endpoint, relative to a pod's base URL.
const tokenizePath = "/tokenize"

// maxErrorBody is how much of an error response is read for its message.
const maxErrorBody = 4 << 10

// newCallRequest returns the POST of body to baseURL's /tokenize, with the
// engines' API key when one is set.
func (t *Tokenizer) newCallRequest(baseURL string, body []byte) (*http.Request, error) {
	endpoint := strings.TrimRight(baseURL, "/") + tokenizePath
	req, err := http.NewRequest(http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("base URL %q: %w", baseURL, err)
	}
	if req.URL.Scheme != "http" && req.URL.Scheme != "https" || req.URL.Host == "" {
		return nil, fmt.Errorf("base URL %q: want http://host[:port] or https://host[:port]", baseURL)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	if t.authorization != nil {
		req.Header["Authorization"] = t.authorization
	}
	return req, nil
}

// call sends req under the Tokenizer's timeout and decodes vLLM's answer.
// Every error it returns is an *Error.
func (t *Tokenizer) call(req *http.Request, model string) (result, error) {
	ctx, cancel := context.WithTimeout(t.ctx, t.timeout)
	defer cancel()
	start := time.Now()
	res, err := t.exchange(ctx, req.WithContext(ctx))
	elapsed := time.Since(start)
	if err != nil {
		err.Model, err.Endpoint = model, req.URL.String()
		t.m.observeCall(elapsed.Seconds(), string(err.Reason))
		if log := t.log.V(2); log.Enabled() {
			log.Info("vLLM /tokenize call failed", "model", model, "endpoint", err.Endpoint,
				"reason", err.Reason, "duration", elapsed, "err", err.Err)
		}
		return result{}, err
	}
	t.m.observeCall(elapsed.Seconds(), resultOK)
	if log := t.log.V(5); log.Enabled() {
		log.Info("vLLM /tokenize call", "model", model, "endpoint", req.URL.String(),
			"tokens", len(res.tokens), "duration", elapsed)
	}
	return res, nil
}

// exchange performs one HTTP exchange. It never retries: a retry could
// double the latency of the request waiting for it.
func (t *Tokenizer) exchange(ctx context.Context, req *http.Request) (result, *Error) {
	resp, err := t.client.Do(req)
	if err != nil {
		return result{}, &Error{Reason: transportReason(ctx, err), Err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		return result{}, &Error{
			Reason:     ReasonStatus,
			StatusCode: resp.StatusCode,
			Err:        fmt.Errorf("HTTP %d: %s", resp.StatusCode, errorMessage(msg)),
		}
	}
	buf := bodyBuffers.Get().(*bytes.Buffer)
	defer putBodyBuffer(buf)
	buf.Reset()
	n, err := buf.ReadFrom(io.LimitReader(resp.Body, t.maxResponseBytes+1))
	if err != nil {
		return result{}, &Error{Reason: transportReason(ctx, err), Err: fmt.Errorf("read response: %w", err)}
	}
	if n > t.maxResponseBytes {
		return result{}, &Error{Reason: ReasonBadBody, Err: fmt.Errorf("response larger than %d bytes", t.maxResponseBytes)}
	}
	res, err := decodeResponse(buf.Bytes())
	if err != nil {
		return result{}, &Error{Reason: ReasonBadBody, Err: err}
	}
	return res, nil
}

// bodyBuffers recycles the buffers responses are read into; the decoded
// token ids never alias them.
var bodyBuffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// maxPooledBuffer keeps the pool from holding on to the buffers of rare,
// very long prompts.
const maxPooledBuffer = 1 << 20

func putBodyBuffer(b *bytes.Buffer) {
	if b.Cap() <= maxPooledBuffer {
		bodyBuffers.Put(b)
	}
}

// decodeResponse decodes and checks vLLM's TokenizeResponse: an object
// with "count", "max_model_len" and "tokens" (token_strs and unknown
// members are skipped). It reads the token array by hand, without
// reflection, since on a busy gateway decoding long token arrays dominates
// the cost of a call.
func decodeResponse(body []byte) (result, error) {
	count, maxLen, tokens, err := scanResponse(body)
	if err != nil {
		return result{}, fmt.Errorf("decode TokenizeResponse: %w", err)
	}
	switch {
	case tokens == nil:
		return result{}, errors.New("TokenizeResponse has no tokens")
	case count < 0:
		return result{}, errors.New("TokenizeResponse has no count")
	case maxLen <= 0:
		return result{}, errors.New("TokenizeResponse has no positive max_model_len")
	case count != len(tokens):
		return result{}, fmt.Errorf("TokenizeResponse count %d does not match its %d tokens", count, len(tokens))
	}
	// Without a count before them, the ids grew as they were read.
	return result{tokens: exactIDs(tokens), maxModelLen: maxLen}, nil
}

// exactIDs returns ids in an array of their length: the cache charges the
// capacity of the ids it holds, which spare capacity would only waste.
func exactIDs(ids []uint32) []uint32 {
	if cap(ids) == len(ids) {
		return ids
	}
	return append(make([]uint32, 0, len(ids)), ids...)
}

// idsFor returns room for the token ids of a response whose count, -1 when
// not read yet, came before an array of at most left bytes: vLLM sends the
// count first, and the ids then take one allocation of their exact length.
// A count the bytes left cannot hold (an id and a comma each) gets none.
func idsFor(count, left int) []uint32 {
	if count < 0 || count > left/2+1 {
		return nil
	}
	return make([]uint32, 0, count)
}

// scanResponse reads the members of a TokenizeResponse; count is -1 and
// tokens nil when absent or null, maxLen 0 when absent. A repeated "tokens"
// member is an error, and room for the ids is made only for an array, so
// that decoding allocates at most in proportion to the reply.
func scanResponse(b []byte) (count, maxLen int, tokens []uint32, err error) {
	count = -1
	seenTokens := false
	i := jsonscan.SkipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return 0, 0, nil, errors.New("not a JSON object")
	}
	i = jsonscan.SkipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return count, maxLen, nil, jsonscan.Trailing(b, i+1)
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return 0, 0, nil, fmt.Errorf("want a member name at byte %d", i)
		}
		end, err := jsonscan.SkipString(b, i)
		if err != nil {
			return 0, 0, nil, err
		}
		name := b[i+1 : end-1]
		i = jsonscan.SkipSpace(b, end)
		if i >= len(b) || b[i] != ':' {
			return 0, 0, nil, fmt.Errorf("want ':' at byte %d", i)
		}
		i = jsonscan.SkipSpace(b, i+1)
		switch string(name) {
		case "tokens":
			if seenTokens {
				return 0, 0, nil, errors.New(`repeated "tokens" member`)
			}
			seenTokens = true
			var room []uint32
			if i < len(b) && b[i] == '[' {
				room = idsFor(count, len(b)-i)
			}
			tokens, i, err = jsonscan.ParseTokenIDs(b, i, room)
		case "count", "max_model_len":
			var n uint64
			if bytes.HasPrefix(b[i:], jsonNull) {
				i += len(jsonNull)
				n = math.MaxInt32 + 1 // never a valid value: reported below as absent
			} else if n, i, err = jsonscan.ParseUint(b, i, math.MaxInt32); err != nil {
				err = fmt.Errorf("%s: %w", name, err)
			}
			if err == nil && n <= math.MaxInt32 {
				if string(name) == "count" {
					count = int(n)
				} else {
					maxLen = int(n)
				}
			}
		default:
			i, err = jsonscan.SkipValue(b, i)
		}
		if err != nil {
			return 0, 0, nil, err
		}
		i = jsonscan.SkipSpace(b, i)
		if i >= len(b) {
			return 0, 0, nil, errors.New("unexpected end of JSON input")
		}
		switch b[i] {
		case ',':
			i = jsonscan.SkipSpace(b, i+1)
		case '}':
			return count, maxLen, tokens, jsonscan.Trailing(b, i+1)
		default:
			return 0, 0, nil, fmt.Errorf("want ',' or '}' at byte %d", i)
		}
	}
}

// maxErrorMessage bounds the server message quoted in an error.
const maxErrorMessage = 512

// errorMessage extracts the message of a vLLM ErrorResponse, in its current
// ({"error": {"message": ...}}) or older ({"message": ...}) shape, falling
// back to the body's text.
func errorMessage(body []byte) string {
	var e struct {
		Message string `json:"message"`
		Error   struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	msg := ""
	if json.Unmarshal(body, &e) == nil {
		msg = e.Error.Message
		if msg == "" {
			msg = e.Message
		}
	}
	if msg == "" {
		msg = string(body)
	}
	msg = strings.TrimSpace(strings.ToValidUTF8(msg, "\uFFFD"))
	if len(msg) > maxErrorMessage {
		cut := maxErrorMessage
		for cut > 0 && !utf8.RuneStart(msg[cut]) {
			cut--
		}
		msg = msg[:cut] + "…"
	}
	if msg == "" {
		return "empty body"
	}
	return msg
}
