package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/kvevent/publisher"
)

// testBlockSize is the block size of the test engines, in tokens.
const testBlockSize = 16

// toyTokens is the test engines' tokenizer: one token per byte.
func toyTokens(text string) []uint32 {
	ids := make([]uint32, len(text))
	for i := range len(text) {
		ids[i] = 1000 + uint32(text[i])
	}
	return ids
}

// engineLoad is what a test engine reports on /metrics.
type engineLoad struct {
	running, waiting, kvUsage float64
	tpotSeconds               float64
}

// recorded is a request a test engine received.
type recorded struct {
	method, path, query string
	header              http.Header
	body                []byte
}

// testEngine is a vLLM engine for the gateway's tests: an httptest server
// answering /v1/completions, /v1/chat/completions and the other endpoints
// the gateway routes by model (recording what reached them), /tokenize, /v1/models
// and /metrics, and a publisher.Publisher on loopback whose events the test
// publishes.
type testEngine struct {
	t    testing.TB
	name string
	srv  *httptest.Server
	port int
	pub  *publisher.Publisher
	// pubPort and replayPort are the publisher's ports.
	pubPort, replayPort int

	mu       sync.Mutex
	load     engineLoad
	requests []recorded
	// answer, when set, replaces the default answer to inference requests.
	answer func(w http.ResponseWriter, r *http.Request, body []byte)
	// tokenizeStatus, when not 0, is the status /tokenize fails with.
	tokenizeStatus int
	// tokenizeHold, when set, holds /tokenize requests until it is closed
	// or they are cancelled; tokenizeHeld receives each one held.
	tokenizeHold chan struct{}
	tokenizeHeld chan struct{}
	// tokenized lists the model of every /tokenize request.
	tokenized []string
	// adapters are the LoRA adapters /v1/models lists.
	adapters []string
	// forget skips recording requests, for benchmarks.
	forget   bool
	nextHash uint64
}

// newTestEngine starts an engine named name.
func newTestEngine(t testing.TB, name string) *testEngine {
	t.Helper()
	e := &testEngine{t: t, name: name, load: engineLoad{tpotSeconds: 0.01}, nextHash: 1}
	e.srv = httptest.NewServer(http.HandlerFunc(e.serve))
	t.Cleanup(e.srv.Close)
	e.port = e.srv.Listener.Addr().(*net.TCPAddr).Port
	ports := testsupport.FreePorts(t, 2)
	e.pubPort, e.replayPort = ports[0], ports[1]
	cfg := publisher.DefaultPublisherConfig()
	cfg.Endpoint = fmt.Sprintf("tcp://[::ffff:127.0.0.1]:%d", e.pubPort)
	cfg.ReplayEndpoint = fmt.Sprintf("tcp://127.0.0.1:%d", e.replayPort)
	cfg.ReplayPollInterval = 5 * time.Millisecond
	cfg.Logger = klog.Background().V(4)
	var err error
	if e.pub, err = publisher.NewPublisher(cfg); err != nil {
		t.Fatalf("engine %s: NewPublisher: %v", name, err)
	}
	t.Cleanup(func() { _ = e.pub.Close() })
	return e
}

// restart serves the engine's HTTP API again on its port, after srv.Close:
// the engine came back.
func (e *testEngine) restart() {
	e.t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(e.port)))
	if err != nil {
		e.t.Fatalf("engine %s: listen again on port %d: %v", e.name, e.port, err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(e.serve))
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	e.t.Cleanup(srv.Close)
	e.srv = srv
}

// holdTokenize makes the engine hold /tokenize requests until release is
// called; held receives each request held.
func (e *testEngine) holdTokenize() (held <-chan struct{}, release func()) {
	hold, h := make(chan struct{}), make(chan struct{}, 16)
	e.mu.Lock()
	e.tokenizeHold, e.tokenizeHeld = hold, h
	e.mu.Unlock()
	var once sync.Once
	release = func() {
		once.Do(func() {
			e.mu.Lock()
			e.tokenizeHold = nil
			e.mu.Unlock()
			close(hold)
		})
	}
	e.t.Cleanup(release)
	return h, release
}

// setLoad changes what the engine reports on /metrics.
func (e *testEngine) setLoad(f func(*engineLoad)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	f(&e.load)
}

