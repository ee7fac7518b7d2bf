package types

import (
	"strings"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestInputTokensPrefersTokenIDs(t *testing.T) {
	tests := []struct {
		name  string
		ids   []uint32
		count int
		want  int
	}{
		{"count only", nil, 7, 7},
		{"ids win over count", []uint32{1, 2, 3}, 7, 3},
		{"empty tokenized prompt", []uint32{}, 7, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := NewRoutingContext("r1", "m")
			r.PromptTokenIDs, r.PromptTokenCount = tt.ids, tt.count
			if got := r.InputTokens(); got != tt.want {
				t.Fatalf("InputTokens() = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestTargetPodIsUnsetUntilRouted(t *testing.T) {
	r := NewRoutingContext("r1", "m")
	if r.HasRouted() || r.TargetPod() != nil || !r.RoutedAt().IsZero() {
		t.Fatal("context reports a target before routing")
	}
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}}
	r.SetTargetPod(pod)
	if !r.HasRouted() || r.TargetPod() != pod || r.RoutedAt().Before(r.ReceivedAt) {
		t.Fatalf("after SetTargetPod: routed=%v pod=%v at=%v", r.HasRouted(), r.TargetPod(), r.RoutedAt())
	}
}

func TestSetTargetPodIsSafeWithConcurrentReaders(t *testing.T) {
	r := NewRoutingContext("r1", "m")
	pods := []*v1.Pod{{ObjectMeta: metav1.ObjectMeta{Name: "a"}}, {ObjectMeta: metav1.ObjectMeta{Name: "b"}}}
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 1000 {
				if i%2 == 0 {
					r.SetTargetPod(pods[j%2])
				} else if p := r.TargetPod(); p != nil && p != pods[0] && p != pods[1] {
					t.Errorf("torn read: %v", p)
				}
			}
		}()
	}
	wg.Wait()
}

func TestLoggedClientRequestIDIsBoundedAndPrintable(t *testing.T) {
	long := strings.Repeat("a", MaxLoggedClientRequestIDBytes+1)
	for _, tc := range []struct{ sent, want string }{
		{"", ""},
		{"req-42 from app", "req-42 from app"},
		{"a\tb\x1b[31mc", "a?b?[31mc"},
		{"caf\u00e9", "caf??"},
		{long, long[:MaxLoggedClientRequestIDBytes]},
		{long[:MaxLoggedClientRequestIDBytes-1] + "\u00e9", long[:MaxLoggedClientRequestIDBytes-1] + "?"},
	} {
		r := NewRoutingContext("r1", "m")
		r.ClientRequestID = tc.sent
		if got := r.LoggedClientRequestID(); got != tc.want {
			t.Errorf("LoggedClientRequestID of %q = %q, want %q", tc.sent, got, tc.want)
		}
	}
}

func TestLoggedClientRequestIDOfAPrintableIDDoesNotAllocate(t *testing.T) {
	r := NewRoutingContext("r1", "m")
	r.ClientRequestID = strings.Repeat("id-", 100)
	if n := testing.AllocsPerRun(100, func() { _ = r.LoggedClientRequestID() }); n != 0 {
		t.Fatalf("LoggedClientRequestID allocates %v times for a printable id", n)
	}
}
