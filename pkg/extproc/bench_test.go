package extproc

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/metadata"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/gateway"
)

// benchStream is the server side of one stream for the benchmark: it hands
// the server the messages it is given and keeps the last answer.
type benchStream struct {
	ctx  context.Context
	last *extprocv3.ProcessingResponse
}

func (b *benchStream) Send(m *extprocv3.ProcessingResponse) error { b.last = m; return nil }
func (b *benchStream) Recv() (*extprocv3.ProcessingRequest, error) {
	panic("the benchmark hands messages to the stream itself")
}
func (b *benchStream) SetHeader(metadata.MD) error  { return nil }
func (b *benchStream) SendHeader(metadata.MD) error { return nil }
func (b *benchStream) SetTrailer(metadata.MD)       {}
func (b *benchStream) Context() context.Context     { return b.ctx }
func (b *benchStream) SendMsg(any) error            { return nil }
func (b *benchStream) RecvMsg(any) error            { return nil }

// reportLatencies reports the p50 and p99 of durations.
func reportLatencies(b *testing.B, durations []time.Duration) {
	slices.Sort(durations)
	at := func(q float64) float64 { return float64(durations[int(q*float64(len(durations)-1))].Nanoseconds()) }
	b.ReportMetric(at(0.5), "p50-ns")
	b.ReportMetric(at(0.99), "p99-ns")
}

// benchFixture runs two engines and the gateway, and sends prompt through
// once, so that its tokens are cached and its blocks held by the pod that
// served it.
func benchFixture(b *testing.B, prompt string) (*fixture, request) {
	f := start(b, 2, options{})
	r := completionRequest(prompt, "")
	x := f.envoy.start(b, buffered, r)
	dest := x.destination()
	x.forward(4096)
	if x.status != http.StatusOK {
		b.Fatalf("warm-up request: %d %s", x.status, x.respBody)
	}
	testsupport.Eventually(b, "the index to hold the prompt", func() bool { return f.matchedBlocks(b, prompt, dest) > 0 })
	return f, r
}

// BenchmarkDecision measures the external processor's own cost of a
// decision, as Envoy's BUFFERED mode asks for it: the request headers and
// then the whole body of a completion (about 1,000 prompt tokens, cached by
// the tokenizer and held by one pod) to the endpoint answer, the request
// recorded in the ledger; the gRPC transport is left out.
func BenchmarkDecision(b *testing.B) {
	f, r := benchFixture(b, words("bench", 500))
	srv := f.srv
	headers := &extprocv3.ProcessingRequest{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: buffered.req, ResponseBodyMode: buffered.resp},
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: headerMap(map[string]string{":method": "POST", ":path": gateway.PathCompletions, "content-type": "application/json"})}},
	}
	body := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: []byte(r.body), EndOfStream: true}}}
	durations := make([]time.Duration, 0, b.N)
	bs := &benchStream{ctx: context.Background()}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		st := srv.newStream(bs)
		if err := st.handle(headers); err != nil {
			b.Fatal(err)
		}
		if err := st.handle(body); err != nil {
			b.Fatal(err)
		}
		durations = append(durations, time.Since(t0))
		if st.pick == nil || bs.last.GetRequestBody() == nil {
			b.Fatalf("no endpoint answer: %v", bs.last)
		}
		st.finish()
	}
	b.StopTimer()
	reportLatencies(b, durations)
}

// BenchmarkDecisionOverGRPC is BenchmarkDecision through a real gRPC
// stream on loopback, as Envoy sees it: from sending the request headers
// to receiving the endpoint answer of the body.
func BenchmarkDecisionOverGRPC(b *testing.B) {
	f, r := benchFixture(b, words("bench", 500))
	durations := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		x := f.envoy.start(b, buffered, r)
		durations = append(durations, time.Since(t0))
		if x.immediate != nil || x.metadata == nil {
			b.Fatalf("no endpoint answer")
		}
		x.cancel()
	}
	b.StopTimer()
	reportLatencies(b, durations)
}
