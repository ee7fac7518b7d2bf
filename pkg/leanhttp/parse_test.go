package leanhttp

import (
	"bufio"
	"bytes"
	"net/http"
	"net/textproto"
	"reflect"
	"strings"
	"testing"
)

// fuzzHot are the hot requests of the fuzz target, as the gateway serves
// them.
var fuzzHot = []string{"POST /v1/completions", "POST /v1/chat/completions"}

// FuzzParseHeadAgreesWithNetHTTP checks that a request head parseHead
// accepts is one net/http's server reads, and reads the same way (method,
// path, Host, Content-Length, Close and every field), and that a head
// net/http rejects is never accepted.
func FuzzParseHeadAgreesWithNetHTTP(f *testing.F) {
	const line = "POST /v1/completions HTTP/1.1\r\n"
	for _, seed := range []string{
		// Plain, as clients send it, with the body after the head.
		line + "Host: gw:8080\r\nContent-Type: application/json\r\nContent-Length: 17\r\n\r\n{\"prompt\": \"hi\"}\n",
		"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nUser-Agent: test/1.0\r\nAccept: */*\r\nContent-Length: 2\r\n\r\n{}",
		// Lower-case and odd-case names.
		line + "host: gw\r\ncontent-length: 2\r\nx-request-id: abc\r\nX-rEqUeSt-iD: def\r\n\r\n",
		// Duplicate fields.
		line + "Host: gw\r\nAccept: a\r\nAccept: b\r\nX-Tag: 1\r\nx-tag: 2\r\n\r\n",
		// An obs-fold continuation line.
		line + "Host: gw\r\nX-Long: a\r\n  b\r\n\r\n",
		line + "Host: gw\r\nX-Long: a\r\n\tb\r\n\r\n",
		// Bare LF line ends.
		line + "Host: gw\nContent-Length: 1\r\n\r\n",
		"POST /v1/completions HTTP/1.1\nHost: gw\n\r\n\r\n",
		line + "Host: gw\r\n\nX: y\r\n\r\n",
		// Transfer-Encoding, alone or with a Content-Length.
		line + "Host: gw\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		line + "Host: gw\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
		// Two Content-Lengths, equal or not.
		line + "Host: gw\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n",
		line + "Host: gw\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
		// Content-Lengths with a sign, spaces, leading zeros, too many digits.
		line + "Host: gw\r\nContent-Length: +3\r\n\r\n",
		line + "Host: gw\r\nContent-Length: -1\r\n\r\n",
		line + "Host: gw\r\nContent-Length:  3 \r\n\r\n",
		line + "Host: gw\r\nContent-Length: 3 3\r\n\r\n",
		line + "Host: gw\r\nContent-Length: 0003\r\n\r\n",
		line + "Host: gw\r\nContent-Length: 0x3\r\n\r\n",
		line + "Host: gw\r\nContent-Length:\r\n\r\n",
		line + "Host: gw\r\nContent-Length: 99999999999999999999\r\n\r\n",
		// No Host, an empty one, two of them, malformed ones.
		line + "Content-Length: 0\r\n\r\n",
		line + "Host:\r\n\r\n",
		line + "Host: a\r\nHost: b\r\n\r\n",
		line + "Host: a b\r\n\r\n",
		line + "Host: gw/path\r\n\r\n",
		line + "Host: [::1]:8080\r\n\r\n",
		// Connection options.
		line + "Host: gw\r\nConnection: close\r\n\r\n",
		line + "Host: gw\r\nConnection: keep-alive, close\r\n\r\n",
		line + "Host: gw\r\nConnection: Keep-Alive\r\nConnection: CLOSE\r\n\r\n",
		line + "Host: gw\r\nConnection: clo\u017fe\r\n\r\n", // a long s, which Unicode folds to s
		// A tab in a value, spaces around one.
		line + "Host: gw\r\nX-Tab: a\tb\t\r\nX-Space:   c d   \r\n\r\n",
		// Non-ASCII and control bytes in values.
		line + "Host: gw\r\nX-Name: caf\xc3\xa9 \xff\r\n\r\n",
		line + "Host: gw\r\nX-Ctl: a\x01b\r\n\r\n",
		line + "Host: gw\r\nX-Del: a\x7fb\r\n\r\n",
		line + "Host: gw\r\nX-Cr: a\rb\r\n\r\n",
		line + "Host: gw\r\nX-Nul: \x00\r\n\r\n",
		// Malformed names: a space before the colon, none, a separator.
		line + "Host : gw\r\n\r\n",
		line + "Host: gw\r\n: empty\r\n\r\n",
		line + "Host: gw\r\nX(Y): z\r\n\r\n",
		line + "Host: gw\r\nno colon\r\n\r\n",
		// Expect, Pragma.
		line + "Host: gw\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n",
		line + "Host: gw\r\nPragma: no-cache\r\n\r\n",
		line + "Host: gw\r\nPragma: no-cache\r\nCache-Control: max-age=0\r\n\r\n",
		// Other request lines: HTTP/1.0, a query string, another method.
		"POST /v1/completions HTTP/1.0\r\nHost: gw\r\nContent-Length: 0\r\n\r\n",
		"POST /v1/completions?stream=true HTTP/1.1\r\nHost: gw\r\n\r\n",
		"GET /v1/completions HTTP/1.1\r\nHost: gw\r\n\r\n",
		"POST  /v1/completions HTTP/1.1\r\nHost: gw\r\n\r\n",
		"POST /v1/completions HTTP/1.1 \r\nHost: gw\r\n\r\n",
		// Many fields.
		line + "Host: gw\r\n" + strings.Repeat("X-Many: v\r\n", maxFields+1) + "\r\n",
	} {
		f.Add([]byte(seed))
	}
	hot, err := hotLines(fuzzHot)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		end := bytes.Index(b, []byte("\r\n\r\n"))
		if end < 0 {
			return
		}
		in := b[:end+4]
		var h head
		ours := parseHead(in, hot, &h)
		r, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(in)))
		if err == nil {
			err = serverCheck(in, r)
		}
		if err != nil {
			if ours {
				t.Fatalf("parseHead accepted %q, which net/http rejects: %v", in, err)
			}
			return
		}
		if !ours {
			return
		}
		if r.Method != h.method || r.URL.Path != h.path || r.URL.RawPath != "" || r.URL.RawQuery != "" ||
			r.RequestURI != h.path || r.Proto != "HTTP/1.1" {
			t.Errorf("%q: net/http reads %s %q (raw path %q, query %q, URI %q, %s), parseHead %s %q",
				in, r.Method, r.URL.Path, r.URL.RawPath, r.URL.RawQuery, r.RequestURI, r.Proto, h.method, h.path)
		}
		if r.Host != h.host {
			t.Errorf("%q: net/http reads Host %q, parseHead %q", in, r.Host, h.host)
		}
		if r.ContentLength != h.contentLength {
			t.Errorf("%q: net/http reads Content-Length %d, parseHead %d", in, r.ContentLength, h.contentLength)
		}
		if r.Close != h.close {
			t.Errorf("%q: net/http reads Close %v, parseHead %v", in, r.Close, h.close)
		}
		if !reflect.DeepEqual(r.Header, h.header) {
			t.Errorf("%q: net/http reads the fields\n%q\nparseHead\n%q", in, r.Header, h.header)
		}
	})
}

