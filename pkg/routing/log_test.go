package routing

import (
	"context"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"github.com/kvgate/kvgate/pkg/kvevent"
)

func TestDecisionsAreLoggedWithTheirInputsAtVerbosity4And5(t *testing.T) {
	pods := testPods(2)
	idx := newTestIndex(t)
	p := prompt(0, 1000)
	holds(t, idx, "p1", p[:800], kvevent.MediumGPU)
	r, _ := newTestRouter(t, uniformFleet(2), idx)

	for _, tt := range []struct {
		verbosity int
		want      []string
		absent    []string
	}{
		{3, nil, []string{"Routed request"}},
		{4, []string{`"msg"="Routed request"`, `"requestID"="r"`, `"pod"="ns/p1"`, `"outcome"="prefix_hit"`, `"matchedTokens"=800`, `"predictedTTFTSeconds"=`}, []string{"Routing candidates"}},
		{5, []string{`"msg"="Routing candidates"`, `"candidates"=`}, nil},
	} {
		var lines []string
		sink := funcr.New(func(prefix, args string) { lines = append(lines, args) }, funcr.Options{Verbosity: tt.verbosity})
		var d Decision
		if err := r.Route(logr.NewContext(context.Background(), sink), request("r", KVAware, p), snaps(r, pods), &d); err != nil {
			t.Fatal(err)
		}
		out := strings.Join(lines, "\n")
		for _, w := range tt.want {
			if !strings.Contains(out, w) {
				t.Errorf("verbosity %d: log lacks %s:\n%s", tt.verbosity, w, out)
			}
		}
		for _, a := range tt.absent {
			if strings.Contains(out, a) {
				t.Errorf("verbosity %d: log has %q:\n%s", tt.verbosity, a, out)
			}
		}
	}
}
