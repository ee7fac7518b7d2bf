package routing

import (
	"slices"
	"testing"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/kvevent"
)

func TestPrefixCacheFollowsAIBrixRules(t *testing.T) {
	type held struct {
		pod    string
		tokens int
		medium string
	}
	tests := []struct {
		name      string
		running   [4]float64
		held      []held
		noTokens  bool
		want      []string // any of these
		outcome   Outcome
		loadLimit float64
	}{
		{
			name:    "the longest match wins",
			held:    []held{{"p1", 512, kvevent.MediumGPU}, {"p2", 1024, kvevent.MediumGPU}},
			want:    []string{"p2"},
			outcome: OutcomePrefixHit,
		},
		{
			name:    "GPU-resident blocks outweigh blocks held only on CPU",
			held:    []held{{"p1", 1024, kvevent.MediumCPU}, {"p2", 1024, kvevent.MediumGPU}},
			want:    []string{"p2"},
			outcome: OutcomePrefixHit,
		},
		{
			name:    "equal matches go to the fewer running requests",
			running: [4]float64{2, 2, 1, 2},
			held:    []held{{"p1", 1024, kvevent.MediumGPU}, {"p2", 1024, kvevent.MediumGPU}},
			want:    []string{"p2"},
			outcome: OutcomePrefixHit,
		},
		{
			// mean 1.5, standard deviation 2.6: p3's 6 exceeds 4.1.
			name:      "a holder above mean + factor x stddev is passed over for least-request",
			running:   [4]float64{0, 0, 0, 6},
			held:      []held{{"p3", 2048, kvevent.MediumGPU}},
			want:      []string{"p0", "p1", "p2"},
			outcome:   OutcomeLoadOverPrefix,
			loadLimit: 1.5 + 2.598076211353316,
		},
		{
			name:    "a shorter match within the bound beats a longer one above it",
			running: [4]float64{0, 0, 0, 6},
			held:    []held{{"p3", 2048, kvevent.MediumGPU}, {"p1", 512, kvevent.MediumGPU}},
			want:    []string{"p1"},
			outcome: OutcomeLoadOverPrefix,
		},
		{
			name:    "an imbalance above the absolute count goes to the least loaded pod",
			running: [4]float64{1, 9, 0, 2},
			held:    []held{{"p1", 2048, kvevent.MediumGPU}},
			want:    []string{"p2"},
			outcome: OutcomeImbalanceGuard,
		},
		{
			name:    "an imbalance of exactly the count leaves the match in charge",
			running: [4]float64{1, 8, 0, 2},
			held:    []held{{"p3", 2048, kvevent.MediumGPU}},
			want:    []string{"p3"},
			outcome: OutcomePrefixHit,
		},
		{
			name:    "no pod holds any of the prompt",
			running: [4]float64{2, 1, 3, 2},
			want:    []string{"p1"},
			outcome: OutcomeLoadFallback,
		},
		{
			name:     "no tokens",
			running:  [4]float64{2, 1, 3, 2},
			held:     []held{{"p2", 2048, kvevent.MediumGPU}},
			noTokens: true,
			want:     []string{"p1"},
			outcome:  OutcomeNoTokens,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pods := testPods(4)
			idx := newTestIndex(t)
			p := prompt(0, 2048)
			for _, h := range tt.held {
				holds(t, idx, h.pod, p[:h.tokens], h.medium)
			}
			m := uniformFleet(4)
			for i, run := range tt.running {
				m.set(pods[i].Key.Name, cache.RealtimeNumRequestsRunning, run)
			}
			r, _ := newTestRouter(t, m, idx)
			ctx := request("r", PrefixCache, p)
			if tt.noTokens {
				ctx.PromptTokenIDs, ctx.PromptTokenCount = nil, len(p)
			}

			d := route(t, r, ctx, pods)
			ok := false
			for _, w := range tt.want {
				ok = ok || d.PodKey == key(w)
			}
			if !ok || d.Outcome != tt.outcome {
				t.Fatalf("chose %s (%s), want one of %v (%s); candidates %+v", d.PodKey, d.Outcome, tt.want, tt.outcome, d.Candidates)
			}
			if tt.loadLimit != 0 && !near(d.LoadLimit, tt.loadLimit) {
				t.Fatalf("load limit %v, want %v", d.LoadLimit, tt.loadLimit)
			}
		})
	}
}

