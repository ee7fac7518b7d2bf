package gateway

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/cache"
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

// listSource is a PodSource delivering a fixed list, then whatever the test
// sends on more, until it is stopped.
type listSource struct {
	pods    []*v1.Pod
	more    chan *v1.Pod
	failNow error
	config  *rest.Config
	stopped chan struct{}
}

func (s *listSource) Run(ctx context.Context, config *rest.Config, sink cache.PodSink, synced func()) error {
	defer close(s.stopped)
	s.config = config
	if s.failNow != nil {
		return s.failNow
	}
	for _, p := range s.pods {
		sink.AddOrUpdatePod(p)
	}
	synced()
	for {
		select {
		case <-ctx.Done():
			return nil
		case p := <-s.more:
			sink.AddOrUpdatePod(p)
		}
	}
}

// neverSyncs is a PodSource that blocks until stopped without syncing.
type neverSyncs struct{}

func (neverSyncs) Run(ctx context.Context, _ *rest.Config, _ cache.PodSink, _ func()) error {
	<-ctx.Done()
	return nil
}

// recordingFollower is a podFollower recording its calls.
type recordingFollower struct {
	mu       sync.Mutex
	events   []string
	startErr error
}

func (m *recordingFollower) record(e string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.events = append(m.events, e)
}

func (m *recordingFollower) got() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.events)
}

func (m *recordingFollower) Start() error {
	m.record("start")
	return m.startErr
}

func (m *recordingFollower) Stop()                    { m.record("stop") }
func (m *recordingFollower) OnPodAdd(p *v1.Pod)       { m.record("add " + p.Name) }
func (m *recordingFollower) OnPodUpdate(_, p *v1.Pod) { m.record("update " + p.Name) }
func (m *recordingFollower) OnPodDelete(p *v1.Pod)    { m.record("delete " + p.Name) }

// newWiredGateway builds a gateway without KV event sync over source, with
// follower in the KV event manager's place; adjust, when not nil, changes
// its Config first.
func newWiredGateway(t *testing.T, source cache.PodSource, follower podFollower, adjust func(*Config)) (*Gateway, error) {
	t.Helper()
	cfg := loadTestConfig(t, map[string]string{"AIBRIX_PREFIX_CACHE_KV_EVENT_SYNC_ENABLED": "false"})
	cfg.PodSource, cfg.RestConfig = source, &rest.Config{Host: "https://apiserver.test"}
	cfg.Cache.PodMetricRefreshInterval, cfg.Cache.AdapterRefreshInterval = -1, -1
	if adjust != nil {
		adjust(&cfg)
	}
	g, err := New(cfg)
	if err == nil {
		g.follower = follower
	}
	return g, err
}

func TestServeWiresThePodSourceAndTheKVEventManagerInOrder(t *testing.T) {
	src := &listSource{
		pods:    []*v1.Pod{(&staticPod{name: "a", port: 1}).pod(), (&staticPod{name: "b", port: 2}).pod()},
		more:    make(chan *v1.Pod),
		stopped: make(chan struct{}),
	}
	mgr := &recordingFollower{}
	g, err := newWiredGateway(t, src, mgr, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- g.Serve(ctx, ln) }()
	url := "http://" + ln.Addr().String()
	testsupport.EventuallyWhy(t, "readiness", func() (string, bool) {
		status, body := get(t, url+"/readyz")
		return body, status == http.StatusOK
	})
	if pods, _ := g.store.ListPodsByModel("llama"); len(pods) != 2 {
		t.Fatalf("ready before the source synced: %d pods", len(pods))
	}
	if src.config != g.cfg.RestConfig {
		t.Fatal("the pod source did not get the Kubernetes config")
	}
	src.more <- (&staticPod{name: "c", port: 3}).pod()
	testsupport.Eventually(t, "the third pod to be delivered", func() bool { return len(g.store.ListPods()) == 3 })

	cancel()
	waitStopped(t, served)
	select {
	case <-src.stopped:
	default:
		t.Fatal("Serve returned before the pod source stopped")
	}
	want := []string{"start", "add a", "add b", "add c", "stop"}
	if got := mgr.got(); !slices.Equal(got, want) {
		t.Fatalf("manager saw %v, want %v", got, want)
	}
}

