package extproc

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/gateway"
	"github.com/kvgate/kvgate/pkg/kvevent/publisher"
	"github.com/kvgate/kvgate/pkg/sim"
	"github.com/kvgate/kvgate/pkg/sim/simserver"
	"github.com/kvgate/kvgate/pkg/sim/simtest"
)

// simModel is the model the test engines serve.
const simModel = "sim"

// simEngine is a simulated vLLM engine (package simserver, what vllm-sim
// runs) on loopback, publishing its KV events on a ZeroMQ PUB socket with a
// replay ROUTER, as vLLM does.
type simEngine struct {
	name                      string
	url, address              string
	port, pubPort, replayPort int
	// ranks is the number of data-parallel ranks behind the one port, rank
	// r publishing on pubPort+r and replaying on replayPort+r.
	ranks int
}

// startEngine runs a simulated engine named name until the test ends.
func startEngine(t testing.TB, name string) *simEngine { return startRanks(t, name, 1) }

// startRanks runs a simulated engine named name of ranks data-parallel
// ranks until the test ends.
func startRanks(t testing.TB, name string, ranks int) *simEngine {
	t.Helper()
	return startRanksWith(t, name, ranks, nil)
}

// startRanksWith is startRanks with each rank's engine configuration
// adjusted by adjust, when not nil.
func startRanksWith(t testing.TB, name string, ranks int, adjust func(*sim.EngineConfig)) *simEngine {
	t.Helper()
	ports := testsupport.ConsecutivePorts(t, 2*ranks)
	var rs []simserver.Rank
	for r := range ranks {
		pc := publisher.DefaultPublisherConfig()
		pc.Endpoint = fmt.Sprintf("tcp://[::ffff:127.0.0.1]:%d", ports[r])
		pc.ReplayEndpoint = fmt.Sprintf("tcp://127.0.0.1:%d", ports[ranks+r])
		pc.ReplayPollInterval = 5 * time.Millisecond
		pc.Logger = klog.Background().V(5)
		pub, err := publisher.NewPublisher(pc)
		if err != nil {
			t.Fatalf("engine %s: %v", name, err)
		}
		// Registered before the engine's cleanup, it runs after the engine
		// stopped.
		t.Cleanup(func() { _ = pub.Close() })
		// A prefill speed of 1,000 tokens per second: an uncached prompt of
		// a few hundred tokens costs far more than the inter-token latency
		// a loaded test machine measures, so that kv-aware's predictions
		// tell the pod holding it from the others.
		ec := sim.EngineConfig{BlockSize: 16, NumGPUBlocks: 4096, DefaultOutputTokens: 8,
			Latency: sim.LatencyModel{StepOverhead: time.Millisecond, PrefillPerToken: time.Millisecond,
				DecodePerToken: 100 * time.Microsecond}}
		if adjust != nil {
			adjust(&ec)
		}
		rs = append(rs, simserver.Rank{Engine: ec, Sink: pub})
	}
	srv := simtest.Serve(t, simserver.Config{Model: simModel, Ranks: rs})
	return &simEngine{name: name, url: srv.URL, address: net.JoinHostPort("127.0.0.1", strconv.Itoa(srv.Port)), port: srv.Port,
		pubPort: ports[0], replayPort: ports[ranks], ranks: ranks}
}

// endpointYAML is the engine's entry in a static endpoints file.
func (e *simEngine) endpointYAML() string {
	return fmt.Sprintf("- {name: %s, address: 127.0.0.1, model: %s, port: %d, pubPort: %d, replayPort: %d, dpSize: %d}\n",
		e.name, simModel, e.port, e.pubPort, e.replayPort, e.ranks)
}

// fixture is a gateway over simulated engines, found through a static
// endpoints file, with the external processor attached as cmd/gateway
// attaches it, and an Envoy talking to it.
type fixture struct {
	t       testing.TB
	engines []*simEngine
	gw      *gateway.Gateway
	srv     *Server
	apiURL  string
	extAddr string
	reg     prometheus.Gatherer
	envoy   *envoy
}

