package extproc

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/pkg/discovery"
	"github.com/kvgate/kvgate/pkg/gateway"
)

// tableRewriter rewrites models by a discovery.RewriteTable.
type tableRewriter struct{ t *discovery.RewriteTable }

func (r tableRewriter) RewriteModel(model string) (string, bool) { return r.t.Resolve(model, nil) }

// aliasRewriter rewrites each model of aliases to its value.
func aliasRewriter(aliases map[string]string) tableRewriter {
	rw := &discovery.InferenceModelRewrite{}
	for from, to := range aliases {
		var m discovery.ModelRewriteMatch
		m.Model.Value = from
		rw.Spec.Rules = append(rw.Spec.Rules, discovery.ModelRewriteRule{Matches: []discovery.ModelRewriteMatch{m},
			Targets: []discovery.ModelRewriteTarget{{ModelRewrite: to}}})
	}
	t, _ := discovery.NewRewriteTable([]*discovery.InferenceModelRewrite{rw})
	return tableRewriter{t}
}

// servedModel returns the model the engine's response names: its JSON
// body's, or its first event's.
func servedModel(body []byte) string {
	s := string(body)
	if i := strings.Index(s, "data: {"); i >= 0 {
		s = s[i+len("data: "):]
		s, _, _ = strings.Cut(s, "\n")
	}
	var out struct {
		Model string `json:"model"`
	}
	_ = json.Unmarshal([]byte(s), &out)
	return out.Model
}

func TestARewrittenModelReachesTheEngineInEveryBodyMode(t *testing.T) {
	f := start(t, 1, options{configure: func(c *gateway.Config) {
		c.ModelRewrites = aliasRewriter(map[string]string{"alias": simModel})
	}})
	tests := []struct {
		name, model, header, extra string
	}{
		{"a rule", "alias", "", ""},
		{"a rule, streamed", "alias", "", `,"stream":true`},
		{"the header", "unknown", simModel, ""},
		{"the header over a rule", "alias", simModel, `,"stream":true,"stream_options":{"include_usage":true}`},
	}
	for _, mode := range modes {
		for _, tt := range tests {
			t.Run(mode.name+"/"+tt.name, func(t *testing.T) {
				r := completionRequest("rewrite me", tt.extra)
				r.body = strings.Replace(r.body, `"model":"`+simModel+`"`, `"model":"`+tt.model+`"`, 1)
				r.pieces = 2
				if tt.header != "" {
					r.headers = map[string]string{gateway.HeaderModelRewrite: tt.header}
				}
				x := f.envoy.start(t, mode, r)
				if x.immediate != nil {
					t.Fatalf("refused: %d %s", x.immediate.GetStatus().GetCode(), x.immediate.GetBody())
				}
				if !strings.Contains(string(x.body), `"model":"`+simModel+`"`) || strings.Contains(string(x.body), `"model":"`+tt.model+`"`) {
					t.Fatalf("forwarded body %s; want it to name %s", x.body, simModel)
				}
				if cl, ok := x.headers["content-length"]; ok && cl != fmt.Sprint(len(x.body)) {
					t.Errorf("content-length %s for a body of %d bytes", cl, len(x.body))
				}
				x.forward(64)
				if x.status != http.StatusOK || servedModel(x.respBody) != simModel {
					t.Fatalf("the engine answered %d %s; want %s served", x.status, x.respBody, simModel)
				}
			})
		}
	}
	if got := f.metric(t, "kvgate_gateway_model_rewrites_total", map[string]string{"source": "rule"}); got != float64(2*len(modes)) {
		t.Errorf("rule rewrites = %v, want %d", got, 2*len(modes))
	}
	if got := f.metric(t, "kvgate_gateway_model_rewrites_total", map[string]string{"source": "header"}); got != float64(2*len(modes)) {
		t.Errorf("header rewrites = %v, want %d", got, 2*len(modes))
	}

	r := completionRequest("too long", "")
	r.headers = map[string]string{gateway.HeaderModelRewrite: strings.Repeat("m", gateway.MaxModelRewriteHeaderBytes+1)}
	x := f.envoy.start(t, buffered, r)
	if x.immediate == nil || x.immediate.GetStatus().GetCode() != http.StatusBadRequest ||
		!strings.Contains(string(x.immediate.GetBody()), gateway.HeaderModelRewrite) {
		t.Fatalf("a header value past its bound: %v; want 400 naming the header", x.immediate)
	}
}
