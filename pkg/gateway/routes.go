package gateway

import (
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// routes returns the handler of the gateway's API listener and, when the
// configuration has an admin listen address, the handler of the admin
// listener, which then alone serves /metrics and /debug/*, Go's profiles
// under /debug/pprof/ among them; admin is nil otherwise, and api serves
// everything but the profiles. Both serve the probes.
func (g *Gateway) routes() (api, admin http.Handler) {
	apiMux := g.probes()
	if g.cfg.DisableProxy {
		apiMux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
			writeError(w, http.StatusNotFound, typeNotFound, codeNotFound, "",
				"the OpenAI API is not served here: send requests through the proxy whose external processor the gateway is")
		})
	} else {
		apiMux.Handle(PathCompletions, g.serveInference(kindCompletion))
		apiMux.Handle(PathChatCompletions, g.serveInference(kindChat))
		apiMux.Handle(PathMessages, g.serveInference(kindMessages))
		apiMux.Handle(PathResponses, g.serveInference(kindResponses))
		apiMux.HandleFunc(PathModels, g.serveModels)
		model := g.serveInference(kindModel)
		for _, p := range modelPaths {
			apiMux.Handle(p, model)
		}
		apiMux.HandleFunc(PathResponses+"/", g.serveStoredResponse)
		g.routePreflights(apiMux)
	}
	adminMux := apiMux
	if g.cfg.AdminListenAddress != "" {
		adminMux = g.probes()
	}
	adminMux.Handle("/metrics", promhttp.HandlerFor(g.registry, promhttp.HandlerOpts{Registry: g.registry}))
	adminMux.HandleFunc("/debug/kvcache", g.serveKVCache)
	adminMux.HandleFunc("/debug/match", g.serveMatch)
	adminMux.HandleFunc("/debug/slo", g.serveSLO)
	adminMux.HandleFunc("/debug/responses/", g.serveStoredResponseDebug)
	if adminMux == apiMux {
		return g.endingRequests(apiMux), nil
	}
	// Profiles cost CPU to take and show the program's internals: only an
	// address of their own serves them.
	adminMux.HandleFunc("/debug/pprof/", pprof.Index)
	adminMux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	adminMux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	adminMux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	adminMux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return g.endingRequests(apiMux), adminMux
}

// modelPaths are the paths of vLLM's endpoints, besides the completions,
// the chat completions, OpenAI's Responses and Anthropic's Messages, whose
// POST body names the model (a JSON object's model member; the model field
// of the audio endpoints' multipart/form-data): the proxy routes each
// request by that model, on load alone, and forwards its body as received.
// Endpoints that act on one engine (its adapters, prefix cache, sleep,
// profiler, scaling) are not among them: a gateway must not send them to
// whichever pod it picks, and they answer 404.
var modelPaths = []string{
	pathCountTokens,                           // Anthropic's token count: no generation
	"/v1/embeddings", "/pooling", "/classify", // pooling models
	"/score", "/v1/score", // cross-encoders and embedding models
	"/rerank", "/v1/rerank", "/v2/rerank", // Jina's and Cohere's rerank APIs
	"/tokenize", "/detokenize", // the model's tokenizer
	"/v1/audio/transcriptions", "/v1/audio/translations", // speech to text: multipart/form-data, the model a field
	"/v1/chat/completions/render", "/v1/completions/render", // a prompt rendered, not generated
}

// endpointOther is the endpoint label of a request to a path the gateway
// does not name (see Endpoint).
const endpointOther = "other"

// Endpoint returns the value of the endpoint label of a request to path
// (with or without its query) in the request metrics: the path itself when
// it is one of vLLM's endpoints the gateway routes (apiPaths), else "other", so that the paths clients
// write never grow a metric's series.
func Endpoint(path string) string {
	path, _, _ = strings.Cut(path, "?")
	for _, p := range apiPaths {
		if p == path {
			return p
		}
	}
	return endpointOther
}

// apiPaths are the paths of every vLLM endpoint the proxy serves.
var apiPaths = slices.Concat([]string{PathCompletions, PathChatCompletions, PathMessages, PathResponses, PathModels}, modelPaths)

// pathCountTokens is the path of Anthropic's token count.
const pathCountTokens = "/v1/messages/count_tokens"

// endingRequests tells each request's connection when the request's
// handler starts and when it ended, so that the next one's time starts at
// its own first byte and its writes are not bound by the response before.
// A request that arrives once shutdown has begun is answered with
// Connection: close (see closeWhenDraining).
func (g *Gateway) endingRequests(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.closeWhenDraining(w.Header())
		serveRequest(h, w, r)
	})
}

// connectionClose is the value of a Connection: close header. Header
// values are never modified in place, so responses share it.
var connectionClose = []string{"close"}

// closeWhenDraining sets Connection: close in the response header hd once
// shutdown has begun, before the response's head is written: the server
// closes the connection after the response, and a keep-alive client opens
// its next request's connection afresh, which the load balancer sends to
// a gateway that is not shutting down. Without it, such a client would
// keep sending on its connection through the shutdown delay, and a request
// sent as the connection is closed at the delay's end would be lost.
func (g *Gateway) closeWhenDraining(hd http.Header) {
	if g.draining.Load() {
		hd["Connection"] = connectionClose
	}
}

// probes returns a mux answering /healthz and /readyz, and 404 for paths it
// is given no handler of.
func (g *Gateway) probes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeText(w, http.StatusOK, "ok: the gateway process is alive")
	})
	mux.HandleFunc("/readyz", g.serveReadyz)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, typeNotFound, codeNotFound, "", "no endpoint at "+r.URL.Path)
	})
	return mux
}

// serveReadyz answers 200 when the gateway should receive traffic, else
// 503, with the reason in the body either way.
func (g *Gateway) serveReadyz(w http.ResponseWriter, _ *http.Request) {
	ok, reason := g.readiness()
	status := http.StatusOK
	if !ok {
		status = http.StatusServiceUnavailable
	}
	writeText(w, status, reason)
}

func writeText(w http.ResponseWriter, status int, text string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(text + "\n"))
}

// allowMethod answers 405 unless r uses method.
func allowMethod(w http.ResponseWriter, r *http.Request, method string) bool {
	if r.Method == method || (method == http.MethodGet && r.Method == http.MethodHead) {
		return true
	}
	w.Header().Set("Allow", method)
	writeError(w, http.StatusMethodNotAllowed, typeInvalidRequest, codeMethodNotAllowed, "", r.Method+" is not allowed; use "+method)
	return false
}

// readyOr503 returns the backend, answering 503 when the gateway does not
// know the pods yet.
func (g *Gateway) readyOr503(w http.ResponseWriter) *backend {
	b := g.ready()
	if b == nil {
		writeError(w, http.StatusServiceUnavailable, typeServiceUnavailable, codeNotReady, "", errNotReady.Error())
	}
	return b
}

// writeJSON answers 200 with v as JSON.
func writeJSON(w http.ResponseWriter, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "server_error", "encoding_failed", "", err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(data, '\n'))
}

// serveModels lists the models served by at least one ready pod.
func (g *Gateway) serveModels(w http.ResponseWriter, r *http.Request) {
	if !allowMethod(w, r, http.MethodGet) {
		return
	}
	b := g.readyOr503(w)
	if b == nil {
		return
	}
	writeJSON(w, g.modelList(b))
}
