package gateway

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kvgate/kvgate/internal/testsupport"
)

func TestReadinessFollowsStartAndShutdownAndRequestsDrain(t *testing.T) {
	e := newTestEngine(t, "a")
	pod := (&staticPod{name: "a", port: e.port}).pod()
	src := &podsSource{pods: []*v1.Pod{pod}, release: make(chan struct{})}
	cfg := loadTestConfig(t, map[string]string{"AIBRIX_PREFIX_CACHE_KV_EVENT_SYNC_ENABLED": "false",
		"KVGATE_SHUTDOWN_DELAY": "3s", "KVGATE_SHUTDOWN_TIMEOUT": "20s"})
	cfg.PodSource = src
	_, url, stop := serveGateway(t, cfg)

	// Alive, not ready, and refusing inference until the pods are known.
	testsupport.EventuallyWhy(t, "/healthz", func() (string, bool) {
		status, body := get(t, url+"/healthz")
		return body, status == http.StatusOK
	})
	if status, body := get(t, url+"/readyz"); status != http.StatusServiceUnavailable || !strings.HasPrefix(body, "starting") {
		t.Errorf("/readyz before the pods are known: %d %q", status, body)
	}
	resp, body := post(t, url+"/v1/completions", completion("hi", ""), nil)
	if e := decodeError(t, body); resp.StatusCode != http.StatusServiceUnavailable || e.Code != codeNotReady {
		t.Errorf("completion before the pods are known: %d %s", resp.StatusCode, body)
	}

	close(src.release)
	testsupport.EventuallyWhy(t, "readiness", func() (string, bool) {
		status, body := get(t, url+"/readyz")
		return body, status == http.StatusOK && strings.HasPrefix(body, "ready")
	})

	// A stream in flight when shutdown begins finishes.
	stream := holdStream(t, e, url)
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	testsupport.EventuallyWhy(t, "readiness to fail while draining", func() (string, bool) {
		status, body := get(t, url+"/readyz")
		return body, status == http.StatusServiceUnavailable && strings.HasPrefix(body, "shutting down")
	})
	// Until the delay is over, requests that still arrive are served.
	if resp, body := post(t, url+"/v1/completions", completion("late", ""), nil); resp.StatusCode != http.StatusOK {
		t.Errorf("request during the shutdown delay: %d %s", resp.StatusCode, body)
	}
	stream.finish()
	waitStopped(t, stopped)
	if _, err := http.Get(url + "/healthz"); err == nil {
		t.Error("still serving after Serve returned")
	}
}

// heldStream is a streamed completion in flight whose engine holds its
// end until finish.
type heldStream struct {
	t       *testing.T
	resp    *http.Response
	proceed chan struct{}
}

// holdStream makes engine e hold every stream after its first event until
// finish (answering other requests as usual), and opens one such stream
// through the gateway at url; it returns once the first event arrived.
func holdStream(t *testing.T, e *testEngine, url string) *heldStream {
	t.Helper()
	h := &heldStream{t: t, proceed: make(chan struct{})}
	e.setAnswer(func(w http.ResponseWriter, r *http.Request, body []byte) {
		if !strings.Contains(string(body), `"stream":true`) {
			defaultAnswer(w, r, body)
			return
		}
		writeSSE(w, []string{"data: {\"choices\":[{\"index\":0,\"text\":\"a\"}]}\n\n"})
		<-h.proceed
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	})
	h.resp = openStream(t, url+"/v1/completions", `{"model":"llama","prompt":"hi","stream":true}`)
	t.Cleanup(func() { h.resp.Body.Close() })
	if _, err := io.ReadFull(h.resp.Body, make([]byte, 6)); err != nil {
		t.Fatal(err)
	}
	return h
}

// finish lets the engine end the stream and checks that the client
// receives its end.
func (h *heldStream) finish() {
	h.t.Helper()
	close(h.proceed)
	if rest, err := io.ReadAll(h.resp.Body); err != nil || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		h.t.Errorf("stream in flight at shutdown ended with %q, %v", rest, err)
	}
}

// waitStopped waits for the result of a gateway's stop.
func waitStopped(t *testing.T, stopped <-chan error) {
	t.Helper()
	select {
	case err := <-stopped:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(testsupport.WaitTimeout):
		t.Fatal("Serve did not return")
	}
}

func TestServeFailsWhenTheKVEventBindEndpointIsInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	cfg := loadTestConfig(t, map[string]string{"KVGATE_POD_DISCOVERY": "static",
		"KVGATE_STATIC_ENDPOINTS_FILE":   writeEndpoints(t, "endpoints: []\n"),
		"KVGATE_KV_EVENTS_BIND_ENDPOINT": fmt.Sprintf("tcp://127.0.0.1:%d", port)})
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	err = g.Serve(t.Context(), gl)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprint(port)) {
		t.Fatalf("Serve = %v, want an error naming the bind endpoint in use", err)
	}
	if _, err := http.Get("http://" + gl.Addr().String() + "/healthz"); err == nil {
		t.Error("still serving after Serve failed")
	}
}

// staticPod describes a Ready pod of model llama on 127.0.0.1.
type staticPod struct {
	name string
	port int
}

func (s *staticPod) pod() *v1.Pod {
	p := unreadyPod(s.name)
	p.Status.Conditions[0].Status = v1.ConditionTrue
	p.Labels["model.aibrix.ai/port"] = fmt.Sprint(s.port)
	return p
}
