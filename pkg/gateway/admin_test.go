package gateway

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/testsupport"
)

func TestAdminListenerAloneServesMetricsAndDebugAndShutsDownGracefully(t *testing.T) {
	for _, mode := range []struct {
		name  string
		admin bool
	}{{"one listener", false}, {"admin listener", true}} {
		t.Run(mode.name, func(t *testing.T) {
			env := map[string]string{"KVGATE_SHUTDOWN_DELAY": "3s"}
			if mode.admin {
				env["KVGATE_ADMIN_LISTEN_ADDRESS"] = fmt.Sprintf("127.0.0.1:%d", testsupport.FreePorts(t, 1)[0])
			}
			f := startFleet(t, []string{"a"}, fleetOptions{env: env})
			if mode.admin == (f.adminURL == f.url) {
				t.Fatalf("admin URL %s with API URL %s", f.adminURL, f.url)
			}
			// Where each endpoint answers: the admin endpoints move to the
			// admin listener, the probes answer on both.
			// Go's profiles are served on an admin listener only.
			adminOnAPI, profiles := http.StatusOK, http.StatusNotFound
			if mode.admin {
				adminOnAPI, profiles = http.StatusNotFound, http.StatusOK
			}
			match := `{"model":"llama","tokens":[1,2,3]}`
			for _, c := range []struct {
				url, path, body string
				want            int
			}{
				{f.url, "/healthz", "", http.StatusOK},
				{f.url, "/readyz", "", http.StatusOK},
				{f.url, "/v1/models", "", http.StatusOK},
				{f.url, "/v1/completions", completion("hi", ""), http.StatusOK},
				{f.url, "/metrics", "", adminOnAPI},
				{f.url, "/debug/kvcache", "", adminOnAPI},
				{f.url, "/debug/match", match, adminOnAPI},
				{f.url, "/debug/pprof/", "", http.StatusNotFound},
				{f.url, "/debug/pprof/heap?debug=1", "", http.StatusNotFound},
				{f.adminURL, "/healthz", "", http.StatusOK},
				{f.adminURL, "/readyz", "", http.StatusOK},
				{f.adminURL, "/metrics", "", http.StatusOK},
				{f.adminURL, "/debug/kvcache", "", http.StatusOK},
				{f.adminURL, "/debug/match", match, http.StatusOK},
				{f.adminURL, "/debug/pprof/", "", profiles},
				{f.adminURL, "/debug/pprof/heap?debug=1", "", profiles},
			} {
				status, body := request(t, c.url+c.path, c.body)
				if status != c.want {
					t.Errorf("%s%s: %d %s; want %d", c.url, c.path, status, body, c.want)
				}
			}
			if mode.admin {
				if status, _ := request(t, f.adminURL+"/v1/completions", completion("hi", "")); status != http.StatusNotFound {
					t.Errorf("the admin listener serves inference: %d", status)
				}
			}

			// A stream in flight when shutdown begins finishes; meanwhile
			// readiness fails on every listener, and an admin listener
			// serves metrics until the stream has drained.
			stream := holdStream(t, f.engine("a"), f.url)
			stopped := make(chan error, 1)
			go func() { stopped <- f.stop() }()
			for _, url := range []string{f.url, f.adminURL} {
				testsupport.EventuallyWhy(t, "readiness to fail on "+url, func() (string, bool) {
					status, body := get(t, url+"/readyz")
					return body, status == http.StatusServiceUnavailable && strings.HasPrefix(body, "shutting down")
				})
			}
			if mode.admin {
				// Once the delay is over the API listener closes, and the
				// admin listener goes on serving while the stream drains.
				testsupport.EventuallyWhy(t, "the API listener to close", func() (string, bool) {
					_, err := http.Get(f.url + "/healthz")
					return fmt.Sprint(err), err != nil
				})
				if status, _ := get(t, f.adminURL+"/metrics"); status != http.StatusOK {
					t.Errorf("metrics while draining: %d", status)
				}
			}
			stream.finish()
			waitStopped(t, stopped)
			for _, url := range []string{f.url, f.adminURL} {
				if _, err := http.Get(url + "/healthz"); err == nil {
					t.Errorf("%s still serves after Serve returned", url)
				}
			}
		})
	}
}

// request GETs url, or POSTs body to it when body is not empty, and
// returns the status and body.
func request(t *testing.T, url, body string) (int, string) {
	t.Helper()
	if body == "" {
		return get(t, url)
	}
	resp, data := post(t, url, body, nil)
	return resp.StatusCode, string(data)
}

func TestServeFailsWhenTheAdminAddressIsInUse(t *testing.T) {
	busy := testsupport.FreePorts(t, 1)[0]
	ln := listenOn(t, fmt.Sprintf("127.0.0.1:%d", busy))
	defer ln.Close()
	cfg := loadTestConfig(t, map[string]string{"KVGATE_POD_DISCOVERY": "static",
		"KVGATE_STATIC_ENDPOINTS_FILE": writeEndpoints(t, "endpoints: []\n"),
		"KVGATE_ADMIN_LISTEN_ADDRESS":  fmt.Sprintf("127.0.0.1:%d", busy)})
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	api := listenOn(t, "127.0.0.1:0")
	err = g.Serve(t.Context(), api)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprint(busy)) {
		t.Fatalf("Serve = %v, want an error naming the admin address in use", err)
	}
	if _, err := http.Get("http://" + api.Addr().String() + "/healthz"); err == nil {
		t.Error("the API listener is open after Serve failed")
	}
}

// listenOn listens on addr, failing the test when it cannot.
func listenOn(t *testing.T, addr string) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return ln
}
