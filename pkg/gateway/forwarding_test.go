package gateway

import (
	"bufio"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// sendRaw writes one request to the gateway on a connection of its own,
// head lines (each without its line end) then a completion body framed by
// a Content-Length, which leanhttp reads, or in chunks, which takes the
// request to net/http's server, and returns the response, read whole.
func sendRaw(t *testing.T, f *testFleet, chunked bool, head ...string) *http.Response {
	t.Helper()
	c, br := dialGateway(t, f)
	body := completion("forwarded", "")
	req := "POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
	for _, h := range head {
		req += h + "\r\n"
	}
	if chunked {
		req += "Transfer-Encoding: chunked\r\n\r\n" + strconv.FormatInt(int64(len(body)), 16) + "\r\n" + body + "\r\n0\r\n\r\n"
	} else {
		req += "Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
	}
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading the response: %v", err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatalf("reading the response's body: %v", err)
	}
	return resp
}

// lastReceived returns the header of the last inference request engine e
// received.
func lastReceived(t *testing.T, e *testEngine) http.Header {
	t.Helper()
	got := e.received()
	if len(got) == 0 {
		t.Fatal("the engine received no request")
	}
	return got[len(got)-1].header
}

// TestTheEngineGetsTheClientsAddressInXForwardedFor: the request an engine
// receives carries the client's address last in X-Forwarded-For, after the
// addresses the client's own field listed, whichever server read the
// request; a field the client names in Connection is hop-by-hop and not
// kept.
func TestTheEngineGetsTheClientsAddressInXForwardedFor(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{})
	for _, tc := range []struct {
		name string
		head []string
		want string
	}{
		{"none sent", nil, "127.0.0.1"},
		{"one address sent", []string{"X-Forwarded-For: 203.0.113.9"}, "203.0.113.9, 127.0.0.1"},
		{"two fields sent", []string{"X-Forwarded-For: 203.0.113.9, 198.51.100.2", "x-forwarded-for: 192.0.2.1"},
			"203.0.113.9, 198.51.100.2, 192.0.2.1, 127.0.0.1"},
		{"named in Connection", []string{"Connection: X-Forwarded-For", "X-Forwarded-For: 203.0.113.9"}, "127.0.0.1"},
	} {
		for _, chunked := range []bool{false, true} {
			resp := sendRaw(t, f, chunked, tc.head...)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s (chunked %v): status %d", tc.name, chunked, resp.StatusCode)
			}
			if got := lastReceived(t, f.engine("a"))["X-Forwarded-For"]; len(got) != 1 || got[0] != tc.want {
				t.Errorf("%s (chunked %v): the engine got X-Forwarded-For %q, want %q", tc.name, chunked, got, tc.want)
			}
		}
	}
}

// TestARequestHeadIsWrittenWithoutAllocating: writing the head of a
// request forwarded to an engine, X-Forwarded-For included, allocates
// nothing once its buffer has room.
func TestARequestHeadIsWrittenWithoutAllocating(t *testing.T) {
	r, err := http.NewRequest(http.MethodPost, "/v1/completions", nil)
	if err != nil {
		t.Fatal(err)
	}
	r.RemoteAddr = "[2001:db8::7]:51234"
	r.Header = http.Header{"Content-Type": {"application/json"}, "X-Forwarded-For": {"203.0.113.9"},
		"Authorization": {"Bearer k"}}
	dst := make([]byte, 0, 4096)
	for _, rank := range []int{-1, 3} {
		if n := testing.AllocsPerRun(100, func() {
			dst = appendRequestHead(dst[:0], r, "10.0.0.1:8000", 42, "kvgate-1", rank)
		}); n != 0 {
			t.Errorf("writing the head with rank %d costs %v allocations, want 0", rank, n)
		}
	}
	if want := "X-Forwarded-For: 203.0.113.9, 2001:db8::7\r\n"; !strings.Contains(string(dst), want) {
		t.Errorf("the head %q lacks %q", dst, want)
	}
}

// TestAHeadNamesTheRankUnlessTheClientDid: the head of a forwarded request
// carries X-Data-Parallel-Rank with the rank the gateway pinned, none
// without one, and the client's own value, alone, when it sent one.
func TestAHeadNamesTheRankUnlessTheClientDid(t *testing.T) {
	for _, tc := range []struct {
		name   string
		client []string // the client's X-Data-Parallel-Rank values
		rank   int
		want   []string
	}{
		{"pinned", nil, 1, []string{"1"}},
		{"none", nil, -1, nil},
		{"the client's", []string{"0"}, 1, []string{"0"}},
		{"the client's without a pin", []string{"2"}, -1, []string{"2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := http.NewRequest(http.MethodPost, "/v1/completions", nil)
			if err != nil {
				t.Fatal(err)
			}
			r.RemoteAddr = "192.0.2.1:5000"
			r.Header = http.Header{"Content-Type": {"application/json"}}
			if tc.client != nil {
				r.Header[headerDPRank] = tc.client
			}
			head := appendRequestHead(nil, r, "10.0.0.1:8000", 2, "kvgate-1", tc.rank)
			req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(string(head) + "{}")))
			if err != nil {
				t.Fatalf("the head %q does not parse: %v", head, err)
			}
			if got := req.Header.Values("x-data-parallel-rank"); !slices.Equal(got, tc.want) {
				t.Errorf("X-Data-Parallel-Rank %q, want %q", got, tc.want)
			}
		})
	}
}