// serverCheck returns an error for a request http.ReadRequest read from
// head that net/http's server still rejects with 400 (the checks of its
// conn.readRequest): a missing, repeated or malformed Host, or a field
// name or value with a byte the field's grammar does not allow.
func serverCheck(head []byte, r *http.Request) error {
	// ReadRequest drops the Host fields: read them as it does.
	tp := textproto.NewReader(bufio.NewReader(bytes.NewReader(head)))
	if _, err := tp.ReadLine(); err != nil {
		return err
	}
	fields, err := tp.ReadMIMEHeader()
	if err != nil {
		return err
	}
	hosts := fields["Host"]
	switch {
	case r.ProtoAtLeast(1, 1) && len(hosts) == 0:
		return errorString("missing Host")
	case len(hosts) > 1:
		return errorString("more than one Host")
	case len(hosts) == 1 && strings.Trim(hosts[0], hostBytes) != "":
		return errorString("malformed Host")
	}
	for k, vs := range r.Header {
		if k == "" || strings.Trim(k, tokenBytes) != "" {
			return errorString("malformed field name")
		}
		for _, v := range vs {
			for i := 0; i < len(v); i++ {
				if c := v[i]; c < ' ' && c != '\t' || c == 0x7f {
					return errorString("malformed field value")
				}
			}
		}
	}
	return nil
}

// tokenBytes are the bytes of a token (RFC 9110, 5.6.2), hostBytes the
// bytes net/http's server accepts in a Host (golang.org/x/net's
// httpguts.ValidHostHeader).
const (
	alnum      = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	tokenBytes = alnum + "!#$%&'*+-.^_`|~"
	hostBytes  = alnum + "!$%&'()*+,-.:;=[]_~"
)

type errorString string

func (e errorString) Error() string { return string(e) }