// options adjust a fixture.
type options struct {
	failOpen  bool
	plaintext bool
	// notReady skips waiting for the gateway to be ready and to follow the
	// engines; engines lists no engine then.
	notReady bool
	env      map[string]string
	// configure adjusts the loaded configuration.
	configure func(*gateway.Config)
	// ranks is the number of data-parallel ranks of each engine (1 when
	// 0).
	ranks int
	// engine, when set, adjusts each engine's configuration.
	engine func(*sim.EngineConfig)
}

// start runs n engines and the gateway, and waits until the gateway is
// ready and follows every engine's KV events.
func start(t testing.TB, n int, o options) *fixture {
	t.Helper()
	f := &fixture{t: t}
	var yaml strings.Builder
	yaml.WriteString("endpoints:\n")
	for i := range n {
		e := startRanksWith(t, string(rune('a'+i)), max(o.ranks, 1), o.engine)
		f.engines = append(f.engines, e)
		yaml.WriteString(e.endpointYAML())
	}
	file := filepath.Join(t.TempDir(), "endpoints.yaml")
	if err := os.WriteFile(file, []byte(yaml.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"KVGATE_POD_DISCOVERY":                  "static",
		"KVGATE_STATIC_ENDPOINTS_FILE":          file,
		"AIBRIX_POD_METRIC_REFRESH_INTERVAL_MS": "20",
		"KVGATE_SHUTDOWN_TIMEOUT":               "10s",
		"KVGATE_SHUTDOWN_DELAY":                 "0",
	}
	if o.notReady {
		// A source that never delivers: the gateway stays not ready.
		env["KVGATE_POD_DISCOVERY"] = "kubernetes"
		env["KUBECONFIG"] = unreachableKubeconfig(t)
	}
	for k, v := range o.env {
		env[k] = v
	}
	e := config.NewEnv(func(name string) (string, bool) { v, ok := env[name]; return v, ok })
	cfg := gateway.LoadConfig(e)
	if err := e.Err(); err != nil {
		t.Fatal(err)
	}
	if o.configure != nil {
		o.configure(&cfg)
	}
	g, err := gateway.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.gw = g
	sc := Config{FailOpen: o.failOpen, MaxStreams: cfg.ExtProc.MaxStreams, MaxConnections: cfg.ExtProc.MaxConnections, MaxMessageTimeout: cfg.ExtProc.MaxMessageTimeout,
		HealthInterval: 10 * time.Millisecond}
	if !o.plaintext {
		if sc.TLS, err = TLSConfig("", klog.Background()); err != nil {
			t.Fatal(err)
		}
	}
	srv, err := New(g.Picker(), sc)
	if err != nil {
		t.Fatal(err)
	}
	f.srv = srv
	f.reg = g.Picker().Registerer().(prometheus.Gatherer)
	extLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.extAddr = extLn.Addr().String()
	g.Attach("ext_proc", extLn, srv)
	apiLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.apiURL = "http://" + apiLn.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- g.Serve(ctx, apiLn) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-served:
			if err != nil && !o.notReady {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(testsupport.WaitTimeout):
			t.Errorf("Serve did not return within %v of its context ending", testsupport.WaitTimeout)
		}
	})
	f.envoy = dialEnvoy(t, f.extAddr, !o.plaintext)
	if o.notReady {
		return f
	}
	testsupport.EventuallyWhy(t, "the gateway to be ready and follow every engine", func() (string, bool) {
		resp, err := http.Get(f.apiURL + "/debug/kvcache")
		if err != nil {
			return err.Error(), false
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return string(data), resp.StatusCode == http.StatusOK && strings.Count(string(data), `"connected":true`) == n*max(o.ranks, 1)
	})
	return f
}

