package routingbench

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/kvgate/kvgate/pkg/sim"
)

// SharedPrefixConfig shapes a generated shared-prefix chat workload. A zero
// field takes its value in DefaultSharedPrefix.
type SharedPrefixConfig struct {
	// Groups is the number of system prompts, each shared by the
	// conversations of one group of users.
	Groups int
	// SystemPromptTokens is the length of every system prompt.
	SystemPromptTokens int
	// Conversations is the number of conversations, each in a group drawn
	// uniformly.
	Conversations int
	// Turns is the number of requests of a conversation.
	Turns int
	// MinUserTokens and MaxUserTokens bound the length of a user message,
	// drawn uniformly.
	MinUserTokens, MaxUserTokens int
	// MinAnswerTokens and MaxAnswerTokens bound the length of an answer,
	// drawn uniformly.
	MinAnswerTokens, MaxAnswerTokens int
	// ConversationsPerSecond is the rate of the Poisson process that starts
	// conversations.
	ConversationsPerSecond float64
	// MeanTurnGap is the mean of the exponentially distributed time between
	// two requests of a conversation, in which the user reads the answer
	// and writes the next message.
	MeanTurnGap time.Duration
	// Seed seeds the generator: the same configuration and seed give the
	// same workload.
	Seed uint64
}

// DefaultSharedPrefix is the shared-prefix workload of the benchmark's
// defaults: 64 system prompts of 8,192 tokens (524,288 tokens, more than
// one default engine's KV cache holds) and 1,600 conversations of 6 turns
// growing by 200 to 1,000 user and 100 to 400 answer tokens a turn, two
// started a second, a turn every 30 s on average: some 9,600 requests
// over 20 minutes.
var DefaultSharedPrefix = SharedPrefixConfig{
	Groups:                 64,
	SystemPromptTokens:     8192,
	Conversations:          1600,
	Turns:                  6,
	MinUserTokens:          200,
	MaxUserTokens:          1000,
	MinAnswerTokens:        100,
	MaxAnswerTokens:        400,
	ConversationsPerSecond: 2,
	MeanTurnGap:            30 * time.Second,
}

func (c SharedPrefixConfig) withDefaults() SharedPrefixConfig {
	d := DefaultSharedPrefix
	orDefault(&c.Groups, d.Groups)
	orDefault(&c.SystemPromptTokens, d.SystemPromptTokens)
	orDefault(&c.Conversations, d.Conversations)
	orDefault(&c.Turns, d.Turns)
	orDefault(&c.MinUserTokens, d.MinUserTokens)
	orDefault(&c.MaxUserTokens, d.MaxUserTokens)
	orDefault(&c.MinAnswerTokens, d.MinAnswerTokens)
	orDefault(&c.MaxAnswerTokens, d.MaxAnswerTokens)
	orDefault(&c.ConversationsPerSecond, d.ConversationsPerSecond)
	orDefault(&c.MeanTurnGap, d.MeanTurnGap)
	return c
}

func (c SharedPrefixConfig) validate() error {
	switch {
	case c.Groups < 0 || c.SystemPromptTokens < 0 || c.Conversations < 0 || c.Turns < 0 ||
		c.MinUserTokens < 0 || c.MinAnswerTokens < 0 || c.ConversationsPerSecond < 0 || c.MeanTurnGap < 0:
		return errors.New("shared-prefix workload: sizes, rates and gaps must not be negative")
	case c.MinUserTokens > c.MaxUserTokens:
		return fmt.Errorf("shared-prefix workload: user tokens between %d and %d", c.MinUserTokens, c.MaxUserTokens)
	case c.MinAnswerTokens > c.MaxAnswerTokens:
		return fmt.Errorf("shared-prefix workload: answer tokens between %d and %d", c.MinAnswerTokens, c.MaxAnswerTokens)
	}
	return nil
}

// GenerateSharedPrefix generates a chat workload in which prefixes are
// shared two ways: conversations of one group share its system prompt, and
// each turn of a conversation extends the previous turn's prompt. Turn k's
// prompt is the system prompt, then every earlier user message and answer,
// then the new user message; the request generates as many tokens as the
// answer that the next turn carries. Conversations start as a Poisson
// process and their turns follow at exponentially distributed gaps,
// whatever the latency of the answers (an open-loop workload).
//
// The simulated model generates its own tokens, not the answer the next
// turn carries, so a turn finds the previous turn's prompt cached but not
// the answer after it, as with a client that edits or re-renders answers.
// The requests are named "chat-<conversation>-<turn>". It fails on a
// negative field or an empty range.
func GenerateSharedPrefix(cfg SharedPrefixConfig) (Workload, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return Workload{}, err
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x5eed))
	tokens := func(n int) []uint32 {
		out := make([]uint32, n)
		for i := range out {
			out[i] = sim.FirstPieceID + uint32(rng.IntN(int(sim.VocabSize-sim.FirstPieceID)))
		}
		return out
	}
	between := func(lo, hi int) int { return lo + rng.IntN(hi-lo+1) }
	systems := make([][]uint32, cfg.Groups)
	for i := range systems {
		systems[i] = tokens(cfg.SystemPromptTokens)
	}
	w := Workload{Name: "shared-prefix", Requests: make([]Request, 0, cfg.Conversations*cfg.Turns)}
	start := time.Duration(0)
	for conv := range cfg.Conversations {
		start += exponential(rng, time.Duration(float64(time.Second)/cfg.ConversationsPerSecond))
		context := systems[rng.IntN(cfg.Groups)]
		at := start
		for turn := range cfg.Turns {
			if turn > 0 {
				at += exponential(rng, cfg.MeanTurnGap)
			}
			prompt := append(slices.Clip(context), tokens(between(cfg.MinUserTokens, cfg.MaxUserTokens))...)
			answer := tokens(between(cfg.MinAnswerTokens, cfg.MaxAnswerTokens))
			w.Requests = append(w.Requests, Request{
				ID:           fmt.Sprintf("chat-%d-%d", conv, turn),
				Arrival:      at,
				Prompt:       prompt,
				OutputTokens: max(len(answer), 1),
			})
			context = append(slices.Clip(prompt), answer...)
		}
	}
	slices.SortStableFunc(w.Requests, func(a, b Request) int { return cmp.Compare(a.Arrival, b.Arrival) })
	return w, nil
}

// exponential draws an exponentially distributed duration of the given
// mean.
func exponential(rng *rand.Rand, mean time.Duration) time.Duration {
	return time.Duration(rng.ExpFloat64() * float64(mean))
}

// orDefault sets *v to def when it is the zero value.
func orDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}