// TestParseHead checks what parseHead reads of heads it accepts, and that
// it leaves to net/http heads whose framing or fields it does not read
// exactly as net/http does.
func TestParseHead(t *testing.T) {
	hot, err := hotLines(fuzzHot)
	if err != nil {
		t.Fatal(err)
	}
	const line = "POST /v1/completions HTTP/1.1\r\n"
	t.Run("accepted", func(t *testing.T) {
		var h head
		in := line + "host: gw:80\r\ncontent-length: 0012\r\nX-Tag: a\r\nx-tag:  b \t\r\nConnection: keep-alive, Close\r\n\r\n"
		if !parseHead([]byte(in), hot, &h) {
			t.Fatalf("parseHead rejected %q", in)
		}
		want := head{method: "POST", path: "/v1/completions", host: "gw:80", contentLength: 12, close: true,
			header: http.Header{"Content-Length": {"0012"}, "X-Tag": {"a", "b"}, "Connection": {"keep-alive, Close"}}}
		if !reflect.DeepEqual(h, want) {
			t.Errorf("parseHead read\n%+v\nwant\n%+v", h, want)
		}
		// Appending to a field's values must not change another's.
		h.header["X-Tag"] = append(h.header["X-Tag"], "c")
		if got := h.header["Connection"]; !reflect.DeepEqual(got, []string{"keep-alive, Close"}) {
			t.Errorf("Connection is %q after appending to X-Tag", got)
		}
	})
	t.Run("pragma", func(t *testing.T) {
		// As net/http, a Pragma: no-cache with no Cache-Control adds one.
		var h head
		if !parseHead([]byte(line+"Host: gw\r\nPragma: no-cache\r\n\r\n"), hot, &h) {
			t.Fatal("parseHead rejected a Pragma")
		}
		if got := h.header["Cache-Control"]; !reflect.DeepEqual(got, []string{"no-cache"}) {
			t.Errorf("Cache-Control is %q, want no-cache", got)
		}
	})
	for _, in := range []string{
		"POST /v1/completions?x=1 HTTP/1.1\r\nHost: gw\r\n\r\n",
		"POST /v1/completions HTTP/1.0\r\nHost: gw\r\n\r\n",
		"POST /v1/embeddings HTTP/1.1\r\nHost: gw\r\n\r\n",
		line + "\r\n",
		line + "Host: a\r\nHost: a\r\n\r\n",
		line + "Host: gw/x\r\n\r\n",
		line + "Host: gw\r\nTransfer-Encoding: identity\r\n\r\n",
		line + "Host: gw\r\nExpect: 100-continue\r\n\r\n",
		line + "Host: gw\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
		line + "Host: gw\r\nContent-Length: 1234567890123456789\r\n\r\n",
		line + "Host: gw\r\nX: a\r\n b\r\n\r\n",
		line + "Host: gw\nX: a\r\n\r\n",
		line + "Host: gw\r\nX: a\x00\r\n\r\n",
		line + "Host: gw\r\nX : a\r\n\r\n",
		line + "Host: gw\r\n" + strings.Repeat("X: v\r\n", maxFields) + "\r\n",
	} {
		var h head
		if parseHead([]byte(in), hot, &h) {
			t.Errorf("parseHead accepted %q", in)
		}
	}
	// A token compares without case, but in ASCII only, as net/http's.
	var h head
	if !parseHead([]byte(line+"Host: gw\r\nConnection: clo\u017fe\r\n\r\n"), hot, &h) || h.close {
		t.Errorf("Connection: clo\u017fe: parseHead reads close %v, want false (net/http's reading)", h.close)
	}
}

// TestHotLines checks that only request lines net/http reads as the method
// and path they name are served here.
func TestHotLines(t *testing.T) {
	lines, err := hotLines([]string{"POST /v1/completions", "PUT /a/b.c"})
	if err != nil {
		t.Fatal(err)
	}
	want := []hotLine{{"POST /v1/completions HTTP/1.1", "POST", "/v1/completions"}, {"PUT /a/b.c HTTP/1.1", "PUT", "/a/b.c"}}
	if !reflect.DeepEqual(lines, want) {
		t.Errorf("hotLines = %q, want %q", lines, want)
	}
	for _, bad := range []string{"", "POST", "POST v1", " /v1", "P(ST /v1", "HEAD /v1", "CONNECT /v1",
		"POST /v1?x=1", "POST /v%31", "POST /a%2Fb", "POST /a b", "POST /caf\u00e9", "POST /a\x00"} {
		if _, err := hotLines([]string{bad}); err == nil {
			t.Errorf("hotLines accepted %q", bad)
		}
	}
}
