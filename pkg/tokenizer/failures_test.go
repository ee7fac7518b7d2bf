package tokenizer

import (
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
)

const chatHi = `{"model":"m","messages":[{"role":"user","content":"hi"}]}`

func reply(status int, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}
}

// TestFailedCallsAreTypedCountedAndNotCached answers like vLLM does on
// errors, and like a broken server would, and checks the error each
// answer yields, the calls_total label it is counted under, and that the
// next identical request asks again.
func TestFailedCallsAreTypedCountedAndNotCached(t *testing.T) {
	tests := []struct {
		name     string
		body     string
		handle   http.HandlerFunc
		cfg      Config
		reason   Reason
		status   int
		contains string
	}{
		{
			name: "vLLM error response",
			body: `{"model":"m","messages":[{"role":"assistant","content":"a"}],"continue_final_message":true}`,
			// the fake rejects it as vLLM's validator does
			reason: ReasonStatus, status: 400, contains: "HTTP 400: Cannot set both `continue_final_message`",
		},
		{
			name:   "model not served",
			body:   `{"model":"other","messages":[{"role":"user","content":"hi"}]}`,
			reason: ReasonStatus, status: 404, contains: "HTTP 404: The model `other` does not exist.",
		},
		{
			name: "older vLLM error response",
			handle: reply(http.StatusNotFound,
				`{"object":"error","message":"The model `+"`m`"+` does not exist.","type":"NotFoundError","param":null,"code":404}`),
			reason: ReasonStatus, status: 404, contains: "HTTP 404: The model `m` does not exist.",
		},
		{
			name:   "plain text error",
			handle: reply(http.StatusBadGateway, "upstream connect error\n"),
			reason: ReasonStatus, status: 502, contains: "HTTP 502: upstream connect error",
		},
		{
			name:   "long binary error body",
			handle: reply(http.StatusInternalServerError, strings.Repeat("x\xff", 10000)),
			reason: ReasonStatus, status: 500, contains: "HTTP 500: x\uFFFDx\uFFFD",
		},
		{
			name:   "truncated body",
			handle: reply(http.StatusOK, `{"count":3,"max_model_len":4096,"tokens":[1,2`),
			reason: ReasonBadBody, contains: "decode TokenizeResponse",
		},
		{
			name:   "not JSON",
			handle: reply(http.StatusOK, `OK`),
			reason: ReasonBadBody, contains: "decode TokenizeResponse",
		},
		{
			name:   "count mismatch",
			handle: reply(http.StatusOK, `{"count":2,"max_model_len":4096,"tokens":[1,2,3]}`),
			reason: ReasonBadBody, contains: "count 2 does not match its 3 tokens",
		},
		{
			name:   "negative token id",
			handle: reply(http.StatusOK, `{"count":1,"max_model_len":4096,"tokens":[-1]}`),
			reason: ReasonBadBody, contains: "decode TokenizeResponse",
		},
		{
			name:   "token id beyond uint32",
			handle: reply(http.StatusOK, `{"count":1,"max_model_len":4096,"tokens":[4294967296]}`),
			reason: ReasonBadBody, contains: "decode TokenizeResponse",
		},
		{
			name:   "no tokens",
			handle: reply(http.StatusOK, `{"count":0,"max_model_len":4096}`),
			reason: ReasonBadBody, contains: "has no tokens",
		},
		{
			name:   "null tokens",
			handle: reply(http.StatusOK, `{"count":0,"max_model_len":4096,"tokens":null}`),
			reason: ReasonBadBody, contains: "has no tokens",
		},
		{
			name:   "no count",
			handle: reply(http.StatusOK, `{"max_model_len":4096,"tokens":[]}`),
			reason: ReasonBadBody, contains: "has no count",
		},
		{
			name:   "no max_model_len",
			handle: reply(http.StatusOK, `{"count":0,"tokens":[]}`),
			reason: ReasonBadBody, contains: "no positive max_model_len",
		},
		{
			name:   "response larger than the bound",
			cfg:    Config{MaxResponseBytes: 64},
			handle: reply(http.StatusOK, `{"count":20,"max_model_len":4096,"tokens":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20]}`),
			reason: ReasonBadBody, contains: "response larger than 64 bytes",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeVLLM(t, "m")
			f.handle = tt.handle
			tk, _ := newTestTokenizer(t, tt.cfg)
			body := tt.body
			if body == "" {
				body = chatHi
			}
			for attempt := 1; attempt <= 2; attempt++ {
				_, err := tokenize(t, tk, f.URL, body)
				e := reasonOf(t, err)
				if e.Reason != tt.reason || e.StatusCode != tt.status || !strings.Contains(err.Error(), tt.contains) {
					t.Fatalf("error %q: reason %q status %d; want reason %q status %d containing %q",
						err, e.Reason, e.StatusCode, tt.reason, tt.status, tt.contains)
				}
				if len(err.Error()) > 1024 {
					t.Fatalf("error of %d bytes, want the server's message bounded", len(err.Error()))
				}
				if e.Endpoint != f.URL+"/tokenize" {
					t.Fatalf("error endpoint %q, want %q", e.Endpoint, f.URL+"/tokenize")
				}
				if n := f.calls.Load(); n != int64(attempt) {
					t.Fatalf("attempt %d: server received %d requests", attempt, n)
				}
			}
			if n := count(t, tk.m.calls[string(tt.reason)]); n != 2 {
				t.Fatalf("calls_total{result=%q} = %d, want 2", tt.reason, n)
			}
		})
	}
}