// unreachableKubeconfig writes a kubeconfig naming an API server nothing
// listens on.
func unreachableKubeconfig(t testing.TB) string {
	t.Helper()
	port := testsupport.FreePorts(t, 1)[0]
	text := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:%d"}}]
users: [{name: u, user: {}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`, port)
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// engine returns the engine at address.
func (f *fixture) engine(address string) *simEngine {
	for _, e := range f.engines {
		if e.address == address {
			return e
		}
	}
	return nil
}

// metric returns the value of metric name with labels (see
// testsupport.MetricValue).
func (f *fixture) metric(t testing.TB, name string, labels map[string]string) float64 {
	t.Helper()
	return testsupport.MetricValue(t, f.reg, name, labels)
}

// matchedBlocks returns how many blocks of prompt the index credits the
// engine at address with, from /debug/match.
func (f *fixture) matchedBlocks(t testing.TB, prompt, address string) int {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": simModel, "prompt": prompt})
	resp, err := http.Post(f.apiURL+"/debug/match", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m struct {
		Pods []struct {
			Pod           string `json:"pod"`
			MatchedBlocks int    `json:"matchedBlocks"`
		} `json:"pods"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		t.Fatal(err)
	}
	e := f.engine(address)
	for _, p := range m.Pods {
		if e != nil && p.Pod == "static/"+e.name {
			return p.MatchedBlocks
		}
	}
	return 0
}

// envoyMode is one configuration of Envoy's ext_proc filter: its body send
// modes, announced in the first message's protocol configuration.
type envoyMode struct {
	name      string
	req, resp filterv3.ProcessingMode_BodySendMode
	// withoutWaiting is send_body_without_waiting_for_header_response.
	withoutWaiting bool
	// unannounced leaves the protocol configuration out, as Envoy before
	// 1.34 does.
	unannounced bool
}

// The modes the shipped configurations use: BUFFERED requests and STREAMED
// responses (config/envoy/envoy.yaml, AIBrix's Envoy Gateway policy);
// STREAMED requests sent without waiting; FULL_DUPLEX_STREAMED both ways
// (the Gateway API Inference Extension's gateways).
var (
	buffered = envoyMode{name: "buffered", req: filterv3.ProcessingMode_BUFFERED, resp: filterv3.ProcessingMode_STREAMED}
	streamed = envoyMode{name: "streamed", req: filterv3.ProcessingMode_STREAMED, resp: filterv3.ProcessingMode_STREAMED,
		withoutWaiting: true}
	duplex = envoyMode{name: "full-duplex", req: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		resp: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED}
	modes = []envoyMode{buffered, streamed, duplex}
)

// envoy plays Envoy's ext_proc filter: it sends each message as Envoy sends
// it in the stream's mode, applies the answers as Envoy applies them, and
// forwards the request to the endpoint picked, as an original_dst cluster
// reading x-gateway-destination-endpoint does.
type envoy struct {
	conn   *grpc.ClientConn
	client extprocv3.ExternalProcessorClient
}

func dialEnvoy(t testing.TB, addr string, useTLS bool) *envoy {
	t.Helper()
	creds := grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}))
	if !useTLS {
		creds = grpc.WithTransportCredentials(insecure.NewCredentials())
	}
	conn, err := grpc.NewClient(addr, creds)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &envoy{conn: conn, client: extprocv3.NewExternalProcessorClient(conn)}
}

// request is an HTTP request as the client sent it to Envoy.
type request struct {
	method, path string
	headers      map[string]string
	body         string
	// pieces splits the body into that many messages in the streamed
	// modes (one when 0).
	pieces int
	// trailers ends the body with trailers rather than end_of_stream.
	trailers bool
	// subset, when not nil, is sent as the endpoint subset hint.
	subset []string
}

// completionRequest is a POST /v1/completions of prompt.
func completionRequest(prompt string, extra string) request {
	b, _ := json.Marshal(prompt)
	return request{method: http.MethodPost, path: gateway.PathCompletions,
		body: `{"model":"` + simModel + `","prompt":` + string(b) + `,"max_tokens":4` + extra + `}`}
}