// setAnswer replaces the engine's answer to inference requests.
func (e *testEngine) setAnswer(f func(w http.ResponseWriter, r *http.Request, body []byte)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.answer = f
}

// received returns the inference requests the engine received.
func (e *testEngine) received() []recorded {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]recorded(nil), e.requests...)
}

// setAdapters changes the LoRA adapters the engine lists on /v1/models.
func (e *testEngine) setAdapters(adapters ...string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.adapters = adapters
}

// tokenizedModels returns the model of every /tokenize request so far.
func (e *testEngine) tokenizedModels() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.tokenized...)
}

// storePrompt publishes that the engine stored the whole blocks of tokens
// for the base model, and returns their engine hashes.
func (e *testEngine) storePrompt(tokens []uint32) []kvevent.BlockHash {
	e.t.Helper()
	return e.storeAdapterPrompt("", tokens)
}

// storeAdapterPrompt publishes that the engine stored the whole blocks of
// tokens computed with LoRA adapter lora ("" for the base model), and
// returns their engine hashes.
func (e *testEngine) storeAdapterPrompt(lora string, tokens []uint32) []kvevent.BlockHash {
	e.t.Helper()
	n := len(tokens) / testBlockSize
	e.mu.Lock()
	hashes := make([]kvevent.BlockHash, n)
	for i := range hashes {
		hashes[i] = e.nextHash
		e.nextHash++
	}
	e.mu.Unlock()
	e.publish(&kvevent.BlockStoredEvent{BlockHashes: hashes, TokenIDs: tokens[:n*testBlockSize],
		BlockSize: testBlockSize, Medium: kvevent.MediumGPU, GroupIdx: kvevent.NoGroup, LoraName: lora})
	return hashes
}

// removeBlocks publishes that the engine evicted blocks, one event each as
// vLLM's GPU block pool sends them.
func (e *testEngine) removeBlocks(hashes []kvevent.BlockHash) {
	e.t.Helper()
	for _, h := range hashes {
		e.publish(&kvevent.BlockRemovedEvent{BlockHashes: []kvevent.BlockHash{h}, Medium: kvevent.MediumGPU,
			GroupIdx: kvevent.NoGroup})
	}
}

func (e *testEngine) publish(ev kvevent.KVEvent) {
	e.t.Helper()
	err := e.pub.Publish(&kvevent.EventBatch{TS: float64(time.Now().UnixMicro()) / 1e6, DataParallelRank: kvevent.NoRank,
		Events: []kvevent.KVEvent{ev}})
	if err != nil {
		e.t.Fatalf("engine %s: publish: %v", e.name, err)
	}
}

func (e *testEngine) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	switch r.URL.Path {
	case "/metrics":
		e.serveMetrics(w)
	case "/tokenize":
		e.mu.Lock()
		hold, held := e.tokenizeHold, e.tokenizeHeld
		e.mu.Unlock()
		if hold != nil {
			held <- struct{}{}
			select {
			case <-hold:
			case <-r.Context().Done():
				return
			}
		}
		e.serveTokenize(w, body)
	case "/v1/models":
		e.serveModels(w)
	case "/v1/completions", "/v1/chat/completions", "/detokenize", "/v1/embeddings", "/pooling", "/classify", "/score",
		"/v1/score", "/rerank", "/v1/rerank", "/v2/rerank", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens",
		"/v1/chat/completions/render", "/v1/completions/render", "/v1/audio/transcriptions", "/v1/audio/translations":
		e.answerInference(w, r, body)
	default:
		// A stored response's GET and cancel reach the answer set, if
		// any: vLLM answers 404 unless it holds the response.
		e.mu.Lock()
		answer := e.answer
		e.mu.Unlock()
		if answer != nil && strings.HasPrefix(r.URL.Path, PathResponses+"/") {
			e.answerInference(w, r, body)
			return
		}
		http.NotFound(w, r)
	}
}

// answerInference records an inference request and answers it.
func (e *testEngine) answerInference(w http.ResponseWriter, r *http.Request, body []byte) {
	e.mu.Lock()
	if !e.forget {
		e.requests = append(e.requests, recorded{method: r.Method, path: r.URL.Path, query: r.URL.RawQuery,
			header: r.Header.Clone(), body: body})
	}
	answer := e.answer
	e.mu.Unlock()
	if answer == nil {
		answer = defaultAnswer
	}
	answer(w, r, body)
}