func TestPrefixCacheBoundsTheLoadAtTheMeanWithAFactorOfZero(t *testing.T) {
	// Running 0, 0, 2, 2: mean 1, standard deviation 1. p3, the holder,
	// is within the default bound of 2, above the mean.
	tests := []struct {
		name      string
		factor    float64
		want      []string
		outcome   Outcome
		loadLimit float64
	}{
		{"default factor", 0, []string{"p3"}, OutcomePrefixHit, 2},
		{"factor set to 0", StdDevFactorSetting(0), []string{"p0", "p1"}, OutcomeLoadOverPrefix, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pods := testPods(4)
			idx := newTestIndex(t)
			p := prompt(0, 2048)
			holds(t, idx, "p3", p, kvevent.MediumGPU)
			m := uniformFleet(4).set("p2", cache.RealtimeNumRequestsRunning, 2).set("p3", cache.RealtimeNumRequestsRunning, 2)
			r, _ := newTestRouter(t, m, idx, func(c *Config) { c.StdDevFactor = tt.factor })

			d := route(t, r, request("r", PrefixCache, p), pods)
			if !slices.ContainsFunc(tt.want, func(p string) bool { return d.PodKey == key(p) }) || d.Outcome != tt.outcome ||
				!near(d.LoadLimit, tt.loadLimit) {
				t.Fatalf("chose %s (%s) under a load limit of %v, want one of %v (%s) under %v", d.PodKey, d.Outcome,
					d.LoadLimit, tt.want, tt.outcome, tt.loadLimit)
			}
		})
	}
}

func TestPrefixCacheScoresTheWeightedShareOfThePrompt(t *testing.T) {
	pods := testPods(2)
	idx := newTestIndex(t)
	p := prompt(0, 2000)
	holds(t, idx, "p0", p[:1600], kvevent.MediumGPU)
	holds(t, idx, "p1", p[:1600], kvevent.MediumCPU)
	r, _ := newTestRouter(t, uniformFleet(2), idx)

	d := route(t, r, request("r", PrefixCache, p), pods)
	if g, c := candidate(t, d, "p0").Score, candidate(t, d, "p1").Score; !near(g, 0.8) || !near(c, 0.8*0.8) {
		t.Fatalf("scores GPU %v CPU %v, want 0.8 and 0.64 (1,600 of 2,000 tokens, CPU weighted 0.8)", g, c)
	}
}

// TestPrefixCacheLeavesPodsThatHoldNothingIdle documents a consequence of
// AIBrix's rules: when every prompt shares a first block that some pods
// hold, a pod that holds nothing is chosen only by the imbalance guard or
// when every holder runs above mean + factor x standard deviation. Below
// both limits it gets no request, however idle, as happens on a large fleet
// serving prompts that open alike.
func TestPrefixCacheLeavesPodsThatHoldNothingIdle(t *testing.T) {
	pods := testPods(6)
	idx := newTestIndex(t)
	shared := prompt(0, 16)
	m := newFakeMetrics()
	for i := range 4 {
		holds(t, idx, pods[i].Key.Name, shared, kvevent.MediumGPU)
		m.set(pods[i].Key.Name, cache.RealtimeNumRequestsRunning, 3)
	}
	r, _ := newTestRouter(t, m, idx)
	for i := range 50 {
		p := append(append([]uint32(nil), shared...), prompt(1000+100*i, 100)...)
		d := route(t, r, request("r", PrefixCache, p), pods)
		// Running 3, 3, 3, 3, 0, 0: a gap of 3 is within the guard's 8,
		// and the holders are within mean 2 + stddev 1.41.
		if d.PodKey == key("p4") || d.PodKey == key("p5") || d.Outcome != OutcomePrefixHit {
			t.Fatalf("request %d went to %s (%s), want a pod holding the shared block", i, d.PodKey, d.Outcome)
		}
	}
}
