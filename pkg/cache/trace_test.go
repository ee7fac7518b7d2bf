package cache

import (
	"reflect"
	"testing"
	"time"
)

func TestRequestTraceRendersBucketsAndMetaKeys(t *testing.T) {
	tr := NewRequestTrace(10 * time.Second)
	for range 3 {
		tr.AddRequest()
	}
	tr.AddRequestTrace(1000, 100) // log2: 9.97 and 6.64, in tenths: 100 and 66
	tr.AddRequestTrace(1024, 100) // log2: 10 and 6.64: same buckets
	tr.AddRequestTrace(990, 98)   // log2: 9.95 and 6.61: same buckets as the first
	tr.AddRequestTrace(0, 1)      // no tokens and one token: bucket 0
	want := map[string]int{
		"100:66": 3, "0:0": 1,
		"meta_v": 4, "meta_interval_sec": 10, "meta_precision": 10,
		"meta_total_reqs": 3, "meta_pending_reqs": 5, "meta_queueing_reqs": 2,
	}
	got := tr.ToMap(5, 2)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ToMap = %v\nwant    %v", got, want)
	}
	if RequestTraceKey("llama", 1700000010) != "aibrix:llama_request_trace_1700000010" {
		t.Fatalf("key = %s", RequestTraceKey("llama", 1700000010))
	}
	if MetaKeyQueueingRequests.String() != "meta_queueing_reqs" || RequestTraceMetaKey(42).String() != "" {
		t.Fatal("meta key names")
	}
}