// exchange is one request's stream, seen from Envoy.
type exchange struct {
	t      testing.TB
	mode   envoyMode
	stream extprocv3.ExternalProcessor_ProcessClient
	cancel context.CancelFunc
	recv   chan *extprocv3.ProcessingResponse
	errs   chan error

	// immediate is kvgate's immediate response, nil when it picked.
	immediate *extprocv3.ImmediateResponse
	// headers are the request headers as Envoy forwards them, after the
	// answers' mutations; cleared is set when the route cache was cleared.
	headers  map[string]string
	cleared  bool
	metadata *structpb.Struct
	body     []byte

	status      int
	respHeaders map[string]string
	respBody    []byte

	// overrides are the override_message_timeout values kvgate sent.
	overrides []time.Duration
}

// start opens a stream and sends the request's messages, applying the
// answers, until the request is decided: an endpoint answer, or an
// immediate response.
func (e *envoy) start(t testing.TB, mode envoyMode, r request) *exchange {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := e.client.Process(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	x := &exchange{t: t, mode: mode, stream: stream, cancel: cancel, recv: make(chan *extprocv3.ProcessingResponse, 64),
		errs: make(chan error, 1), headers: map[string]string{}}
	t.Cleanup(cancel)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				x.errs <- err
				close(x.recv)
				return
			}
			x.recv <- m
		}
	}()
	x.headers = map[string]string{":method": r.method, ":path": r.path, ":authority": "gateway.example", ":scheme": "http",
		"x-request-id": "envoy-request-id"}
	if r.body != "" {
		x.headers["content-type"] = "application/json"
		x.headers["content-length"] = strconv.Itoa(len(r.body))
	}
	for k, v := range r.headers {
		x.headers[strings.ToLower(k)] = v
	}
	first := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: headerMap(x.headers), EndOfStream: r.body == "" && !r.trailers,
	}}}
	if !mode.unannounced {
		first.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: mode.req, ResponseBodyMode: mode.resp,
			SendBodyWithoutWaitingForHeaderResponse: mode.withoutWaiting}
	}
	if r.subset != nil {
		vals := make([]*structpb.Value, len(r.subset))
		for i, s := range r.subset {
			vals[i] = structpb.NewStringValue(s)
		}
		first.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{SubsetNamespace: {
			Fields: map[string]*structpb.Value{KeySubset: structpb.NewListValue(&structpb.ListValue{Values: vals})}}}}
	}
	x.send(first)
	if r.body == "" && !r.trailers {
		x.applyRequestHeaders(x.next())
		return x
	}
	pieces := splitBody([]byte(r.body), r.pieces)
	switch {
	case mode.req == filterv3.ProcessingMode_NONE:
		// Envoy sends no body: the headers' answer is all.
		x.applyRequestHeaders(x.next())
		return x
	case mode.req == filterv3.ProcessingMode_BUFFERED || mode.req == filterv3.ProcessingMode_BUFFERED_PARTIAL:
		// Envoy waits for the headers' answer, buffers the body, and
		// sends it in one message; when trailers end the body, it sends
		// the body once they arrive, without end_of_stream, and the
		// trailers once the body's answer came.
		if !x.applyRequestHeaders(x.next()) {
			return x
		}
		x.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: []byte(r.body), EndOfStream: !r.trailers}}})
		m := x.next()
		if x.isImmediate(m) {
			return x
		}
		c := m.GetRequestBody().GetResponse()
		if c == nil {
			x.t.Fatalf("%s: answered the body with %v", mode.name, m)
		}
		x.applyMutation(x.headers, c.GetHeaderMutation())
		x.body = mutated([]byte(r.body), c.GetBodyMutation())
		x.takeMetadata(m)
		if r.trailers {
			x.sendRequestTrailers()
		}
		return x
	case mode.req == filterv3.ProcessingMode_STREAMED && !mode.withoutWaiting:
		// Envoy waits for the headers' answer before it streams the body.
		if !x.applyRequestHeaders(x.next()) {
			return x
		}
	}
	// Streamed and full-duplex modes send every piece without waiting.
	for i, p := range pieces {
		x.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: p, EndOfStream: i == len(pieces)-1 && !r.trailers}}})
	}
	if r.trailers {
		x.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{
			RequestTrailers: &extprocv3.HttpTrailers{Trailers: &corev3.HeaderMap{}}}})
	}
	if mode.withoutWaiting || mode.req == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		if !x.applyRequestHeaders(x.next()) {
			return x
		}
	}
	if mode.req == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		for {
			m := x.next()
			sb := m.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
			if sb == nil {
				x.t.Fatalf("%s: want the body streamed back, got %v", mode.name, m)
			}
			x.body = append(x.body, sb.GetBody()...)
			if sb.GetEndOfStream() || (r.trailers && len(x.body) >= len(r.body)) {
				break
			}
		}
	} else {
		for _, p := range pieces {
			m := x.next()
			c := m.GetRequestBody().GetResponse()
			if m.GetRequestBody() == nil {
				x.t.Fatalf("%s: want a body answer per piece, got %v", mode.name, m)
			}
			x.body = append(x.body, mutated(p, c.GetBodyMutation())...)
		}
	}
	if r.trailers {
		if m := x.next(); m.GetRequestTrailers() == nil {
			x.t.Fatalf("%s: want the trailers answered, got %v", mode.name, m)
		}
	}
	return x
}