func TestServeFailsCleanly(t *testing.T) {
	sourceErr := errors.New("no API server")
	tests := []struct {
		name     string
		source   cache.PodSource
		follower *recordingFollower
		// badConfig turns Redis features on without Redis, as a program
		// building its own Config could (LoadConfig turns them off).
		badConfig bool
		cancel    bool // the context ends before the pods are delivered
		want      string
	}{
		{"manager fails to start", &listSource{stopped: make(chan struct{})}, &recordingFollower{startErr: errors.New("boom")}, false, false, "boom"},
		{"source fails", &listSource{failNow: sourceErr, stopped: make(chan struct{})}, nil, false, false, "no API server"},
		{"stopped before sync", neverSyncs{}, nil, false, true, ""},
		{"Redis feature without Redis", neverSyncs{}, nil, true, false, "needs a Redis client"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
			var follower podFollower
			if tt.follower != nil {
				follower = tt.follower
			}
			g, err := newWiredGateway(t, tt.source, follower, func(c *Config) {
				c.Redis.RequestTraces, c.Redis.GPUProfiles, c.Redis.SharedCounts = tt.badConfig, tt.badConfig, tt.badConfig
			})
			if tt.badConfig {
				for _, feature := range []string{"RequestTraces", "GPUProfiles", "SharedCounts"} {
					if err == nil || !strings.Contains(err.Error(), feature+" "+tt.want) {
						t.Fatalf("New = %v, want an error saying %s %s", err, feature, tt.want)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tt.cancel {
				cancel()
			}
			err = g.Serve(ctx, ln)
			if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("Serve = %v, want an error containing %q", err, tt.want)
			}
			if _, err := http.Get("http://" + ln.Addr().String() + "/healthz"); err == nil {
				t.Error("still serving after Serve returned")
			}
		})
	}
}

func TestResponsesDuringTheShutdownDelayCloseTheirConnections(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{env: map[string]string{
		"AIBRIX_PREFIX_CACHE_KV_EVENT_SYNC_ENABLED": "false",
		"KVGATE_SHUTDOWN_DELAY":                     "3s",
	}})
	// Keep-alive clients, each on one connection at a time, send whole and
	// streamed completions (served by the lean HTTP server) and model
	// listings (by net/http) throughout the shutdown.
	requests := []func() *http.Request{
		func() *http.Request {
			r, _ := http.NewRequest(http.MethodPost, f.url+PathCompletions, strings.NewReader(completion("hi", "")))
			return r
		},
		func() *http.Request {
			r, _ := http.NewRequest(http.MethodPost, f.url+PathCompletions, strings.NewReader(completion("hi", `,"stream":true`)))
			return r
		},
		func() *http.Request {
			r, _ := http.NewRequest(http.MethodGet, f.url+PathModels, nil)
			return r
		},
	}
	var (
		mu                                  sync.Mutex
		served, reusedBefore, servedInDrain int
		keptAlive, lost                     []string
	)
	stopClients := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() {
			c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
			defer c.CloseIdleConnections()
			for {
				select {
				case <-stopClients:
					return
				default:
				}
				draining := f.gw.draining.Load()
				var reused bool
				req := requests[i%len(requests)]()
				req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
					GotConn: func(c httptrace.GotConnInfo) { reused = c.Reused }}))
				resp, err := c.Do(req)
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				mu.Lock()
				switch {
				case err != nil && reused:
					lost = append(lost, fmt.Sprintf("%s %s: %v", req.Method, req.URL.Path, err))
				case err != nil:
					// A new connection once the listener closed: the
					// gateway is gone, and the load balancer's to avoid.
					mu.Unlock()
					return
				default:
					served++
					if reused && !draining {
						reusedBefore++
					}
					if draining {
						servedInDrain++
						// Set by the response's Connection: close, which
						// the client takes out of the header.
						if !resp.Close {
							keptAlive = append(keptAlive, req.Method+" "+req.URL.Path)
						}
					}
				}
				mu.Unlock()
			}
		})
	}
	testsupport.EventuallyWhy(t, "keep-alive traffic", func() (string, bool) {
		mu.Lock()
		defer mu.Unlock()
		return fmt.Sprintf("%d served, %d on reused connections", served, reusedBefore), served > 50 && reusedBefore > 0
	})
	stopped := make(chan error, 1)
	go func() { stopped <- f.stop() }()
	testsupport.EventuallyWhy(t, "the shutdown to begin", func() (string, bool) { return "", f.gw.draining.Load() })

	// Each server closes a connection once its response is sent.
	host := strings.TrimPrefix(f.url, "http://")
	for _, head := range []string{
		"POST " + PathCompletions + " HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		"GET " + PathModels + " HTTP/1.1\r\nHost: gw\r\n\r\n",
	} {
		conn, err := net.Dial("tcp", host)
		if err != nil {
			t.Fatal(err)
		}
		msg := head
		if strings.HasPrefix(head, "POST") {
			body := completion("on a connection of its own", "")
			msg = fmt.Sprintf(head, len(body), body)
		}
		_ = conn.SetDeadline(time.Now().Add(testsupport.WaitTimeout))
		if _, err := io.WriteString(conn, msg); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s: %v", msg[:strings.IndexByte(msg, '\r')], err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if _, err := br.ReadByte(); resp.StatusCode != http.StatusOK || !resp.Close || err != io.EOF {
			t.Errorf("%s while draining: %d, Connection: close %v, then read %v; want 200, close, and the connection closed",
				msg[:strings.IndexByte(msg, '\r')], resp.StatusCode, resp.Close, err)
		}
		conn.Close()
	}

	waitStopped(t, stopped)
	close(stopClients)
	wg.Wait()
	if servedInDrain == 0 {
		t.Fatal("no request was served during the shutdown delay")
	}
	if len(keptAlive) > 0 {
		t.Errorf("%d of %d responses during the shutdown delay kept their connection alive, e.g. %v",
			len(keptAlive), servedInDrain, keptAlive[0])
	}
	if len(lost) > 0 {
		t.Errorf("%d requests were lost on a kept-alive connection, e.g. %v", len(lost), lost[:min(3, len(lost))])
	}
}
