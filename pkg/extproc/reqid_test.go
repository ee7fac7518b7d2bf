package extproc

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/gateway"
)

func TestLogsAndDebugSLOShowEnvoysRequestIDBesideTheGateways(t *testing.T) {
	var mu sync.Mutex
	var lines []string
	logger := funcr.New(func(_, args string) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, args)
	}, funcr.Options{Verbosity: 4})
	// As in TestARequestWaitingInItsQueueAsksEnvoyToWaitForIt: the second
	// request waits in its model's queue until the first ends.
	f := start(t, 1, options{env: map[string]string{
		"KVGATE_ROUTING_ALGORITHM":                         "slo-least-load-pulling",
		"KVGATE_SLO_MODELS":                                simModel + "=ttft:10s",
		"KVGATE_ROUTING_DEFAULT_PREFILL_TOKENS_PER_SECOND": "90",
		"KVGATE_EXTPROC_MAX_MESSAGE_TIMEOUT":               "20s",
	}, configure: func(c *gateway.Config) { c.Logger = logger }})

	first := completionRequest(words("first", 150), "")
	first.headers = map[string]string{"x-request-id": "client-first\tcaf\u00e9"}
	x := f.envoy.start(t, buffered, first)
	x.destination()

	// The second request's entry in GET /debug/slo, once it waits.
	waiting := make(chan string, 1)
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			if resp, err := http.Get(f.apiURL + "/debug/slo"); err == nil {
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if strings.Contains(string(body), `"waiting":[{`) {
					waiting <- string(body)
					x.cancel()
					return
				}
			}
			select {
			case <-done:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	second := completionRequest(words("second", 150), "")
	second.headers = map[string]string{"x-request-id": "client-second"}
	f.envoy.start(t, buffered, second).destination()
	select {
	case body := <-waiting:
		if !strings.Contains(body, `"clientRequestID":"client-second"`) || !strings.Contains(body, `"requestID":"kvgate-`) {
			t.Errorf("GET /debug/slo does not show the waiting request's ids, the gateway's and Envoy's client-second: %s", body)
		}
	case <-time.After(testsupport.WaitTimeout):
		t.Fatal("the second request was routed but never seen waiting")
	}

	// Each id, sanitized as the proxy's are, is logged beside the
	// gateway's own by routing and by the external processor.
	mu.Lock()
	defer mu.Unlock()
	for _, want := range []string{`"clientRequestID"="client-first?caf??"`, `"clientRequestID"="client-second"`} {
		for _, msg := range []string{`"msg"="Routed request"`, `"msg"="Picked"`} {
			found := false
			for _, l := range lines {
				if strings.Contains(l, msg) && strings.Contains(l, want) && strings.Contains(l, `"requestID"="kvgate-`) {
					found = true
				}
			}
			if !found {
				t.Errorf("no %s line with %s and the gateway's id among:\n%s", msg, want, strings.Join(lines, "\n"))
			}
		}
	}
}