// sendRequestTrailers sends the request's trailers, as Envoy does with
// request_trailer_mode SEND, and takes their answer.
func (x *exchange) sendRequestTrailers() {
	x.t.Helper()
	x.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{
		RequestTrailers: &extprocv3.HttpTrailers{Trailers: &corev3.HeaderMap{}}}})
	if m := x.next(); m.GetRequestTrailers() == nil {
		x.t.Fatalf("%s: want the request trailers answered, got %v", x.mode.name, m)
	}
}

// sendResponseTrailers sends the response's trailers, as Envoy does with
// response_trailer_mode SEND, and takes their answer: in
// FULL_DUPLEX_STREAMED, what kvgate sends of the body before it.
func (x *exchange) sendResponseTrailers() {
	x.t.Helper()
	x.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{
		ResponseTrailers: &extprocv3.HttpTrailers{Trailers: &corev3.HeaderMap{}}}})
	for {
		m := x.next()
		if m.GetResponseTrailers() != nil {
			return
		}
		sb := m.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if sb == nil || x.mode.resp != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
			x.t.Fatalf("%s: want the response trailers answered, got %v", x.mode.name, m)
		}
		x.respBody = append(x.respBody, sb.GetBody()...)
	}
}

// applyRequestHeaders applies the answer to the request headers and
// reports whether the request goes on (no immediate response).
func (x *exchange) applyRequestHeaders(m *extprocv3.ProcessingResponse) bool {
	x.t.Helper()
	if x.isImmediate(m) {
		return false
	}
	c := m.GetRequestHeaders().GetResponse()
	if m.GetRequestHeaders() == nil {
		x.t.Fatalf("%s: want the request headers answered, got %v", x.mode.name, m)
	}
	x.applyMutation(x.headers, c.GetHeaderMutation())
	x.cleared = x.cleared || c.GetClearRouteCache()
	x.takeMetadata(m)
	return true
}

func (x *exchange) isImmediate(m *extprocv3.ProcessingResponse) bool {
	if ir := m.GetImmediateResponse(); ir != nil {
		x.immediate = ir
		return true
	}
	return false
}

func (x *exchange) takeMetadata(m *extprocv3.ProcessingResponse) {
	if md := m.GetDynamicMetadata(); md != nil {
		x.metadata = md
	}
}

// destination returns the endpoint Envoy sends the request to, failing
// the test unless the header, AIBrix's header and the metadata agree.
func (x *exchange) destination() string {
	x.t.Helper()
	if x.immediate != nil {
		x.t.Fatalf("%s: kvgate answered %d itself: %s", x.mode.name, x.immediate.GetStatus().GetCode(), x.immediate.GetBody())
	}
	h := x.headers[HeaderDestination]
	md := x.metadata.GetFields()[MetadataNamespace].GetStructValue().GetFields()[HeaderDestination].GetStringValue()
	if h == "" || h != md || h != x.headers[gateway.HeaderTargetPod] {
		x.t.Fatalf("%s: endpoint header %q, metadata %q, target-pod %q; want one endpoint in all three", x.mode.name, h, md,
			x.headers[gateway.HeaderTargetPod])
	}
	return h
}

