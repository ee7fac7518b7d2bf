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
	c.Groups = cmp.Or(c.Groups, d.Groups)
	c.SystemPromptTokens = cmp.Or(c.SystemPromptTokens, d.SystemPromptTokens)
	c.Conversations = cmp.Or(c.Conversations, d.Conversations)
	c.Turns = cmp.Or(c.Turns, d.Turns)
	c.MinUserTokens = cmp.Or(c.MinUserTokens, d.MinUserTokens)
	c.MaxUserTokens = cmp.Or(c.MaxUserTokens, d.MaxUserTokens)
	c.MinAnswerTokens = cmp.Or(c.MinAnswerTokens, d.MinAnswerTokens)
	c.MaxAnswerTokens = cmp.Or(c.MaxAnswerTokens, d.MaxAnswerTokens)
	c.ConversationsPerSecond = cmp.Or(c.ConversationsPerSecond, d.ConversationsPerSecond)
	c.MeanTurnGap = cmp.Or(c.MeanTurnGap, d.MeanTurnGap)
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

// SharedPrefixChats is a shared-prefix chat workload as conversations,
// before it is laid out as requests: what a client that holds
// conversations (and reads the answers) replays.
type SharedPrefixChats struct {
	// Systems holds the token ids of the system prompts.
	Systems [][]uint32
	// Conversations are in order of their start.
	Conversations []Conversation
}

// Conversation is one user's multi-turn chat under a system prompt.
type Conversation struct {
	// Start is when the first turn arrives, from the start of the workload.
	Start time.Duration
	// System indexes the conversation's system prompt in
	// SharedPrefixChats.Systems.
	System int
	// Turns are the requests of the conversation, in order.
	Turns []Turn
}

// Turn is one request of a conversation: the user's message and the answer
// that the next turn carries.
type Turn struct {
	// Gap is the time from the previous turn's arrival to this one's, in
	// which the user reads the answer and writes the message; 0 for the
	// first turn.
	Gap time.Duration
	// User holds the token ids of the user's message.
	User []uint32
	// Answer holds the token ids of the answer, at least one; its length
	// is the request's output length.
	Answer []uint32
}

// GenerateSharedPrefixChats generates the conversations of a chat workload
// in which prefixes are shared two ways: conversations of one group share
// its system prompt, and each turn extends the conversation so far.
// Conversations start as a Poisson process, each in a group drawn
// uniformly, and their turns follow at exponentially distributed gaps.
// Token ids are ordinary pieces of the simulator's vocabulary
// (sim.FirstPieceID to sim.VocabSize-1). It fails on a negative field or an
// empty range.
func GenerateSharedPrefixChats(cfg SharedPrefixConfig) (SharedPrefixChats, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return SharedPrefixChats{}, err
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x5eed))
	tokens := func(n int) []uint32 { return sim.RandomPieces(rng, n) }
	between := func(lo, hi int) int { return lo + rng.IntN(hi-lo+1) }
	chats := SharedPrefixChats{Systems: make([][]uint32, cfg.Groups), Conversations: make([]Conversation, cfg.Conversations)}
	for i := range chats.Systems {
		chats.Systems[i] = tokens(cfg.SystemPromptTokens)
	}
	start := time.Duration(0)
	for i := range chats.Conversations {
		start += exponential(rng, time.Duration(float64(time.Second)/cfg.ConversationsPerSecond))
		c := Conversation{Start: start, System: rng.IntN(cfg.Groups), Turns: make([]Turn, cfg.Turns)}
		for k := range c.Turns {
			t := &c.Turns[k]
			if k > 0 {
				t.Gap = exponential(rng, cfg.MeanTurnGap)
			}
			t.User = tokens(between(cfg.MinUserTokens, cfg.MaxUserTokens))
			t.Answer = tokens(max(between(cfg.MinAnswerTokens, cfg.MaxAnswerTokens), 1))
		}
		chats.Conversations[i] = c
	}
	return chats, nil
}

// GenerateSharedPrefix generates the conversations of
// GenerateSharedPrefixChats and lays them out as requests: turn k's prompt
// is the system prompt, then every earlier user message and answer, then
// the new user message; the request generates as many tokens as the
// answer that the next turn carries. The requests arrive whatever the
// latency of the answers (an open-loop workload).
//
// The simulated model generates its own tokens, not the answer the next
// turn carries, so a turn finds the previous turn's prompt cached but not
// the answer after it, as with a client that edits or re-renders answers.
// The requests are named "chat-<conversation>-<turn>". It fails on a
// negative field or an empty range.
func GenerateSharedPrefix(cfg SharedPrefixConfig) (Workload, error) {
	chats, err := GenerateSharedPrefixChats(cfg)
	if err != nil {
		return Workload{}, err
	}
	w := Workload{Name: "shared-prefix"}
	for conv, c := range chats.Conversations {
		context, at := chats.Systems[c.System], c.Start
		for turn, t := range c.Turns {
			at += t.Gap
			prompt := append(slices.Clip(context), t.User...)
			w.Requests = append(w.Requests, Request{
				ID:           fmt.Sprintf("chat-%d-%d", conv, turn),
				Arrival:      at,
				Prompt:       prompt,
				OutputTokens: len(t.Answer),
			})
			context = append(slices.Clip(prompt), t.Answer...)
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
