package gateway

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/endpoint"
)

// newTransport returns the transport to pods: dialled directly (no
// environment proxy), HTTP/1.1 with keep-alive, bodies passed through
// uncompressed so that the gateway can read usage and relay streams as they
// come.
func newTransport(dialTimeout time.Duration, idlePerPod int) *http.Transport {
	return &http.Transport{
		DialContext:         (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: idlePerPod,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
}

// hopHeaders are the hop-by-hop headers (RFC 9110, 7.6.1) a proxy does not
// forward, and the headers the gateway sets itself.
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// copyHeader sets the end-to-end headers of src in dst. The value slices
// are shared, not copied: neither header may modify them afterwards (Set
// and Del replace a slice, which is fine).
func copyHeader(dst, src http.Header) {
	// The headers src's Connection header names are hop-by-hop too; their
	// names are canonicalised once here, not once per header of src.
	var buf [4]string
	named := buf[:0]
	for _, c := range src["Connection"] {
		for name := range strings.SplitSeq(c, ",") {
			if name = strings.TrimSpace(name); name != "" {
				named = append(named, http.CanonicalHeaderKey(name))
			}
		}
	}
	for k, vs := range src {
		if !slices.Contains(hopHeaders, k) && !slices.Contains(named, k) {
			dst[k] = vs
		}
	}
}

// headerRequestID is the header carrying a request's id to the engine
// (vLLM uses it as the request id).
const headerRequestID = "X-Request-Id"

// newUpstreamRequest returns the request that forwards r, with body, to
// the engine at addr. The client's end-to-end headers are kept, except
// Accept-Encoding (the gateway reads the response, so it must come
// uncompressed); X-Request-Id is set to id when the client sent none.
func newUpstreamRequest(ctx context.Context, r *http.Request, addr string, body []byte, id string) *http.Request {
	h := make(http.Header, len(r.Header)+1)
	copyHeader(h, r.Header)
	h.Del("Accept-Encoding")
	h.Del("Content-Length")
	if h.Get(headerRequestID) == "" {
		h.Set(headerRequestID, id)
	}
	out := &http.Request{
		Method:        http.MethodPost,
		URL:           &url.URL{Scheme: "http", Host: addr, Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery},
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h,
		Host:          addr,
		ContentLength: int64(len(body)),
		Body:          io.NopCloser(bytes.NewReader(body)),
		GetBody: func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(body)), nil
		},
	}
	return out.WithContext(ctx)
}

// failureReason classifies an error of sending a request to a pod: a
// refused or failed dial sent nothing, so the request may go to another
// pod; any other error may have sent some of it.
func failureReason(err error) string {
	if errors.Is(err, syscall.ECONNREFUSED) {
		return failRefused
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return failDial
	}
	return failSend
}

// withoutEjected returns the pods of pods whose snapshots (snaps, in the
// same order) are not ejected: pods itself when none is ejected, and all of
// pods when every one is, so that a model whose pods all refused
// connections is still tried.
func withoutEjected(pods []*endpoint.Endpoint, snaps []cache.PodSnapshot) []*endpoint.Endpoint {
	first := slices.IndexFunc(snaps, func(s cache.PodSnapshot) bool { return s.Ejected })
	if first < 0 {
		return pods
	}
	out := slices.Clone(pods[:first])
	for i, p := range pods[first+1:] {
		if !snaps[first+1+i].Ejected {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		return pods
	}
	return out
}

// untriedReachable returns a new slice of the pods of pods other than
// tried whose snapshots (snaps, in the same order) are not ejected.
func untriedReachable(pods []*endpoint.Endpoint, snaps []cache.PodSnapshot, tried *endpoint.Endpoint) []*endpoint.Endpoint {
	out := make([]*endpoint.Endpoint, 0, len(pods))
	for i, p := range pods {
		if p.Key != tried.Key && !snaps[i].Ejected {
			out = append(out, p)
		}
	}
	return out
}
