package gateway

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/endpoint"
)

// maxPreflightBodyBytes bounds the body of an engine's answer to a CORS
// preflight that the gateway relays: vLLM's is "OK" or "Disallowed CORS
// ...". A longer one is answered 502.
const maxPreflightBodyBytes = 64 << 10

// isPreflight reports whether r is a browser's CORS preflight: OPTIONS
// with both Origin and Access-Control-Request-Method.
func isPreflight(r *http.Request) bool {
	if r.Method != http.MethodOptions {
		return false
	}
	_, origin := r.Header["Origin"]
	_, method := r.Header["Access-Control-Request-Method"]
	return origin && method
}

// routePreflights has mux answer the CORS preflights to the paths the
// proxy serves (apiPaths) with servePreflight; any other OPTIONS request
// to them goes to the handler mux has for it. It is called once, after those paths are
// registered.
func (g *Gateway) routePreflights(mux *http.ServeMux) {
	for _, p := range apiPaths {
		other, _ := mux.Handler(&http.Request{Method: http.MethodOptions, URL: &url.URL{Path: p}})
		mux.HandleFunc(http.MethodOptions+" "+p, func(w http.ResponseWriter, r *http.Request) {
			if !isPreflight(r) {
				other.ServeHTTP(w, r)
				return
			}
			g.servePreflight(w, r)
		})
	}
}

// servePreflight forwards a CORS preflight, which names no model, to one
// ready pod of any model and relays the engine's answer: its status, its
// end-to-end headers and its body (at most maxPreflightBodyBytes), so that
// the engines' own CORS policy answers, the one that marks their responses
// to the requests that follow. The pod is drawn at random among the ready
// pods not ejected (all of them when all are): preflights are few and
// cheap, browsers cache the answers, and a draw needs no state shared
// between requests. A pod that cannot be connected to is ejected, and the
// next one tried. The answer, headers and body, must come within
// Config.FirstByteTimeout (and Config.ResponseTimeout), else 504; a failed
// or oversized answer is 502, no ready pod 503. Preflights are counted in
// kvgate_gateway_requests_total with an empty model and algorithm, and
// not timed.
func (g *Gateway) servePreflight(w http.ResponseWriter, r *http.Request) {
	status := http.StatusOK
	defer func() {
		g.metrics.requests.WithLabelValues("", g.metrics.status(status), "", Endpoint(r.URL.Path)).Inc()
	}()
	fail := func(s int, typ, code, msg string) {
		status = s
		writeErrorShaped(w, IsAnthropicPath(r.URL.Path), s, typ, code, "", msg)
	}
	b := g.ready()
	if b == nil {
		fail(http.StatusServiceUnavailable, typeServiceUnavailable, codeNotReady, errNotReady.Error())
		return
	}
	pods := readyPods(b.store)
	if len(pods) == 0 {
		fail(http.StatusServiceUnavailable, typeServiceUnavailable, codeNoReadyPod, "no pod is ready to answer the CORS preflight")
		return
	}
	pods = withoutEjected(pods, b.store.Snapshots(pods, nil))
	first := rand.IntN(len(pods))
	var tried []string
	for i := range pods {
		pod := pods[(first+i)%len(pods)]
		s, headersRead, err := g.relayPreflight(w, r, pod)
		if err == nil {
			status = s
			return
		}
		if r.Context().Err() != nil {
			status = statusClientClosed
			return
		}
		where := fmt.Sprintf("pod %s (%s)", pod.Key, pod.Address)
		reason := failureReason(err)
		switch {
		case reason == failRefused || reason == failDial:
			g.metrics.upstreamFails.WithLabelValues(reason).Inc()
			b.store.EjectPod(pod, cache.EjectionReason(reason))
			tried = append(tried, where)
			continue
		case errors.Is(err, errPreflightTooLarge):
			fail(http.StatusBadGateway, typeUpstream, codeUpstreamFailed, where+" answered the CORS preflight with a body: "+err.Error())
		case errors.Is(err, os.ErrDeadlineExceeded):
			g.metrics.upstreamFails.WithLabelValues(failFirstByteTimeout).Inc()
			fail(http.StatusGatewayTimeout, typeUpstream, codeUpstreamTimeout,
				fmt.Sprintf("%s did not answer the CORS preflight within %v", where, min(g.cfg.FirstByteTimeout, g.cfg.ResponseTimeout)))
		default:
			if headersRead {
				reason = failBody
			}
			g.metrics.upstreamFails.WithLabelValues(reason).Inc()
			fail(http.StatusBadGateway, typeUpstream, codeUpstreamFailed, fmt.Sprintf("%s failed to answer the CORS preflight: %v", where, err))
		}
		return
	}
	fail(http.StatusServiceUnavailable, typeServiceUnavailable, codePodsUnreachable,
		"no pod could be reached to answer the CORS preflight: "+strings.Join(tried, ", "))
}

// readyPods returns the ready pods of store.
func readyPods(store *cache.Store) []*endpoint.Endpoint {
	return slices.DeleteFunc(store.ListPods(), func(p *endpoint.Endpoint) bool { return !p.Ready() })
}

// errPreflightTooLarge reports an engine's answer to a preflight whose
// body exceeds maxPreflightBodyBytes.
var errPreflightTooLarge = fmt.Errorf("longer than %d bytes", maxPreflightBodyBytes)

// relayPreflight sends the preflight r to pod and relays the answer to w,
// returning its status. It fails, having written nothing, when the pod
// could not be reached (a dial error: nothing was sent), sent no whole
// answer in time, or an answer whose body exceeds maxPreflightBodyBytes;
// headersRead reports whether the answer's headers had come.
func (g *Gateway) relayPreflight(w http.ResponseWriter, r *http.Request, pod *endpoint.Endpoint) (status int, headersRead bool, err error) {
	bound := min(g.cfg.FirstByteTimeout, g.cfg.ResponseTimeout)
	deadline := time.Now().Add(bound)
	pc, err := g.send(r.Context(), pod.Address, appendPreflightHead(nil, r, pod.Address), nil)
	if err != nil {
		return 0, false, err
	}
	// The whole answer, not only its headers, is bounded.
	pc.dr.end = deadline
	var res podResponse
	if err := pc.readResponse(&res, bound); err != nil {
		pc.close()
		return 0, false, err
	}
	defer res.finish()
	body, err := io.ReadAll(io.LimitReader(&res.body, maxPreflightBodyBytes+1))
	if err == nil && len(body) > maxPreflightBodyBytes {
		err = errPreflightTooLarge
	}
	if err != nil {
		return 0, true, err
	}
	var vals headerValues
	h := w.Header()
	copyResponseHeader(h, &res, &vals)
	if res.status != http.StatusNoContent && res.status != http.StatusNotModified {
		h.Set("Content-Length", strconv.Itoa(len(body)))
	}
	w.WriteHeader(res.status)
	_, _ = w.Write(body)
	return res.status, true, nil
}

// appendPreflightHead appends to dst the head of the request forwarding
// the preflight r to the engine at addr: its request line, Host, the
// client's end-to-end headers (those appendRequestHead forwards; an
// X-Request-Id only when the client sent one) and X-Forwarded-For. The
// request has no body.
func appendPreflightHead(dst []byte, r *http.Request, addr string) []byte {
	return appendHead(dst, http.MethodOptions, r, addr, -1, "", -1)
}
