package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/internal/testredis"
	"github.com/kvgate/kvgate/pkg/redisstate"
	"github.com/kvgate/kvgate/pkg/routing"
)

func TestStoredResponsesKeepTheNewestWithinTheBoundAndAnIDsFirstEngine(t *testing.T) {
	s, err := newStoredResponses(3, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	a := &endpoint.Endpoint{Key: endpoint.Key{Namespace: "ns", Name: "a"}, UID: "uid-a", Address: "10.0.0.1:8000"}
	b := &endpoint.Endpoint{Key: endpoint.Key{Namespace: "ns", Name: "b"}, UID: "uid-b", Address: "10.0.0.2:8000"}
	for i := range 5 {
		s.record(fmt.Sprintf("resp_%d", i), a, "m")
	}
	// resp_4 made again, on another pod (a client may choose the id): the
	// requests for the first stay on its engine.
	s.record("resp_4", b, "m")
	s.record("resp_4", a, "m")
	s.record("resp_5", b, "m")
	for id, want := range map[string]*endpoint.Endpoint{"resp_0": nil, "resp_1": nil, "resp_2": nil,
		"resp_3": a, "resp_4": a, "resp_5": b} {
		o, ok := s.lookup(id)
		switch {
		case want == nil && ok:
			t.Errorf("%s is remembered on %s; the oldest beyond the bound of 3 must be forgotten", id, o.pod)
		case want != nil && (!ok || !o.is(want)):
			t.Errorf("%s: remembered %v on %+v, want %s", id, ok, o, want.Key)
		}
	}
	if n := s.len(); n != 3 {
		t.Errorf("%d responses remembered, want 3", n)
	}
	if got := counted(t, s.evicted); got != 3 {
		t.Errorf("%v evictions counted, want 3 (resp_0 to resp_2)", got)
	}
	s.record("", a, "m")
	s.record(strings.Repeat("x", maxResponseIDBytes+1), a, "m")
	if got := counted(t, s.refused); got != 3 {
		t.Errorf("%v refusals counted, want 3 (resp_4 for another pod, an empty id, one too long)", got)
	}
	if _, ok := s.lookup(strings.Repeat("x", maxResponseIDBytes+1)); ok {
		t.Error("an id beyond the bound is remembered")
	}
	// A pod that replaced the one that made a response is not its engine.
	o, _ := s.lookup("resp_4")
	if o.is(&endpoint.Endpoint{Key: a.Key, UID: "uid-a2", Address: a.Address}) {
		t.Error("a pod of the same name and address but another UID is taken for the engine that made the response")
	}
}

// responseIDs answers the fleet's Responses requests as vLLM with its
// store does, each response with an id naming the engine that made it:
// GET /v1/responses/{id} with the response (its events with stream=true),
// and POST /v1/responses/{id}/cancel refused, the response not being a
// background one. It records the requests for stored responses each
// engine received.
type responseIDs struct {
	mu     sync.Mutex
	n      int
	stored map[string][]string // engine -> "METHOD path" of the requests for stored responses
}

var responseIDPattern = regexp.MustCompile(`"id":"(resp_[a-z]+_[0-9]+)"`)

func (ids *responseIDs) answer(name string) func(w http.ResponseWriter, r *http.Request, body []byte) {
	return func(w http.ResponseWriter, r *http.Request, body []byte) {
		if id, ok := strings.CutPrefix(r.URL.Path, PathResponses+"/"); ok {
			ids.mu.Lock()
			if ids.stored == nil {
				ids.stored = map[string][]string{}
			}
			ids.stored[name] = append(ids.stored[name], r.Method+" "+r.URL.Path)
			ids.mu.Unlock()
			if id, ok = strings.CutSuffix(id, "/cancel"); ok {
				http.Error(w, `{"error":{"message":"Cannot cancel a synchronous response.","type":"invalid_request_error"}}`,
					http.StatusBadRequest)
				return
			}
			rec := &rewriter{ResponseWriter: w, from: `"id":"resp_1"`, to: `"id":"` + id + `"`}
			if r.URL.Query().Get("stream") == "true" {
				writeSSE(rec, responsesEvents("llama", responsesUsage(3)))
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(rec, responsesObject("llama", "completed", responsesOutput, responsesUsage(3)))
			return
		}
		if r.URL.Path != PathResponses {
			defaultAnswer(w, r, body)
			return
		}
		ids.mu.Lock()
		ids.n++
		id := fmt.Sprintf(`"id":"resp_%s_%d"`, name, ids.n)
		ids.mu.Unlock()
		rec := &rewriter{ResponseWriter: w, from: `"id":"resp_1"`, to: id}
		defaultAnswer(rec, r, body)
	}
}

// rewriter replaces from with to in what is written through it (each
// write holds whole events and objects).
type rewriter struct {
	http.ResponseWriter
	from, to string
}

func (w *rewriter) Write(b []byte) (int, error) {
	_, err := io.WriteString(w.ResponseWriter, strings.ReplaceAll(string(b), w.from, w.to))
	return len(b), err
}

func (w *rewriter) Flush() { w.ResponseWriter.(http.Flusher).Flush() }

// TestAFollowUpGoesToTheEngineThatMadeItsResponse routes the follow-ups of
// stored responses, which only the engine that made them holds, by random
// choice among three engines, or by an SLO-aware algorithm: each goes to
// that engine, whether the response was streamed or not; a response not
// stored, or unknown, is
// routed as any request, and counted.
func TestAFollowUpGoesToTheEngineThatMadeItsResponse(t *testing.T) {
	f := startFleet(t, []string{"a", "b", "c"}, fleetOptions{})
	ids := &responseIDs{}
	for _, e := range f.engines {
		e.setAnswer(ids.answer(e.name))
	}
	random := map[string]string{routing.HeaderRoutingStrategy: routing.Random}
	turn := func(extra string, strategy ...string) (pod, id string) {
		t.Helper()
		headers := random
		if len(strategy) > 0 {
			headers = map[string]string{routing.HeaderRoutingStrategy: strategy[0]}
		}
		resp, body := post(t, f.url+PathResponses, `{"model":"llama","input":"hi"`+extra+`}`, headers)
		m := responseIDPattern.FindSubmatch(body)
		if resp.StatusCode != http.StatusOK || m == nil {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		return resp.Header.Get(HeaderTargetPodName), string(m[1])
	}
	for _, stream := range []string{`,"stream":false`, `,"stream":true`} {
		owner, id := turn(stream)
		var record storedResponseView
		if code, body := get(t, f.adminURL+"/debug/responses/"+id); code != http.StatusOK ||
			json.Unmarshal([]byte(body), &record) != nil || record.Pod != owner || record.Result != storedOwner || record.Model != "llama" {
			t.Fatalf("GET /debug/responses/%s: %d %s; want the record of %s", id, code, body, owner)
		}
		for i := range 12 {
			// Each follow-up continues the same response, streamed or not,
			// some routed by an SLO-aware algorithm, which routes the
			// others among the engines meeting their objective.
			strategy := routing.Random
			if i%3 == 2 {
				strategy = routing.SLOPackLoad
			}
			pod, _ := turn(fmt.Sprintf(`,"previous_response_id":%q,"stream":%v`, id, i%2 == 0), strategy)
			if pod != owner {
				t.Fatalf("follow-up %d of %s (%s) went to %s; only %s, which made the response, holds it", i, id, stream, pod, owner)
			}
		}
	}
	// The stored response itself, and its cancellation, come from that
	// engine too, with their method, query and answer.
	owner, id := turn("")
	engine := f.engine(strings.TrimPrefix(owner, "static/"))
	for _, c := range []struct {
		method, path, query string
		status              int
		want                string
	}{
		{http.MethodGet, PathResponses + "/" + id, "", http.StatusOK, `"id":"` + id + `"`},
		{http.MethodGet, PathResponses + "/" + id, "stream=true&starting_after=2", http.StatusOK, "event: response.completed\n"},
		{http.MethodPost, PathResponses + "/" + id + "/cancel", "", http.StatusBadRequest, "Cannot cancel a synchronous response."},
	} {
		url := f.url + c.path
		if c.query != "" {
			url += "?" + c.query
		}
		resp, data := send(t, c.method, url, random)
		if resp.StatusCode != c.status || !strings.Contains(string(data), c.want) ||
			resp.Header.Get(HeaderTargetPodName) != owner {
			t.Fatalf("%s %s: %d from %q: %s; want %d with %q from %s", c.method, url, resp.StatusCode,
				resp.Header.Get(HeaderTargetPodName), data, c.status, c.want, owner)
		}
		got := engine.received()
		last := got[len(got)-1]
		if last.method != c.method || last.path != c.path || last.query != c.query {
			t.Errorf("the engine received %s %s?%s; want %s %s?%s", last.method, last.path, last.query, c.method, c.path, c.query)
		}
		if c.method == http.MethodGet && (last.header.Get("Content-Length") != "" || len(last.body) != 0) {
			t.Errorf("GET forwarded with Content-Length %q and a body of %d bytes", last.header.Get("Content-Length"), len(last.body))
		}
	}
	for _, path := range []string{PathResponses + "/resp_never_made", PathResponses + "/resp_never_made/cancel"} {
		method := http.MethodGet
		if strings.HasSuffix(path, "/cancel") {
			method = http.MethodPost
		}
		resp, data := send(t, method, f.url+path, nil)
		if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(data), "no record") {
			t.Errorf("%s %s: %d %s; want 404 saying the gateway has no record of the response", method, path, resp.StatusCode, data)
		}
	}
	served := `kvgate_gateway_requests_total{algorithm="random",code="200",endpoint="/v1/responses/{id}",model="llama"}`
	if got := f.metric(served); got != 2 {
		t.Errorf("%s = %v, want 2", served, got)
	}

	// The usage of each response was read with its id.
	if got := f.metric("kvgate_gateway_responses_without_usage_total"); got != 0 {
		t.Errorf("%v responses without usage, want none", got)
	}

	owners := `kvgate_gateway_stored_response_requests_total{endpoint="/v1/responses",result="owner"}`
	if got := f.metric(owners); got != 24 {
		t.Errorf("%s = %v, want 24", owners, got)
	}

	unknown := `kvgate_gateway_stored_response_requests_total{endpoint="/v1/responses",result="unknown"}`
	_, notStored := turn(`,"store":false`)
	turn(fmt.Sprintf(`,"previous_response_id":%q`, notStored))
	turn(`,"previous_response_id":"resp_never_made"`)
	if code, body := get(t, f.adminURL+"/debug/responses/"+notStored); code != http.StatusNotFound {
		t.Errorf("GET /debug/responses/ of a response not stored: %d %s; want 404", code, body)
	}
	if got := f.metric(unknown); got != 2 {
		t.Errorf("%s = %v, want 2: a response with store false, and one never made", unknown, got)
	}
}

// counted returns a counter's value.
func counted(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// storedLookups returns the look-ups in Redis f's gateway counted, by
// result.
func storedLookups(f *testFleet) map[string]float64 {
	f.t.Helper()
	n := map[string]float64{}
	for _, r := range []string{"hit", "miss", "invalid", "timeout", "error"} {
		n[r] = f.metric(`kvgate_cache_stored_response_lookups_total{result="` + r + `"}`)
	}
	return n
}

// respond sends a Responses request through f, routed by strategy, and
// returns the pod that served it and the id of its response.
func respond(f *testFleet, extra, strategy string) (pod, id string) {
	f.t.Helper()
	resp, body := post(f.t, f.url+PathResponses, `{"model":"llama","input":"hi"`+extra+`}`,
		map[string]string{routing.HeaderRoutingStrategy: strategy})
	m := responseIDPattern.FindSubmatch(body)
	if resp.StatusCode != http.StatusOK || m == nil {
		f.t.Fatalf("%d %s", resp.StatusCode, body)
	}
	return resp.Header.Get(HeaderTargetPodName), string(m[1])
}

// TestAFollowUpThroughAnotherReplicaGoesToTheEngineThatMadeItsResponse puts
// two gateway replicas sharing one Redis in front of three engines, as
// behind a load balancer: the responses made through replica 1 are
// continued, fetched and cancelled through replica 2, and each of those
// requests reaches the engine that made the response, which replica 2 asks
// Redis for once per response.
func TestAFollowUpThroughAnotherReplicaGoesToTheEngineThatMadeItsResponse(t *testing.T) {
	srv := testredis.Start(t)
	// The look-ups' bound here only keeps a loaded machine from failing
	// them.
	env := map[string]string{"KVGATE_REDIS_ADDRESS": srv.Addr, "KVGATE_STORED_RESPONSE_LOOKUP_TIMEOUT_MS": "10000"}
	one := startFleet(t, []string{"a", "b", "c"}, fleetOptions{env: env})
	two := one.replica(fleetOptions{env: env})
	ids := &responseIDs{}
	for _, e := range one.engines {
		e.setAnswer(ids.answer(e.name))
	}
	owners := map[string]string{} // response id -> pod that made it
	for _, stream := range []string{`,"stream":false`, `,"stream":true`} {
		pod, id := respond(one, stream, routing.Random)
		owners[id] = pod
	}
	testsupport.Eventually(t, "replica 1 to write the records of its 2 responses to Redis", func() bool {
		return one.metric(`kvgate_cache_stored_response_writes_total{result="written"}`) == 2
	})
	if n := storedLookups(one); n["hit"]+n["miss"]+n["invalid"]+n["timeout"]+n["error"] != 0 {
		t.Errorf("replica 1 asked Redis %v for requests naming no previous response", n)
	}

	for id, owner := range owners {
		for i := range 12 {
			strategy := routing.Random
			if i%3 == 2 {
				strategy = routing.SLOPackLoad
			}
			pod, _ := respond(two, fmt.Sprintf(`,"previous_response_id":%q,"stream":%v`, id, i%2 == 0), strategy)
			if pod != owner {
				t.Fatalf("follow-up %d of %s through replica 2 went to %s; only %s, which made the response, holds it", i, id, pod, owner)
			}
		}
		if status, body := get(t, two.url+PathResponses+"/"+id); status != http.StatusOK || !strings.Contains(body, id) {
			t.Errorf("GET %s through replica 2: %d %s", id, status, body)
		}
		if resp, body := post(t, two.url+PathResponses+"/"+id+"/cancel", `{}`, nil); resp.StatusCode != http.StatusBadRequest ||
			!strings.Contains(string(body), "Cannot cancel a synchronous response.") {
			t.Errorf("cancel %s through replica 2: %d %s; want the engine's refusal", id, resp.StatusCode, body)
		}
	}
	ids.mu.Lock()
	for engine, got := range ids.stored {
		var want []string
		for id := range owners {
			if strings.HasPrefix(id, "resp_"+engine+"_") {
				want = append(want, "GET "+PathResponses+"/"+id, "POST "+PathResponses+"/"+id+"/cancel")
			}
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("engine %s received %v, want %v", engine, got, want)
		}
	}
	ids.mu.Unlock()
	if n := storedLookups(two); n["hit"] != 2 || n["miss"]+n["invalid"]+n["timeout"]+n["error"] != 0 {
		t.Errorf("replica 2's look-ups in Redis: %v, want 2 hits, one per response", n)
	}
	for endpoint, want := range map[string]float64{PathResponses: 24, endpointStoredResponse: 2, endpointCancelResponse: 2} {
		series := fmt.Sprintf(`kvgate_gateway_stored_response_requests_total{endpoint=%q,result="owner"}`, endpoint)
		if got := two.metric(series); got != want {
			t.Errorf("replica 2: %s = %v, want %v", series, got, want)
		}
	}
}

// TestAFollowUpWhoseRecordRedisCannotGiveIsServedAsUnknown asks a replica
// for responses it did not relay: a record corrupted in Redis is ignored
// and counted, and with Redis stopped the look-up fails, counted; either
// way the follow-up is served, routed as one whose response the gateway
// has no record of, and GET of the response is answered 404 by the
// gateway. A request naming no previous response asks Redis nothing.
func TestAFollowUpWhoseRecordRedisCannotGiveIsServedAsUnknown(t *testing.T) {
	srv := testredis.Start(t)
	f := startFleet(t, []string{"a", "b"}, fleetOptions{env: map[string]string{"KVGATE_REDIS_ADDRESS": srv.Addr,
		"KVGATE_STORED_RESPONSE_LOOKUP_TIMEOUT_MS": "10000"}})
	ids := &responseIDs{}
	for _, e := range f.engines {
		e.setAnswer(ids.answer(e.name))
	}
	respond(f, "", routing.Random)
	if n := storedLookups(f); n["hit"]+n["miss"]+n["invalid"]+n["timeout"]+n["error"] != 0 {
		t.Errorf("a request naming no previous response asked Redis: %v", n)
	}
	v, err := redisstate.EncodeStoredResponse(redisstate.StoredResponse{Namespace: "static", Name: "a", Address: "x:1", Model: "llama"})
	if err != nil {
		t.Fatal(err)
	}
	for id, value := range map[string]string{"resp_garbled_1": "static/a", "resp_long_1": v + strings.Repeat("m", 2048)} {
		if err := srv.NewClient(t).Set(context.Background(), redisstate.StoredResponseKeyPrefix+id, value, 0).Err(); err != nil {
			t.Fatal(err)
		}
		respond(f, fmt.Sprintf(`,"previous_response_id":%q`, id), routing.Random)
		if status, body := get(t, f.url+PathResponses+"/"+id); status != http.StatusNotFound ||
			!strings.Contains(body, "no record of the engine") {
			t.Errorf("GET %s: %d %s, want 404 from the gateway", id, status, body)
		}
	}
	if n := storedLookups(f); n["invalid"] != 4 || n["hit"]+n["miss"]+n["timeout"]+n["error"] != 0 {
		t.Errorf("look-ups of the corrupted records: %v, want 4 invalid", n)
	}

	srv.Stop()
	respond(f, `,"previous_response_id":"resp_unreachable_1"`, routing.Random)
	if n := storedLookups(f); n["timeout"]+n["error"] != 1 {
		t.Errorf("look-ups with Redis stopped: %v, want 1 timeout or error", n)
	}
	unknown := `kvgate_gateway_stored_response_requests_total{endpoint="/v1/responses",result="unknown"}`
	if got := f.metric(unknown); got != 3 {
		t.Errorf("%s = %v, want 3", unknown, got)
	}
}