func TestSlowServerTimesOut(t *testing.T) {
	tests := []struct {
		name   string
		handle http.HandlerFunc
	}{
		{"no answer", func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }},
		{"body stalls", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"count":3,"max_model_len":4096,"tokens":[1,`))
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeVLLM(t, "m")
			f.handle = tt.handle
			tk, _ := newTestTokenizer(t, Config{Timeout: 100 * time.Millisecond})
			start := time.Now()
			_, err := tokenize(t, tk, f.URL, chatHi)
			if e := reasonOf(t, err); e.Reason != ReasonTimeout {
				t.Fatalf("error %v: reason %q, want timeout", err, e.Reason)
			}
			if elapsed := time.Since(start); elapsed > 10*time.Second {
				t.Fatalf("timed out after %v with a 100ms timeout", elapsed)
			}
			if n := count(t, tk.m.calls[string(ReasonTimeout)]); n != 1 {
				t.Fatalf("calls_total{result=timeout} = %d, want 1", n)
			}
		})
	}
}

func TestRefusedConnection(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	tk, _ := newTestTokenizer(t, Config{})
	_, err = tokenize(t, tk, "http://"+addr, chatHi)
	if e := reasonOf(t, err); e.Reason != ReasonConnection {
		t.Fatalf("error %v: reason %q, want connection", err, e.Reason)
	}
	if n := count(t, tk.m.calls[string(ReasonConnection)]); n != 1 {
		t.Fatalf("calls_total{result=connection} = %d, want 1", n)
	}
}

func TestBadBaseURLIsAnInputError(t *testing.T) {
	for _, base := range []string{"", "10.0.0.7:8000", "ftp://10.0.0.7", "http://", "http://[::1"} {
		t.Run(base, func(t *testing.T) {
			tk, _ := newTestTokenizer(t, Config{})
			_, err := tokenize(t, tk, base, chatHi)
			if e := reasonOf(t, err); e.Reason != ReasonInput || !strings.Contains(err.Error(), "base URL") {
				t.Fatalf("error %v: reason %q, want input about the base URL", err, e.Reason)
			}
			for result, c := range tk.m.calls {
				if n := count(t, c); n != 0 {
					t.Fatalf("calls_total{result=%q} = %d, want no call", result, n)
				}
			}
		})
	}
}

func TestCloseCancelsCallsInFlightAndKeepsTheCache(t *testing.T) {
	ready := newFakeVLLM(t, "m")
	stuck := newFakeVLLM(t, "m")
	stuck.block = make(chan struct{})
	t.Cleanup(func() { close(stuck.block) })
	tk, _ := newTestTokenizer(t, Config{})
	const cached = `{"model":"m","prompt":"cached"}`
	want := mustTokenize(t, tk, ready.URL, cached)

	errc := make(chan error, 1)
	go func() {
		_, err := tokenize(t, tk, stuck.URL, chatHi)
		errc <- err
	}()
	<-stuck.arrived
	tk.Close()
	if err := <-errc; reasonOf(t, err).Reason != ReasonCanceled {
		t.Fatalf("call in flight at Close: %v, want canceled", err)
	}
	if _, err := tokenize(t, tk, stuck.URL, `{"model":"m","prompt":"new"}`); reasonOf(t, err).Reason != ReasonCanceled {
		t.Fatalf("miss after Close: %v, want canceled", err)
	}
	wantTokens(t, mustTokenize(t, tk, stuck.URL, cached), want)
	if n := stuck.calls.Load(); n != 1 {
		t.Fatalf("server received %d requests, want only the one before Close", n)
	}
}

func TestFailedCallsAreLoggedWithModelEndpointAndReason(t *testing.T) {
	f := newFakeVLLM(t, "m")
	f.handle = reply(http.StatusServiceUnavailable, `{"error":{"message":"overloaded"}}`)
	var mu sync.Mutex
	var lines []string
	logger := funcr.New(func(prefix, args string) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, prefix+" "+args)
	}, funcr.Options{Verbosity: 2})
	tk, _ := newTestTokenizer(t, Config{Logger: logger})
	if _, err := tokenize(t, tk, f.URL, chatHi); err == nil {
		t.Fatal("tokenize succeeded against a failing server")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(lines) != 1 {
		t.Fatalf("logged %d lines, want 1: %q", len(lines), lines)
	}
	for _, want := range []string{`tokenizer`, `"model"="m"`, `"endpoint"="` + f.URL + `/tokenize"`, `"reason"="status"`, `overloaded`} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("log line %q lacks %s", lines[0], want)
		}
	}
}
