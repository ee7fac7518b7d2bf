package routingbench

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/sim"
)

// smallConversations is a conversation workload small enough for a test.
var smallConversations = ConversationConfig{
	SharedTokens: 64, Conversations: 300, MeanContextTokens: 500, MeanTurns: 3, MaxTurns: 6,
	MeanUserTokens: 50, MeanOutputTokens: 40, MaxOutputTokens: 200, MaxContextTokens: 4096,
	ConversationsPerSecond: 2, MeanTurnGap: 10 * time.Second, Seed: 7,
}

func TestConversationsShareAFirstBlockAndCarryTheirAnswers(t *testing.T) {
	w, err := GenerateConversations(smallConversations)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.validate(sim.VocabSize); err != nil {
		t.Fatal(err)
	}
	shared := w.Requests[0].Prompt[:64]
	byID := make(map[string]Request, len(w.Requests))
	turns := 0
	for _, r := range w.Requests {
		byID[r.ID] = r
		if !slices.Equal(r.Prompt[:64], shared) {
			t.Fatalf("%s does not open with the shared tokens", r.ID)
		}
		if len(r.Prompt)+r.OutputTokens > smallConversations.MaxContextTokens || r.OutputTokens > smallConversations.MaxOutputTokens {
			t.Fatalf("%s: %d prompt and %d output tokens exceed the limits", r.ID, len(r.Prompt), r.OutputTokens)
		}
	}
	for conv := range smallConversations.Conversations {
		for turn := 1; ; turn++ {
			r, ok := byID[fmt.Sprintf("conv-%d-%d", conv, turn)]
			if !ok {
				break
			}
			turns++
			prev := byID[fmt.Sprintf("conv-%d-%d", conv, turn-1)]
			answer := sim.GeneratedTokens(0, prev.Prompt, 0, prev.OutputTokens)
			carried := append(slices.Clone(prev.Prompt), answer...)
			if len(r.Prompt) <= len(carried) || !slices.Equal(r.Prompt[:len(carried)], carried) || r.Arrival < prev.Arrival {
				t.Fatalf("%s does not extend %s and the answer the engines generate for it", r.ID, prev.ID)
			}
		}
	}
	if mean := float64(len(w.Requests)) / float64(smallConversations.Conversations); mean < 2.4 || mean > 3.2 {
		t.Errorf("%.2f requests per conversation, want about 3 (geometric, capped at 6 and by the context)", mean)
	}
	again, _ := GenerateConversations(smallConversations)
	if len(again.Requests) != len(w.Requests) || again.Requests[99].ID != w.Requests[99].ID ||
		!slices.Equal(again.Requests[99].Prompt, w.Requests[99].Prompt) {
		t.Error("the same configuration generated another workload")
	}
}

func TestConversationsStartInBursts(t *testing.T) {
	cfg := smallConversations
	cfg.Conversations = 4000
	cfg.MeanTurns, cfg.MaxTurns = 1, 1
	cfg.BurstFactor, cfg.BurstShare, cfg.BurstPeriod = 4, 0.2, 20*time.Second
	w, err := GenerateConversations(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Count starts per 5-second window: a Poisson process of rate 2 has a
	// variance equal to its mean of 10; bursts make it several times that.
	counts := map[int]float64{}
	for _, r := range w.Requests {
		counts[int(r.Arrival/(5*time.Second))]++
	}
	windows := float64(int(w.Requests[len(w.Requests)-1].Arrival/(5*time.Second)) + 1)
	mean := float64(len(w.Requests)) / windows
	variance := 0.0
	for i := range int(windows) {
		variance += (counts[i] - mean) * (counts[i] - mean) / windows
	}
	if math.Abs(mean-10) > 2.5 || variance < 3*mean {
		t.Errorf("starts per 5 s: mean %.1f, variance %.1f; want a mean near 10 and bursts", mean, variance)
	}
}

func TestInvalidConversationConfigsAreRefused(t *testing.T) {
	for _, mod := range []func(*ConversationConfig){
		func(c *ConversationConfig) { c.Conversations = -1 },
		func(c *ConversationConfig) { c.MeanTurns, c.MaxTurns = 5, 3 },
		func(c *ConversationConfig) { c.BurstFactor, c.BurstShare = 6, 0.2 },
		func(c *ConversationConfig) { c.SharedTokens, c.MaxContextTokens = 100, 50 },
		func(c *ConversationConfig) { c.OutputSigma = -1 },
	} {
		cfg := smallConversations
		mod(&cfg)
		if _, err := GenerateConversations(cfg); err == nil {
			t.Errorf("%+v accepted", cfg)
		}
	}
}
