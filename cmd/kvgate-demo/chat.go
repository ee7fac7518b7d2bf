package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/pkg/gateway"
	"github.com/kvgate/kvgate/pkg/routing"
)

// chatClient sends streaming requests of a conversation to the gateway,
// through api (apiChat when empty): to url, or in turn to each of urls, the
// API's path on several replicas, as a Service spreads requests over them;
// next must then be set.
type chatClient struct {
	http  *http.Client
	url   string // the API's path on the gateway, e.g. /v1/chat/completions
	urls  []string
	next  *atomic.Uint64 // counts the requests sent to urls
	model string
	api   string
}

// target returns the URL of the next request.
func (c *chatClient) target() string {
	if len(c.urls) == 0 {
		return c.url
	}
	return c.urls[c.next.Add(1)%uint64(len(c.urls))]
}

// result is what one chat request measured.
type result struct {
	// pod is the pod that served it (the gateway's target-pod-name).
	pod string
	// ttft is the time from sending the request to the first token; e2e
	// to the end of the stream.
	ttft, e2e time.Duration
	// promptTokens and cachedTokens are the usage the engine reported;
	// cachedUnknown tells an API that reports no cached tokens (Anthropic's
	// Messages), whose cachedTokens is then 0.
	promptTokens, cachedTokens int
	cachedUnknown              bool
	// timing is the gateway's Server-Timing, header and trailer, by
	// metric: its own time ("gateway") and that of each phase; empty when
	// the response did not come through the gateway.
	timing map[string]time.Duration
	// answer is the generated text; answerID the id of the output message
	// holding it, for the Responses API, which the next turn sends back.
	answer, answerID string
}

type chatRequest struct {
	Model         string        `json:"model"`
	Messages      []chatMessage `json:"messages"`
	MaxTokens     int           `json:"max_tokens"`
	Stream        bool          `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// chatChunk is what the client reads of a chat stream's chunks.
type chatChunk struct {
	Choices []struct {
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// chatBody returns the body of a streamed chat completion request of
// messages asking for maxTokens tokens, with the usage at the end.
func chatBody(model string, messages []chatMessage, maxTokens int) ([]byte, error) {
	body := chatRequest{Model: model, Messages: messages, MaxTokens: maxTokens, Stream: true}
	body.StreamOptions.IncludeUsage = true
	return json.Marshal(&body)
}

// send sends messages through the client's API with the routing algorithm
// alg and reads the streamed answer, asking for maxTokens tokens.
func (c *chatClient) send(ctx context.Context, alg string, messages []chatMessage, maxTokens int) (result, error) {
	encode, read := chatBody, readStream
	switch c.api {
	case apiResponses:
		encode, read = responsesBody, readResponsesStream
	case apiMessages:
		encode, read = messagesBody, readMessagesStream
	}
	data, err := encode(c.model, messages, maxTokens)
	if err != nil {
		return result{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.target(), bytes.NewReader(data))
	if err != nil {
		return result{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(routing.HeaderRoutingStrategy, alg)
	start := time.Now()
	resp, err := c.http.Do(req)
	if err != nil {
		return result{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		err := fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(msg))
		if resp.StatusCode == http.StatusTooManyRequests {
			secs, _ := strconv.Atoi(resp.Header.Get(gateway.HeaderRetryAfter))
			err = &refusedError{retryAfter: time.Duration(max(secs, 1)) * time.Second, err: err}
		}
		return result{}, err
	}
	r := result{pod: resp.Header.Get(gateway.HeaderTargetPodName)}
	err = read(resp.Body, &r, func() { r.ttft = time.Since(start) })
	if err != nil {
		return result{}, err
	}
	// The trailer, with the relay's and the whole time, follows the end of
	// the stream.
	_, _ = io.Copy(io.Discard, resp.Body)
	r.timing = serverTimings(resp.Header, resp.Trailer)
	r.e2e = time.Since(start)
	return r, nil
}

// refusedError reports a request the gateway refused with 429: an
// SLO-aware algorithm found no pod to serve it within its objective.
type refusedError struct {
	retryAfter time.Duration
	err        error
}

func (e *refusedError) Error() string { return e.err.Error() }

// maxEventBytes bounds an event of a stream the client reads: a Responses
// stream's lifecycle events echo the request's instructions, the whole
// system prompt.
const maxEventBytes = 64 << 20

// readEvents calls handle with the data of each of body's server-sent
// events in turn, until handle reports the stream's last event or fails;
// last names that event in the error of a stream cut before it.
func readEvents(body io.Reader, last string, handle func(data []byte) (bool, error)) error {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 64<<10), maxEventBytes)
	for sc.Scan() {
		data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data:"))
		if !ok {
			continue
		}
		done, err := handle(bytes.TrimPrefix(data, []byte(" ")))
		if err != nil || done {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read the stream: %w", err)
	}
	return fmt.Errorf("the stream ended before %s", last)
}

// readStream reads a chat stream's events up to [DONE], calling firstToken
// at the first generated token, and sets r's answer and usage.
func readStream(body io.Reader, r *result, firstToken func()) error {
	var answer strings.Builder
	seen, usage := false, false
	err := readEvents(body, "[DONE]", func(data []byte) (bool, error) {
		if string(data) == "[DONE]" {
			if !usage {
				return true, errors.New("the stream ended without its usage")
			}
			return true, nil
		}
		var c chatChunk
		if err := json.Unmarshal(data, &c); err != nil {
			return false, fmt.Errorf("undecodable chunk %.80q: %w", data, err)
		}
		if c.Error != nil {
			return false, fmt.Errorf("the stream failed: %s", c.Error.Message)
		}
		for _, ch := range c.Choices {
			if !seen && (ch.Delta.Content != "" || ch.FinishReason != nil) {
				seen = true
				firstToken()
			}
			answer.WriteString(ch.Delta.Content)
		}
		if u := c.Usage; u != nil {
			usage = true
			r.promptTokens = u.PromptTokens
			if u.PromptTokensDetails != nil {
				r.cachedTokens = u.PromptTokensDetails.CachedTokens
			}
		}
		return false, nil
	})
	r.answer = answer.String()
	return err
}

// serverTimings returns the durations of the Server-Timing metrics in
// headers (a response's header, then its trailer), by name; a name given
// twice keeps its last duration.
func serverTimings(headers ...http.Header) map[string]time.Duration {
	out := map[string]time.Duration{}
	for _, h := range headers {
		for _, v := range h.Values(gateway.HeaderServerTiming) {
			for metric := range strings.SplitSeq(v, ",") {
				name, params, _ := strings.Cut(strings.TrimSpace(metric), ";")
				for p := range strings.SplitSeq(params, ";") {
					if ms, ok := strings.CutPrefix(strings.TrimSpace(p), "dur="); ok {
						if f, err := strconv.ParseFloat(ms, 64); err == nil && name != "" {
							out[name] = time.Duration(math.Round(f * float64(time.Millisecond)))
						}
					}
				}
			}
		}
	}
	return out
}
