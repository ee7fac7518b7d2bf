package cache

import (
	"bytes"
	"fmt"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/endpoint"
)

// pageWithEngines returns the exposition in testdata file followed by a
// waiting-requests series of each engine label value of engines, 1 each.
func pageWithEngines(t testing.TB, file string, engines ...string) []byte {
	t.Helper()
	b := readExposition(t, file)
	for _, e := range engines {
		b = fmt.Appendf(b, "vllm:num_requests_waiting{engine=%q,model_name=%q} 1\n", e, llama)
	}
	return b
}

// manyEngines returns the engine label values 0 to n-1 and a few that are
// no rank.
func manyEngines(n int) []string {
	out := []string{"", "x", "-1", "+2", "0x1", "1.0", strconv.Itoa(endpoint.MaxDPSize)}
	for i := range n {
		out = append(out, strconv.Itoa(i))
	}
	return out
}

func TestProjectBreaksDownRunningAndWaitingByDataParallelRank(t *testing.T) {
	hostile := make([]RankLoad, endpoint.MaxDPSize)
	for r := range hostile {
		hostile[r].Waiting = 1
	}
	hostile[0], hostile[1] = RankLoad{Running: 4, Waiting: 1 + 1}, RankLoad{Running: 3, Waiting: 2 + 1}
	for _, tc := range []struct {
		name    string
		page    []byte
		want    []RankLoad
		notRank int
	}{
		{"two engines", readExposition(t, "vllm_v1_dp2.txt"), []RankLoad{{Running: 4, Waiting: 1}, {Running: 3, Waiting: 2}}, 0},
		{"one engine", readExposition(t, "vllm_v1_t0.txt"), nil, 0},
		{"no engine label", readExposition(t, "vllm_v0_gpu_cache.txt"), nil, 0},
		{"a rank the page skips reads zero", pageWithEngines(t, "vllm_v1_t0.txt", "3"),
			[]RankLoad{{Running: 4, Waiting: 1}, {}, {}, {Waiting: 1}}, 0},
		{"one rank and engines that are no rank", pageWithEngines(t, "vllm_v1_t0.txt", "x", "256", "1e3"), nil, 3},
		{"thousands of engines", pageWithEngines(t, "vllm_v1_dp2.txt", manyEngines(5000)...), hostile,
			5000 - endpoint.MaxDPSize + 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parser := newTextParser()
			families, err := parser.TextToMetricFamilies(bytes.NewReader(tc.page))
			if err != nil {
				t.Fatal(err)
			}
			m, dropped := newProjector(time.Second, time.Second).project(time.Unix(100, 0), families, nil, []string{llama})
			if got := m.builtin.Ranks; !reflect.DeepEqual(got, tc.want) {
				t.Errorf("rank loads %v (%d ranks), want %v (%d)", got, len(got), tc.want, len(tc.want))
			}
			if dropped.notRank != tc.notRank {
				t.Errorf("%d series of no rank, want %d", dropped.notRank, tc.notRank)
			}
		})
	}
}

func TestAPodsRankLoadsReachItsSnapshotAndEnginesOfNoRankAreCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newEngine(t, "vllm_v1_dp2.txt")
	s := newTestStore(t, scrapeConfig(reg))
	s.AddOrUpdatePod(e.pod("p", llama))
	pods := []*endpoint.Endpoint{s.ListPods()[0]}
	ranks := func() []RankLoad { return s.Snapshots(pods, nil)[0].Metrics.Ranks }
	testsupport.EventuallyWhy(t, "the rank loads of the two-engine page", func() (string, bool) {
		got := ranks()
		return fmt.Sprint(got), reflect.DeepEqual(got, []RankLoad{{Running: 4, Waiting: 1}, {Running: 3, Waiting: 2}})
	})

	e.serveBytes(pageWithEngines(t, "vllm_v1_dp2.txt", "x", "300"))
	dropped := func() float64 {
		return testsupport.MetricValue(t, reg, "kvgate_cache_pod_metric_series_dropped_total",
			map[string]string{"pod": "ns/p", "reason": dropInvalidRank})
	}
	testsupport.EventuallyWhy(t, "three scrapes' series of no rank counted", func() (string, bool) {
		n := dropped()
		return "dropped " + strconv.FormatFloat(n, 'g', -1, 64), n >= 3*2
	})
	if got := ranks(); !reflect.DeepEqual(got, []RankLoad{{Running: 4, Waiting: 1}, {Running: 3, Waiting: 2}}) {
		t.Errorf("with series of no rank the rank loads are %v, want the two engines'", got)
	}

	e.serve(t, "vllm_v1_t0.txt")
	testsupport.EventuallyWhy(t, "a page of one engine to leave no rank loads", func() (string, bool) {
		got := ranks()
		return fmt.Sprint(got), got == nil
	})
}
