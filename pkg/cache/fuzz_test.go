package cache

import (
	"testing"
	"time"
)

// FuzzScrapeDecode feeds arbitrary /metrics bodies through what a scrape
// does with them: filter, parse and project. A pod controls its body, so
// no body may panic, and whatever parses must project to finite counts.
func FuzzScrapeDecode(f *testing.F) {
	sel := newMetricSelection(map[string]struct{}{"vllm:request_queue_time_seconds": {}})
	// Small seeds in vLLM's shape: the fuzzer minimizes every input that
	// finds new coverage, which takes long for the kilobytes of a whole
	// exposition. The golden expositions run through the same code in the
	// projection tests.
	for _, seed := range []string{
		"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\",model_name=\"m\"} 4.0\n" +
			"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.42\n" +
			"# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} 4000.0\n" +
			"# TYPE vllm:prefix_cache_queries_total counter\nvllm:prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} 10000.0\n",
		"# TYPE vllm:time_to_first_token_seconds histogram\n" +
			"vllm:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"0.1\"} 3.0\n" +
			"vllm:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"+Inf\"} 5.0\n" +
			"vllm:time_to_first_token_seconds_count{model_name=\"m\"} 5.0\nvllm:time_to_first_token_seconds_sum{model_name=\"m\"} 1.5\n" +
			"# TYPE vllm:request_queue_time_seconds histogram\nvllm:request_queue_time_seconds_bucket{le=\"0.3\"} 1.0\n" +
			"vllm:request_queue_time_seconds_count 2.0\nvllm:request_queue_time_seconds_sum 0.7\n",
		"# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\"16\",engine=\"0\",num_gpu_blocks=\"27000\"} 1.0\n" +
			"# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{model_name=\"m\"} 0.31\n" +
			"# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total{model_name=\"m\"} 9000.0\n",
		"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} NaN\n",
		"# TYPE vllm:time_to_first_token_seconds histogram\nvllm:time_to_first_token_seconds_count -3\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		l := &scrapeLoop{proj: newProjector(time.Second, time.Second), pages: newPageMemo()}
		for i := range 2 {
			families, err := l.decode(body, sel.filter)
			if err != nil {
				return
			}
			m, _ := l.proj.project(time.Unix(int64(100+i), 0), families, sel.subscribed, []string{"m"})
			if m.pod == nil || m.models == nil {
				t.Fatal("projection without maps")
			}
		}
	})
}

// FuzzProfileUnmarshal feeds arbitrary Redis values to the profile decoder.
// A profile that decodes must answer any signature query without panicking.
func FuzzProfileUnmarshal(f *testing.F) {
	f.Add(profileJSON(f), 100.0, 1000.0)
	f.Add([]byte(`{"indexes": [[1], [2, 3]], "tputs": [[1]], "e2e": [[]]}`), 0.0, 5.0)
	f.Fuzz(func(t *testing.T, data []byte, out, in float64) {
		var p ModelGPUProfile
		if err := p.Unmarshal(data); err != nil {
			return
		}
		if len(p.Indexes) > MaxProfileIndexDimensions {
			t.Fatalf("%d index dimensions decoded", len(p.Indexes))
		}
		for _, table := range [][][]float64{p.Indexes, p.Tputs, p.E2E, p.TTFT, p.TPOT} {
			if len(table) > MaxProfileIndexValues {
				t.Fatalf("%d rows decoded", len(table))
			}
			for _, row := range table {
				if len(row) > MaxProfileIndexValues {
					t.Fatalf("%d values in a row decoded", len(row))
				}
			}
		}
		sig, err := p.GetSignature(out, in)
		if err != nil {
			return
		}
		for d, i := range sig {
			if i < 0 || i >= len(p.Indexes[d]) {
				t.Fatalf("signature %v outside index dimension %d", sig, d)
			}
		}
		_, _ = p.ThroughputRPS(sig...)
		_, _ = p.LatencySeconds(sig...)
		_, _ = p.TTFTSeconds(sig...)
		_, _ = p.TPOTSeconds(sig...)
	})
}

// FuzzCardsOfModelList feeds arbitrary /v1/models bodies to the model list
// decoder. A pod controls its body: none may panic, and whatever decodes is
// a sorted list of distinct, non-empty adapter names and of cards of
// distinct, non-empty IDs whose strings are within their bound.
func FuzzCardsOfModelList(f *testing.F) {
	f.Add([]byte(`{"object":"list","data":[{"id":"m","parent":null},{"id":"sql-lora","root":"/a","parent":"m"}]}`))
	f.Add([]byte(`{"data":[{"id":"b","parent":"m"},{"id":"a","parent":"m"},{"id":"b","parent":"m"}]}`))
	f.Add([]byte(`{"data":null}`))
	f.Add([]byte(`{"data":[{"id":"m","root":"/m","owned_by":"vllm","max_model_len":8192},{"id":"a","root":7,"max_model_len":1.5}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		cards, adapters, err := cardsOfModelList(body)
		if err != nil {
			return
		}
		for i, a := range adapters {
			if a == "" || (i > 0 && adapters[i-1] >= a) {
				t.Fatalf("adapters %q are not sorted, distinct and named", adapters)
			}
		}
		for i, c := range cards {
			if c.ID == "" || (i > 0 && cards[i-1].ID >= c.ID) || c.MaxModelLen < 0 ||
				max(len(c.Root), len(c.Parent), len(c.OwnedBy)) > MaxModelCardStringBytes {
				t.Fatalf("card %d of %d, %+v: cards are not sorted, distinct, named and bounded", i, len(cards), c)
			}
		}
	})
}