// forward sends the request to its endpoint and relays the response
// through the stream as Envoy does: its headers, then its body in the
// pieces the upstream connection delivers, read chunk bytes at a time.
func (x *exchange) forward(chunk int) {
	x.t.Helper()
	resp := x.upstream()
	defer resp.Body.Close()
	x.relayHeaders(resp, nil)
	x.relayBody(resp.Body, chunk, -1)
	x.close()
}

// upstream sends the request as forwarded to its endpoint.
func (x *exchange) upstream() *http.Response {
	x.t.Helper()
	dest := x.destination()
	req, err := http.NewRequest(x.headers[":method"], "http://"+dest+x.headers[":path"], bytes.NewReader(x.body))
	if err != nil {
		x.t.Fatal(err)
	}
	for k, v := range x.headers {
		if !strings.HasPrefix(k, ":") && k != "content-length" {
			req.Header.Set(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		x.t.Fatal(err)
	}
	return resp
}

// relayHeaders sends the response headers, with attrs as the
// response.code_details attribute when not empty, and applies the answer.
func (x *exchange) relayHeaders(resp *http.Response, attrs map[string]string) {
	x.t.Helper()
	x.status = resp.StatusCode
	x.respHeaders = map[string]string{":status": strconv.Itoa(resp.StatusCode)}
	for k := range resp.Header {
		x.respHeaders[strings.ToLower(k)] = resp.Header.Get(k)
	}
	m := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: headerMap(x.respHeaders)}}}
	if len(attrs) > 0 {
		fields := map[string]*structpb.Value{}
		for k, v := range attrs {
			fields[k] = structpb.NewStringValue(v)
		}
		m.Attributes = map[string]*structpb.Struct{"envoy.filters.http.ext_proc": {Fields: fields}}
	}
	x.send(m)
	a := x.next()
	if a.GetResponseHeaders() == nil {
		x.t.Fatalf("%s: want the response headers answered, got %v", x.mode.name, a)
	}
	x.applyMutation(x.respHeaders, a.GetResponseHeaders().GetResponse().GetHeaderMutation())
}

// relayBody sends the response body in the pieces body's reads give,
// chunk bytes at most, and collects what the client receives. It stops
// after limit pieces (all when negative) without ending the body.
func (x *exchange) relayBody(body io.Reader, chunk, limit int) {
	x.t.Helper()
	buf := make([]byte, chunk)
	sent := 0
	for limit < 0 || sent < limit {
		n, err := body.Read(buf)
		end := err == io.EOF
		if err != nil && !end {
			x.t.Fatalf("reading the upstream response: %v", err)
		}
		if n == 0 && !end {
			continue
		}
		x.sendResponsePiece(append([]byte(nil), buf[:n]...), end)
		sent++
		if end {
			return
		}
	}
}

// sendResponsePiece sends one piece of the response body and collects the
// answer: in STREAMED mode one answer per piece, in FULL_DUPLEX_STREAMED
// what kvgate sends back, all of it once the body ended.
func (x *exchange) sendResponsePiece(p []byte, end bool) {
	x.t.Helper()
	x.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{Body: p, EndOfStream: end}}})
	if x.mode.resp != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		m := x.next()
		if m.GetResponseBody() == nil {
			x.t.Fatalf("%s: want a body answer per piece, got %v", x.mode.name, m)
		}
		x.respBody = append(x.respBody, mutated(p, m.GetResponseBody().GetResponse().GetBodyMutation())...)
		return
	}
	for {
		var m *extprocv3.ProcessingResponse
		if end {
			m = x.next()
		} else {
			select {
			case m = <-x.recv:
			case <-time.After(20 * time.Millisecond):
				return // nothing back for this piece yet
			}
		}
		sb := m.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if sb == nil {
			x.t.Fatalf("%s: want the body streamed back, got %v", x.mode.name, m)
		}
		x.respBody = append(x.respBody, sb.GetBody()...)
		if sb.GetEndOfStream() {
			return
		}
	}
}

