package gateway

import (
	"bytes"
	"errors"
	"net"
	"net/http"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/endpoint"
)

// hopHeaders are the hop-by-hop headers (RFC 9110, 7.6.1) a proxy does not
// forward, by their canonical names.
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// connectionNamed returns the canonical names the Connection header values
// list, which are hop-by-hop too, appended to buf.
func connectionNamed(buf []string, values []string) []string {
	named := buf[:0]
	for _, c := range values {
		for name := range strings.SplitSeq(c, ",") {
			if name = strings.TrimSpace(name); name != "" {
				named = append(named, http.CanonicalHeaderKey(name))
			}
		}
	}
	return named
}

// headerRequestID is the header carrying a request's id to the engine
// (vLLM uses it as the request id).
const headerRequestID = "X-Request-Id"

// headerForwardedFor is the header listing the addresses a request came
// through, the client's last.
const headerForwardedFor = "X-Forwarded-For"

// appendRequestHead appends to dst the head of the POST request that
// forwards r, with a body of n bytes, to the engine at addr: its request
// line, Host, the client's end-to-end headers, Content-Length, X-Request-Id
// set to id when the client sent none, X-Data-Parallel-Rank set to rank
// when rank >= 0 and the client sent none, and X-Forwarded-For listing the
// addresses of the client's own X-Forwarded-For fields and then the
// client's address (r.RemoteAddr's host). Accept-Encoding is left out: the
// gateway reads the response, so it must come uncompressed.
func appendRequestHead(dst []byte, r *http.Request, addr string, n int, id string, rank int) []byte {
	return appendHead(dst, http.MethodPost, r, addr, n, id, rank)
}

// appendForwardHead appends to dst the head of the request of kind k that
// forwards r (see appendRequestHead): a request for a stored response
// keeps its method, and a GET without a body has no Content-Length.
func appendForwardHead(dst []byte, r *http.Request, k kind, addr string, n int, id string, rank int) []byte {
	if k != kindStored {
		return appendRequestHead(dst, r, addr, n, id, rank)
	}
	if r.Method == http.MethodGet && n == 0 {
		n = -1
	}
	return appendHead(dst, r.Method, r, addr, n, id, rank)
}

// appendHead is appendRequestHead for a request of any method; one with n
// < 0 has no body and no Content-Length, one with id "" gets no
// X-Request-Id but the client's, and one with rank < 0 no
// X-Data-Parallel-Rank but the client's.
func appendHead(dst []byte, method string, r *http.Request, addr string, n int, id string, rank int) []byte {
	dst = append(dst, method...)
	dst = append(dst, ' ')
	dst = append(dst, r.URL.EscapedPath()...)
	if r.URL.RawQuery != "" {
		dst = append(append(dst, '?'), r.URL.RawQuery...)
	}
	dst = append(dst, " HTTP/1.1\r\nHost: "...)
	dst = append(dst, addr...)
	dst = append(dst, "\r\n"...)
	var buf [4]string
	named := connectionNamed(buf[:], r.Header["Connection"])
	hasID, hasRank := false, false
	var forwardedFor []string
	for k, vs := range r.Header {
		// A hop-by-hop X-Request-Id is not the client's to forward: the
		// engine gets id instead.
		if slices.Contains(hopHeaders, k) || slices.Contains(named, k) {
			continue
		}
		switch k {
		case "Accept-Encoding", "Content-Length", "Host", "Expect":
			continue
		case headerForwardedFor:
			forwardedFor = vs
			continue
		case headerRequestID:
			if len(vs) == 0 || vs[0] == "" {
				continue
			}
			hasID = true
		case headerDPRank:
			hasRank = len(vs) > 0
		}
		for _, v := range vs {
			dst = append(dst, k...)
			dst = append(dst, ": "...)
			dst = append(dst, v...)
			dst = append(dst, "\r\n"...)
		}
	}
	if n >= 0 {
		dst = append(dst, "Content-Length: "...)
		dst = strconv.AppendInt(dst, int64(n), 10)
		dst = append(dst, "\r\n"...)
	}
	if !hasID && id != "" {
		dst = append(dst, headerRequestID+": "...)
		dst = append(dst, id...)
		dst = append(dst, "\r\n"...)
	}
	if !hasRank && rank >= 0 {
		dst = append(dst, headerDPRank+": "...)
		dst = strconv.AppendInt(dst, int64(rank), 10)
		dst = append(dst, "\r\n"...)
	}
	dst = appendForwardedFor(dst, forwardedFor, r.RemoteAddr)
	return append(dst, "\r\n"...)
}

