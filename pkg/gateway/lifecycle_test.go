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
	eventually(t, "/healthz", func() (string, bool) {
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
	eventually(t, "readiness", func() (string, bool) {
		status, body := get(t, url+"/readyz")
		return body, status == http.StatusOK && strings.HasPrefix(body, "ready")
	})

	// A stream in flight when shutdown begins finishes.
	proceed := make(chan struct{})
	e.setAnswer(func(w http.ResponseWriter, r *http.Request, body []byte) {
		if !strings.Contains(string(body), `"stream":true`) {
			defaultAnswer(w, r, body)
			return
		}
		writeSSE(w, []string{"data: {\"choices\":[{\"index\":0,\"text\":\"a\"}]}\n\n"})
		<-proceed
		writeSSE(w, []string{"data: [DONE]\n\n"})
	})
	stream := openStream(t, url+"/v1/completions", `{"model":"llama","prompt":"hi","stream":true}`)
	defer stream.Body.Close()
	first := make([]byte, 6)
	if _, err := io.ReadFull(stream.Body, first); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	eventually(t, "readiness to fail while draining", func() (string, bool) {
		status, body := get(t, url+"/readyz")
		return body, status == http.StatusServiceUnavailable && strings.HasPrefix(body, "shutting down")
	})
	// Until the delay is over, requests that still arrive are served.
	if resp, body := post(t, url+"/v1/completions", completion("late", ""), nil); resp.StatusCode != http.StatusOK {
		t.Errorf("request during the shutdown delay: %d %s", resp.StatusCode, body)
	}
	close(proceed)
	rest, err := io.ReadAll(stream.Body)
	if err != nil || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Errorf("stream in flight at shutdown ended with %q, %v", rest, err)
	}
	select {
	case err := <-stopped:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("Serve did not return")
	}
	if _, err := http.Get(url + "/healthz"); err == nil {
		t.Error("still serving after Serve returned")
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
