package gateway

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/routing"
)

// TestDeadEndpointsAreEjectedAndReadmittedWithoutFailingRequests runs one
// live and two dead static endpoints: no request fails, the dead ones are
// ejected by the first requests that meet them, and readmitted by their
// first successful scrape once they come back.
func TestDeadEndpointsAreEjectedAndReadmittedWithoutFailingRequests(t *testing.T) {
	f := startFleet(t, []string{"live", "dead1", "dead2"}, fleetOptions{configure: func(c *Config) {
		// Only a scrape, not the end of a backoff, readmits a pod here.
		c.Cache.EjectionBackoff, c.Cache.MaxEjectionBackoff = time.Hour, time.Hour
	}})
	dead := []*testEngine{f.engine("dead1"), f.engine("dead2")}
	for _, e := range dead {
		e.srv.Close()
	}
	send := func(alg string) *http.Response {
		t.Helper()
		resp, body := post(t, f.url+"/v1/completions", completion(sharedPrompt, ""), map[string]string{"routing-strategy": alg})
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s; want every request served", alg, resp.StatusCode, body)
		}
		return resp
	}

	// random reads no metric, so it keeps drawing the dead pods until each
	// has refused a connection and been ejected.
	testsupport.EventuallyWhy(t, "both dead pods to be ejected", func() (string, bool) {
		if got := send(routing.Random).Header.Get(HeaderTargetPodName); got != "static/live" {
			t.Fatalf("served by %s, want live", got)
		}
		n := f.metric("kvgate_cache_ejected_pods")
		return fmt.Sprintf("%v ejected", n), n == 2
	})
	for _, e := range dead {
		if n := f.metric(`kvgate_cache_pod_ejections_total{pod="static/` + e.name + `",reason="connection_refused"}`); n != 1 {
			t.Errorf("%s ejected %v times, want once", e.name, n)
		}
	}
	for _, alg := range routing.Algorithms() {
		for range 5 {
			if got := send(alg).Header.Get(HeaderTargetPodName); got != "static/live" {
				t.Fatalf("%s: served by %s, want live", alg, got)
			}
		}
	}
	m := f.match(toyTokens(sharedPrompt))
	if len(m.Pods) != 1 || m.Pods[0].Pod != "static/live" || len(m.Ejected) != 2 ||
		m.Ejected[0].Pod != "static/dead1" || m.Ejected[0].Reason != "connection_refused" || m.Ejected[0].RemainingSeconds <= 0 {
		t.Errorf("/debug/match pods %s, ejected %s; want live as the only candidate, both dead pods ejected",
			mustJSON(m.Pods), mustJSON(m.Ejected))
	}
	_, metrics := get(t, f.adminURL+"/metrics")
	if strings.Contains(metrics, `code="503"`) {
		t.Error("a request was answered 503")
	}

	// The dead engines come back: their first successful scrape readmits
	// them, and requests reach them again.
	for _, e := range dead {
		e.restart()
	}
	testsupport.EventuallyWhy(t, "the engines to be readmitted", func() (string, bool) {
		n := f.metric("kvgate_cache_ejected_pods")
		return fmt.Sprintf("%v ejected", n), n == 0
	})
	testsupport.EventuallyWhy(t, "random requests to reach every engine again", func() (string, bool) {
		send(routing.Random)
		got := fmt.Sprintf("dead1 %d, dead2 %d", len(dead[0].received()), len(dead[1].received()))
		return got, len(dead[0].received()) > 0 && len(dead[1].received()) > 0
	})
}