// appendForwardedFor appends the X-Forwarded-For field of a request the
// client at remote (host:port) sent with the X-Forwarded-For values prior:
// prior's non-empty values, then the client's host, in one field. A remote
// that is no host:port adds nothing; without prior values either, no field
// is appended.
func appendForwardedFor(dst []byte, prior []string, remote string) []byte {
	client, _, err := net.SplitHostPort(remote)
	if err != nil {
		client = ""
	}
	start, first := len(dst), true
	dst = append(dst, headerForwardedFor+": "...)
	add := func(v string) {
		if v == "" {
			return
		}
		if !first {
			dst = append(dst, ", "...)
		}
		dst, first = append(dst, v...), false
	}
	for _, v := range prior {
		add(v)
	}
	add(client)
	if first {
		return dst[:start]
	}
	return append(dst, "\r\n"...)
}

// copyResponseHeader sets in dst the end-to-end headers of the pod's
// response res, all but Content-Length and the gateway's own response
// headers (gatewayHeaderKeys), which the gateway sets itself, their values
// from vs.
func copyResponseHeader(dst http.Header, res *podResponse, vs *headerValues) {
	var buf [4]string
	var connection []string
	for _, f := range res.fields {
		if bytes.EqualFold(res.name(f), []byte("Connection")) {
			connection = append(connection, string(res.value(f)))
		}
	}
	named := connectionNamed(buf[:], connection)
	for _, f := range res.fields {
		k := canonicalName(res.name(f))
		if k == "Content-Length" || slices.Contains(hopHeaders, k) || slices.Contains(named, k) ||
			slices.Contains(gatewayHeaderKeys, k) {
			continue
		}
		if have, ok := dst[k]; ok {
			dst[k] = append(have, vs.str(res.value(f)))
			continue
		}
		dst[k] = vs.one(vs.str(res.value(f)))
	}
}

// headerValues gives the header values of a response without allocating
// for the common ones: one-element value slices cut from a backing array,
// each slice's capacity ending with it so that appending to one copies
// it, and the strings of the values seen last, which the responses of
// engines mostly repeat (Content-Type, Server, Date within a second).
type headerValues struct {
	slots [16]string
	used  int
	seen  [8]string
	next  int
}

// maxSeenValue bounds the values headerValues keeps between responses.
const maxSeenValue = 256

// one returns a slice holding v alone.
func (h *headerValues) one(v string) []string {
	if h.used == len(h.slots) {
		return []string{v}
	}
	h.slots[h.used] = v
	h.used++
	return h.slots[h.used-1 : h.used : h.used]
}

// str returns b as a string, one seen before when they are alike.
func (h *headerValues) str(b []byte) string {
	for _, s := range h.seen {
		if s == string(b) && s != "" {
			return s
		}
	}
	s := string(b)
	if len(s) <= maxSeenValue {
		h.seen[h.next] = s
		h.next = (h.next + 1) % len(h.seen)
	}
	return s
}

// reset frees the slots for the next response; the values seen stay.
func (h *headerValues) reset() {
	clear(h.slots[:h.used])
	h.used = 0
}

// commonHeaders maps the names of the headers engines send, as they send
// them, to their canonical forms, so that reading them allocates nothing.
var commonHeaders = func() map[string]string {
	m := map[string]string{}
	for _, k := range []string{"Content-Type", "Content-Length", "Date", "Server", "Transfer-Encoding", "Connection",
		"Keep-Alive", "Cache-Control", "X-Request-Id", "Server-Timing", "Vary", "Content-Encoding", "Trailer"} {
		m[k] = k
		m[strings.ToLower(k)] = k
	}
	return m
}()

// canonicalName returns the canonical form of a header name.
func canonicalName(name []byte) string {
	if k, ok := commonHeaders[string(name)]; ok {
		return k
	}
	return textproto.CanonicalMIMEHeaderKey(string(name))
}

// failureReason classifies an error of sending a request to a pod: a
// refused or failed dial sent nothing, so the request may go to another
// pod; any other error may have sent some of it.
func failureReason(err error) string {
	if errors.Is(err, syscall.ECONNREFUSED) {
		return failRefused
	}
	if isDialError(err) {
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
