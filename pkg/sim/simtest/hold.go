package simtest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// Hold sends the engine at url (an Engine's URL) a streamed completion of
// prompt for model, generating up to maxTokens tokens whatever the end of
// sequence says, and returns once the engine has sent its first event:
// from then until release hangs up, or the test ends, the request holds
// the KV-cache blocks of its prompt and the engine's capacity. It fails
// the test when the engine does not start the stream. release may be
// called more than once.
func Hold(t testing.TB, url, model, prompt string, maxTokens int) (release func()) {
	t.Helper()
	body, err := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": maxTokens,
		"stream": true, "ignore_eos": true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: {") {
		cancel()
		resp.Body.Close()
		t.Fatalf("hold %s: first line %q: %v", url, line, err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			cancel()
			resp.Body.Close()
		})
	}
	t.Cleanup(release)
	return release
}