// close half-closes the stream, as Envoy does once the response ended, and
// waits for kvgate to end it.
func (x *exchange) close() {
	x.t.Helper()
	if err := x.stream.CloseSend(); err != nil {
		x.t.Fatal(err)
	}
	select {
	case m, ok := <-x.recv:
		if ok {
			x.t.Fatalf("%s: an answer after the stream's end: %v", x.mode.name, m)
		}
	case <-time.After(testsupport.WaitTimeout):
		x.t.Fatalf("%s: the stream did not end", x.mode.name)
	}
	if err := <-x.errs; err != io.EOF {
		x.t.Fatalf("%s: the stream ended with %v", x.mode.name, err)
	}
}

// send sends a message. A stream kvgate already ended takes no more, as
// Envoy sends none after an immediate response: the answers tell what
// happened.
func (x *exchange) send(m *extprocv3.ProcessingRequest) {
	x.t.Helper()
	if err := x.stream.Send(m); err != nil && err != io.EOF {
		x.t.Fatalf("%s: send: %v", x.mode.name, err)
	}
}

// next returns kvgate's next answer.
func (x *exchange) next() *extprocv3.ProcessingResponse {
	x.t.Helper()
	for {
		select {
		case m, ok := <-x.recv:
			if !ok {
				x.t.Fatalf("%s: the stream ended: %v", x.mode.name, <-x.errs)
			}
			// Envoy restarts the message's timer with an override, ignoring
			// the rest of its message, and waits on for the answer.
			if d := m.GetOverrideMessageTimeout(); d != nil {
				x.overrides = append(x.overrides, d.AsDuration())
				continue
			}
			return m
		case <-time.After(testsupport.WaitTimeout):
			x.t.Fatalf("%s: no answer within %v", x.mode.name, testsupport.WaitTimeout)
		}
		return nil
	}
}

// applyMutation applies a header mutation to h as Envoy does.
func (x *exchange) applyMutation(h map[string]string, hm *extprocv3.HeaderMutation) {
	for _, name := range hm.GetRemoveHeaders() {
		delete(h, strings.ToLower(name))
	}
	for _, o := range hm.GetSetHeaders() {
		v := string(o.GetHeader().GetRawValue())
		if v == "" {
			v = o.GetHeader().GetValue()
		}
		h[strings.ToLower(o.GetHeader().GetKey())] = v
	}
}

// mutated applies a body mutation to the piece it answers.
func mutated(piece []byte, bm *extprocv3.BodyMutation) []byte {
	switch {
	case bm == nil:
		return piece
	case bm.GetClearBody():
		return nil
	}
	if b, ok := bm.GetMutation().(*extprocv3.BodyMutation_Body); ok {
		return b.Body
	}
	return piece
}

func headerMap(h map[string]string) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for k, v := range h {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: k, RawValue: []byte(v)})
	}
	return m
}

// splitBody cuts body into n pieces (one when n < 2).
func splitBody(body []byte, n int) [][]byte {
	if n < 2 {
		return [][]byte{body}
	}
	var out [][]byte
	size := (len(body) + n - 1) / n
	for len(body) > 0 {
		k := min(size, len(body))
		out = append(out, body[:k])
		body = body[k:]
	}
	return out
}

// errorOf decodes an OpenAI-style error body.
func errorOf(t testing.TB, body []byte) (typ, code string) {
	t.Helper()
	var e struct {
		Error struct {
			Type, Code, Message string
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil || e.Error.Message == "" {
		t.Fatalf("error body %q is not an OpenAI error: %v", body, err)
	}
	return e.Error.Type, e.Error.Code
}
