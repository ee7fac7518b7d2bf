package main

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

// startEngine serves completions as an engine does: JSON with a
// Content-Length, or, for a body asking to stream, three server-sent events
// flushed one by one (chunked); 404 elsewhere. It counts the connections
// made to it.
func startEngine(t *testing.T) (*httptest.Server, *atomic.Int32) {
	var conns atomic.Int32
	engine := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch {
		case r.URL.Path != "/v1/completions":
			http.NotFound(w, r)
		case strings.Contains(string(body), `"stream":true`):
			w.Header().Set("Content-Type", "text/event-stream")
			for _, ev := range []string{"data: a\n\n", "data: b\n\n", "data: [DONE]\n\n"} {
				_, _ = io.WriteString(w, ev)
				w.(http.Flusher).Flush()
			}
		default:
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"echo":`+string(body)+`}`)
		}
	}))
	engine.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	engine.Start()
	t.Cleanup(engine.Close)
	return engine, &conns
}

func TestForwardersRelayWholeAndChunkedResponsesOnKeptConnections(t *testing.T) {
	for _, kind := range []string{forwardRaw, forwardNetHTTP} {
		t.Run(kind, func(t *testing.T) {
			engine, conns := startEngine(t)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ln.Close() })
			up := &upstreams{addrs: []string{strings.TrimPrefix(engine.URL, "http://")}}
			if kind == forwardRaw {
				go func() { _ = serveRaw(ln, up) }()
			} else {
				go func() { _ = http.Serve(ln, up) }()
			}
			client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1}}
			t.Cleanup(client.CloseIdleConnections)
			do := func(path, body string) (int, string, string) {
				t.Helper()
				resp, err := client.Post("http://"+ln.Addr().String()+path, "application/json", strings.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				if err != nil {
					t.Fatal(err)
				}
				return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
			}
			for range 3 {
				if code, ct, got := do("/v1/completions", `{"prompt":"hi"}`); code != 200 || ct != "application/json" ||
					got != `{"echo":{"prompt":"hi"}}` {
					t.Fatalf("whole: %d %q %q", code, ct, got)
				}
				if code, ct, got := do("/v1/completions", `{"stream":true}`); code != 200 || ct != "text/event-stream" ||
					got != "data: a\n\ndata: b\n\ndata: [DONE]\n\n" {
					t.Fatalf("stream: %d %q %q", code, ct, got)
				}
			}
			if code, _, _ := do("/elsewhere", `{}`); code != http.StatusNotFound {
				t.Errorf("an engine's 404 came back as %d", code)
			}
			if n := conns.Load(); n != 1 {
				t.Errorf("the engine saw %d connections for one client connection, want 1", n)
			}
		})
	}
}

func TestReadForwardConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cfg, err := readForwardConfig(write("ok", "# engines\nlisten 127.0.0.1:1\nupstream 127.0.0.1:2\n\nupstream 127.0.0.1:3\n"))
	if err != nil || cfg.listen != "127.0.0.1:1" || strings.Join(cfg.upstreams, ",") != "127.0.0.1:2,127.0.0.1:3" {
		t.Errorf("readForwardConfig = %+v, %v", cfg, err)
	}
	for name, text := range map[string]string{"no-upstream": "listen :1\n", "no-listen": "upstream :2\n",
		"unknown": "listen :1\nupstream :2\nworkers 2\n"} {
		if _, err := readForwardConfig(write(name, text)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestChunkSize(t *testing.T) {
	for line, want := range map[string]int64{"1a\r\n": 26, "0\r\n": 0, "ff;ext=1\r\n": 255} {
		if n, err := chunkSize([]byte(line)); err != nil || n != want {
			t.Errorf("chunkSize(%q) = %d, %v; want %d", line, n, err, want)
		}
	}
	for _, line := range []string{"\r\n", "zz\r\n", "-1\r\n", "80000000\r\n"} {
		if _, err := chunkSize([]byte(line)); !errors.Is(err, errProtocol) {
			t.Errorf("chunkSize(%q) = %v, want a protocol error", line, err)
		}
	}
}
