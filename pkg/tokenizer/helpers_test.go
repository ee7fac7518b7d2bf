package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata")

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newTestTokenizer returns a Tokenizer registered on a fresh registry and
// closed when the test ends.
func newTestTokenizer(t testing.TB, cfg Config) (*Tokenizer, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	tk, err := New(cfg, reg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(tk.Close)
	return tk, reg
}

// decode decodes an OpenAI request body into a request type.
func decode[T any](t testing.TB, body string) *T {
	t.Helper()
	r := new(T)
	if err := json.Unmarshal([]byte(body), r); err != nil {
		t.Fatalf("decode body %s into %T: %v", body, r, err)
	}
	return r
}

func chatRequest(t testing.TB, body string) *ChatRequest {
	t.Helper()
	return decode[ChatRequest](t, body)
}

func completionRequest(t testing.TB, body string) *CompletionRequest {
	t.Helper()
	return decode[CompletionRequest](t, body)
}

// reasonOf returns the Reason of err, which must be an *Error.
func reasonOf(t testing.TB, err error) *Error {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T) is not an *Error", err, err)
	}
	return e
}

func wantTokens(t testing.TB, got, want []uint32) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("tokens\n got %v\nwant %v", got, want)
	}
}

// count returns the value of a counter or gauge.
func count(t testing.TB, m prometheus.Metric) int {
	t.Helper()
	var pb dto.Metric
	if err := m.Write(&pb); err != nil {
		t.Fatal(err)
	}
	switch {
	case pb.Counter != nil:
		return int(pb.Counter.GetValue())
	case pb.Gauge != nil:
		return int(pb.Gauge.GetValue())
	}
	t.Fatalf("metric %v is neither a counter nor a gauge", m.Desc())
	return 0
}

// golden compares got, indented, with testdata/name, or rewrites the file
// with -update.
func golden(t testing.TB, name string, got []byte) {
	t.Helper()
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, got, "", "  "); err != nil {
		t.Fatalf("indent %s: %v", got, err)
	}
	pretty.WriteByte('\n')
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, pretty.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden file (run with -update to create it): %v", err)
	}
	if !bytes.Equal(pretty.Bytes(), want) {
		t.Errorf("%s differs from what was sent:\n got %s\nwant %s", path, pretty.Bytes(), want)
	}
}

// wantSent checks that f received exactly one request, whose body matches
// the golden file testdata/name.
func wantSent(t testing.TB, f *fakeVLLM, name string) {
	t.Helper()
	bodies := f.requestBodies()
	if len(bodies) != 1 {
		t.Fatalf("server received %d requests, want 1", len(bodies))
	}
	golden(t, name, bodies[0])
}

// wantInputError checks that err is a ReasonInput error for model and that
// f received nothing.
func wantInputError(t testing.TB, err error, f *fakeVLLM, model string) {
	t.Helper()
	if e := reasonOf(t, err); e.Reason != ReasonInput || e.Model != model {
		t.Fatalf("error %v: reason %q model %q, want input for %s", err, e.Reason, e.Model, model)
	}
	if n := f.calls.Load(); n != 0 {
		t.Fatalf("server received %d requests, want none", n)
	}
}