// serveMetrics reports the engine's load with vLLM's metric names.
func (e *testEngine) serveMetrics(w http.ResponseWriter) {
	e.mu.Lock()
	l := e.load
	e.mu.Unlock()
	labels := `engine="0",model_name="llama"`
	fmt.Fprintf(w, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{%s} %v\n", labels, l.running)
	fmt.Fprintf(w, "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{%s} %v\n", labels, l.waiting)
	fmt.Fprintf(w, "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{%s} %v\n", labels, l.kvUsage)
	fmt.Fprintf(w, "# TYPE vllm:inter_token_latency_seconds histogram\n"+
		"vllm:inter_token_latency_seconds_bucket{%s,le=\"+Inf\"} 100\n"+
		"vllm:inter_token_latency_seconds_sum{%s} %v\nvllm:inter_token_latency_seconds_count{%s} 100\n",
		labels, labels, l.tpotSeconds*100, labels)
}

// serveTokenize answers vLLM's POST /tokenize with toyTokens of the prompt,
// or of the chat messages' contents joined by newlines.
func (e *testEngine) serveTokenize(w http.ResponseWriter, body []byte) {
	e.mu.Lock()
	status := e.tokenizeStatus
	e.mu.Unlock()
	if status != 0 {
		http.Error(w, `{"error":"tokenizer failed"}`, status)
		return
	}
	var req struct {
		Model    string `json:"model"`
		Prompt   string `json:"prompt"`
		Messages []struct {
			Content string `json:"content"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	e.mu.Lock()
	e.tokenized = append(e.tokenized, req.Model)
	e.mu.Unlock()
	text := req.Prompt
	for _, m := range req.Messages {
		text += m.Content + "\n"
	}
	ids := toyTokens(text)
	out, _ := json.Marshal(map[string]any{"count": len(ids), "max_model_len": 8192, "tokens": ids, "token_strs": nil})
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}

// serveModels answers vLLM's GET /v1/models: the base model, then each
// adapter with the base model as parent.
func (e *testEngine) serveModels(w http.ResponseWriter) {
	e.mu.Lock()
	adapters := e.adapters
	e.mu.Unlock()
	cards := []string{`{"id":"llama","object":"model","owned_by":"vllm","root":"llama","parent":null,"max_model_len":8192}`}
	for _, a := range adapters {
		cards = append(cards, fmt.Sprintf(`{"id":%q,"object":"model","owned_by":"vllm","root":"/adapters/%s","parent":"llama","max_model_len":null}`, a, a))
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"object":"list","data":[%s]}`, strings.Join(cards, ","))
}

// engineRequest is what the default answer reads of an inference request.
type engineRequest struct {
	Model         string `json:"model"`
	Prompt        any    `json:"prompt"`
	Stream        bool   `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// defaultAnswer generates three tokens, as vLLM would answer: a whole
// response with usage, or a stream of chunks, with the usage chunk when
// asked for; an audio form gets a transcription.
func defaultAnswer(w http.ResponseWriter, r *http.Request, body []byte) {
	if strings.HasPrefix(r.URL.Path, "/v1/audio/") {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"text":"hello"}`)
		return
	}
	var req engineRequest
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	switch r.URL.Path {
	case PathMessages:
		answerMessages(w, req.Model, req.Stream, len(body))
		return
	case PathResponses:
		answerResponses(w, req.Model, req.Stream, len(body))
		return
	}
	prompt, _ := req.Prompt.(string)
	promptTokens := len(prompt)
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"cmpl-1","object":"text_completion","created":1,"model":%q,`+
			`"choices":[{"index":0,"text":" a b c","logprobs":null,"finish_reason":"length"}],`+
			`"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":3}}`, req.Model, promptTokens, promptTokens+3)
		return
	}
	usage := req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	writeSSE(w, streamEvents(req.Model, strings.HasSuffix(r.URL.Path, "/chat/completions"), promptTokens, usage))
}

// streamEvents returns the events of a three-token stream as vLLM sends
// them.
func streamEvents(model string, chat bool, promptTokens int, usage bool) []string {
	var events []string
	chunk := func(choice string) string {
		object := "text_completion"
		if chat {
			object = "chat.completion.chunk"
		}
		return fmt.Sprintf(`data: {"id":"cmpl-1","object":%q,"created":1,"model":%q,"choices":[%s]}`+"\n\n", object, model, choice)
	}
	if chat {
		events = append(events, chunk(`{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}`))
	}
	for i, tok := range []string{" a", " b", " c"} {
		finish := "null"
		if i == 2 {
			finish = `"length"`
		}
		if chat {
			events = append(events, chunk(fmt.Sprintf(`{"index":0,"delta":{"content":%q},"logprobs":null,"finish_reason":%s}`, tok, finish)))
		} else {
			events = append(events, chunk(fmt.Sprintf(`{"index":0,"text":%q,"logprobs":null,"finish_reason":%s}`, tok, finish)))
		}
	}
	if usage {
		events = append(events, fmt.Sprintf(`data: {"id":"cmpl-1","object":"x","created":1,"model":%q,"choices":[],`+
			`"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":3}}`+"\n\n", model, promptTokens, promptTokens+3))
	}
	return append(events, "data: [DONE]\n\n")
}

// answerMessages answers a Messages request as vLLM does, generating three
// tokens: a whole message, or its stream of events, each with the usage
// input_tokens promptTokens and output_tokens 3.
func answerMessages(w http.ResponseWriter, model string, stream bool, promptTokens int) {
	if !stream {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"msg-1","type":"message","role":"assistant","content":[{"type":"text","text":" a b c"}],`+
			`"model":%q,"stop_reason":"max_tokens","stop_sequence":null,"usage":{"input_tokens":%d,"output_tokens":3}}`, model, promptTokens)
		return
	}
	writeSSE(w, messagesEvents(model, promptTokens))
}

