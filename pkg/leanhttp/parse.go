package leanhttp

import (
	"bytes"
	"fmt"
	"net/http"
	"net/textproto"
	"net/url"
	"strings"
)

// maxFields bounds the header fields of a request read here; one with more
// goes to net/http.
const maxFields = 64

// head is a request head read here: a request line the server serves
// itself and header fields whose framing is unambiguous.
type head struct {
	method, path  string
	host          string
	header        http.Header
	contentLength int64
	close         bool
}

// parseHead parses b, a request head ending with its blank line, into h,
// when the server serves the request itself: its request line is one of
// hot's, exactly, and its fields are what net/http's server would read the
// same way, with no Transfer-Encoding or Expect, one Host, at most one
// Content-Length and at most maxFields fields. It reports false for any
// other head, which net/http then reads (and answers, when it is
// malformed).
func parseHead(b []byte, hot []hotLine, h *head) bool {
	eol := bytes.IndexByte(b, '\n')
	if eol < 1 || b[eol-1] != '\r' {
		return false
	}
	line := b[:eol-1]
	var hl *hotLine
	for i := range hot {
		if string(line) == hot[i].line {
			hl = &hot[i]
			break
		}
	}
	if hl == nil {
		return false
	}
	h.method, h.path = hl.method, hl.path
	fields := b[eol+1:]
	n := bytes.Count(fields, []byte{'\n'}) - 1 // the last ends the head
	if n > maxFields {
		return false
	}
	// One string holds the values; each field's value is a slice of it.
	text := string(fields)
	h.header = make(http.Header, n)
	values := make([]string, 0, n)
	h.contentLength = 0
	h.host, h.close = "", false
	hosts, lengths := 0, 0
	for off := 0; ; {
		eol := strings.IndexByte(text[off:], '\n')
		if eol < 1 || text[off+eol-1] != '\r' {
			return false
		}
		line := text[off : off+eol-1]
		off += eol + 1
		if line == "" {
			if off != len(text) || hosts != 1 {
				return false
			}
			// As net/http's ReadRequest.
			if vs := h.header["Pragma"]; len(vs) > 0 && vs[0] == "no-cache" && h.header["Cache-Control"] == nil {
				h.header["Cache-Control"] = []string{"no-cache"}
			}
			return true
		}
		colon := strings.IndexByte(line, ':')
		if colon <= 0 || !validName(line[:colon]) {
			return false
		}
		value := trimOWS(line[colon+1:])
		if !validValue(value) {
			return false
		}
		name := canonical(line[:colon])
		switch name {
		case "Transfer-Encoding", "Expect":
			return false
		case "Host":
			if hosts++; hosts > 1 || !validHost(value) {
				return false
			}
			h.host = value
			continue
		case "Content-Length":
			if lengths++; lengths > 1 {
				return false
			}
			cl, ok := parseLength(value)
			if !ok {
				return false
			}
			h.contentLength = cl
		case "Connection":
			if hasToken(value, "close") {
				h.close = true
			}
		}
		values = append(values, value)
		if vs, ok := h.header[name]; ok {
			h.header[name] = append(vs, value)
			continue
		}
		h.header[name] = values[len(values)-1 : len(values) : len(values)]
	}
}

// hotLine is a request line served here, as "POST /v1/completions HTTP/1.1".
type hotLine struct {
	line, method, path string
}

// hotLines returns the request lines of hot's requests, each a method and
// a path. net/http must read each line as that method and that path alone:
// the method is a token but HEAD (whose response has no body) or CONNECT,
// and the path holds no query, escape or space.
func hotLines(hot []string) ([]hotLine, error) {
	lines := make([]hotLine, 0, len(hot))
	for _, h := range hot {
		method, path, ok := strings.Cut(h, " ")
		u, err := url.ParseRequestURI(path)
		if !ok || !validName(method) || method == http.MethodHead || method == http.MethodConnect ||
			!strings.HasPrefix(path, "/") || strings.Contains(path, " ") ||
			err != nil || u.Path != path || u.RawPath != "" || u.RawQuery != "" {
			return nil, fmt.Errorf("leanhttp: hot request %q: want METHOD /path, with no query or escape", h)
		}
		lines = append(lines, hotLine{line: h + " HTTP/1.1", method: method, path: path})
	}
	return lines, nil
}

// parseLength parses a Content-Length value: decimal digits, at most 18 of
// them.
func parseLength(s string) (int64, bool) {
	if s == "" || len(s) > 18 {
		return 0, false
	}
	var n int64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// trimOWS trims the optional white space (spaces and tabs) around a field
// value.
func trimOWS(s string) string {
	for s != "" && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for s != "" && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}

// tchar marks the bytes a field name (a token, RFC 9110 5.6.2) may hold.
var tchar = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c], t[c-'a'+'A'] = true, true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()

func validName(s string) bool { return s != "" && allIn(&tchar, s) }

// allIn reports whether every byte of s is marked in set.
func allIn(set *[256]bool, s string) bool {
	for i := 0; i < len(s); i++ {
		if !set[s[i]] {
			return false
		}
	}
	return true
}

// validValue reports whether s holds no control byte but tabs.
func validValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// hostByte marks the bytes net/http's server accepts in a Host field
// (golang.org/x/net's httpguts.ValidHostHeader).
var hostByte = func() (t [256]bool) {
	for _, c := range "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ!$%&'()*+,-.:;=[]_~" {
		t[c] = true
	}
	return t
}()

func validHost(s string) bool { return allIn(&hostByte, s) }

// hasToken reports whether the comma-separated list v holds token,
// compared without case in ASCII only, as net/http does.
func hasToken(v, token string) bool {
	for t := range strings.SplitSeq(v, ",") {
		if t = trimOWS(t); len(t) == len(token) && equalFoldASCII(t, token) {
			return true
		}
	}
	return false
}

// equalFoldASCII reports whether a and b, of the same length, are equal
// but for the case of ASCII letters.
func equalFoldASCII(a, b string) bool {
	for i := 0; i < len(a); i++ {
		if lowerASCII(a[i]) != lowerASCII(b[i]) {
			return false
		}
	}
	return true
}

func lowerASCII(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// commonNames maps the field names clients send, as they usually spell
// them, to their canonical forms, so that most names cost no allocation.
var commonNames = func() map[string]string {
	m := map[string]string{}
	for _, k := range []string{"Host", "User-Agent", "Accept", "Accept-Encoding", "Accept-Language", "Authorization",
		"Connection", "Content-Length", "Content-Type", "Cookie", "Origin", "Referer", "Routing-Strategy",
		"Traceparent", "Tracestate", "Transfer-Encoding", "Expect", "X-Request-Id", "X-Forwarded-For",
		"X-Forwarded-Proto", "X-Forwarded-Host", "X-Real-Ip", "Keep-Alive", "Te", "Upgrade", "Cache-Control"} {
		m[k] = k
		m[strings.ToLower(k)] = k
	}
	return m
}()

// canonical returns a valid field name's canonical form, as net/http's
// server keys it.
func canonical(name string) string {
	if k, ok := commonNames[name]; ok {
		return k
	}
	return textproto.CanonicalMIMEHeaderKey(name)
}