// messagesEvents returns the events of a three-token Messages stream as
// vLLM sends them: message_start (its usage not yet known), a text block,
// then message_delta with the usage, and message_stop.
func messagesEvents(model string, promptTokens int) []string {
	event := func(typ, data string) string { return "event: " + typ + "\ndata: " + data + "\n\n" }
	events := []string{event("message_start", fmt.Sprintf(`{"type":"message_start","message":{"id":"msg-1","type":"message",`+
		`"role":"assistant","content":[],"model":%q,"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":0,"output_tokens":0}}}`, model)),
		event("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`)}
	for _, tok := range []string{" a", " b", " c"} {
		events = append(events, event("content_block_delta",
			fmt.Sprintf(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":%q}}`, tok)))
	}
	return append(events, event("content_block_stop", `{"type":"content_block_stop","index":0}`),
		event("message_delta", fmt.Sprintf(`{"type":"message_delta","delta":{"stop_reason":"max_tokens"},`+
			`"usage":{"input_tokens":%d,"output_tokens":3}}`, promptTokens)),
		event("message_stop", `{"type":"message_stop"}`))
}

// responsesCached is the input_tokens_details.cached_tokens of the test
// engines' Responses usage.
const responsesCached = 2

// responsesUsage is the usage object of the test engines' Responses
// answers: input_tokens promptTokens, output_tokens 3.
func responsesUsage(promptTokens int) string {
	return fmt.Sprintf(`{"input_tokens":%d,"input_tokens_details":{"cached_tokens":%d},"output_tokens":3,`+
		`"output_tokens_details":{"reasoning_tokens":0},"total_tokens":%d}`, promptTokens, responsesCached, promptTokens+3)
}

// responsesObject is a Responses API response object as vLLM writes it,
// with status, output and usage (JSON values).
func responsesObject(model, status, output, usage string) string {
	return fmt.Sprintf(`{"id":"resp_1","created_at":1,"incomplete_details":null,"instructions":null,"metadata":null,`+
		`"model":%q,"object":"response","output":%s,"parallel_tool_calls":true,"temperature":1.0,"tool_choice":"auto",`+
		`"tools":[],"top_p":1.0,"background":false,"max_output_tokens":16,"max_tool_calls":null,"previous_response_id":null,`+
		`"prompt":null,"reasoning":null,"service_tier":"auto","status":%q,"text":null,"top_logprobs":null,"truncation":"disabled",`+
		`"usage":%s,"user":null}`, model, output, status, usage)
}

// responsesOutput is the output of the test engines' Responses answers:
// one message holding the three generated tokens.
const responsesOutput = `[{"id":"msg_1","content":[{"annotations":[],"text":" a b c","type":"output_text","logprobs":null}],` +
	`"role":"assistant","status":"completed","type":"message"}]`

// answerResponses answers a Responses request as vLLM does, generating
// three tokens: a whole response, or its stream of events, each with
// the usage of responsesUsage(promptTokens).
func answerResponses(w http.ResponseWriter, model string, stream bool, promptTokens int) {
	if !stream {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, responsesObject(model, "completed", responsesOutput, responsesUsage(promptTokens)))
		return
	}
	writeSSE(w, responsesEvents(model, responsesUsage(promptTokens)))
}

// responsesEvents returns the events of a three-token Responses stream as
// vLLM sends them: response.created and response.in_progress as the
// request is scheduled, the output item and its content part opened with
// the first token, a delta per token, the part and item closed, and
// response.completed carrying the whole response, its usage usage (a JSON
// value).
func responsesEvents(model, usage string) []string {
	seq := 0
	event := func(typ, members string) string {
		ev := fmt.Sprintf("event: %s\ndata: {\"type\":%q,%s,\"sequence_number\":%d}\n\n", typ, typ, members, seq)
		seq++
		return ev
	}
	start := responsesObject(model, "in_progress", "[]", "null")
	events := []string{event("response.created", `"response":`+start), event("response.in_progress", `"response":`+start),
		event("response.output_item.added", `"output_index":0,"item":{"id":"msg_1","content":[],"role":"assistant",`+
			`"status":"in_progress","type":"message"}`),
		event("response.content_part.added", `"output_index":0,"item_id":"msg_1","content_index":0,`+
			`"part":{"annotations":[],"text":"","type":"output_text","logprobs":[]}`)}
	for _, tok := range []string{" a", " b", " c"} {
		events = append(events, event("response.output_text.delta",
			fmt.Sprintf(`"content_index":0,"delta":%q,"item_id":"msg_1","logprobs":[],"output_index":0`, tok)))
	}
	return append(events,
		event("response.output_text.done", `"content_index":0,"item_id":"msg_1","logprobs":[],"output_index":0,"text":" a b c"`),
		event("response.content_part.done", `"content_index":0,"item_id":"msg_1","output_index":0,`+
			`"part":{"annotations":[],"text":" a b c","type":"output_text","logprobs":null}`),
		event("response.output_item.done", `"output_index":0,"item":`+responsesOutput[1:len(responsesOutput)-1]),
		event("response.completed", `"response":`+responsesObject(model, "completed", responsesOutput, usage)))
}

// writeSSE answers with events, flushing each.
func writeSSE(w http.ResponseWriter, events []string) {
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	for _, ev := range events {
		if _, err := io.WriteString(w, ev); err != nil {
			return
		}
		w.(http.Flusher).Flush()
	}
}

// endpointYAML is the engine's entry in a static endpoints file, declaring
// the LoRA adapters adapters.
func (e *testEngine) endpointYAML(adapters []string) string {
	y := "- name: " + e.name + "\n  address: 127.0.0.1\n  model: llama\n  port: " + strconv.Itoa(e.port) +
		"\n  pubPort: " + strconv.Itoa(e.pubPort) + "\n  replayPort: " + strconv.Itoa(e.replayPort) + "\n"
	if len(adapters) > 0 {
		y += "  loraAdapters: [" + strings.Join(adapters, ", ") + "]\n"
	}
	return y
}

// pod returns the Running, Ready pod of namespace ns standing for the
// engine, labelled with model (as given, spaces included) and with its
// ports, its KV events followed.
func (e *testEngine) pod(model string) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: e.name, UID: k8stypes.UID("uid-" + e.name),
			Labels: map[string]string{endpoint.ModelNameLabel: model, endpoint.KVEventsEnabledLabel: "true",
				endpoint.ModelPortLabel: strconv.Itoa(e.port)},
			Annotations: map[string]string{endpoint.PubPortAnnotation: strconv.Itoa(e.pubPort),
				endpoint.ReplayPortAnnotation: strconv.Itoa(e.replayPort)}},
		Status: v1.PodStatus{Phase: v1.PodRunning, PodIP: "127.0.0.1",
			Conditions: []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue}}},
	}
}
