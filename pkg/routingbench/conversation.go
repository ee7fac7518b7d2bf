package routingbench

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/kvgate/kvgate/pkg/sim"
)

// ConversationConfig shapes a generated conversation workload, in the
// manner of the conversation trace Mooncake published: multi-turn chats
// with long contexts, every request opening with the same instructions,
// arriving in bursts. A zero field takes its value in DefaultConversation.
type ConversationConfig struct {
	// SharedTokens is the length of the instructions every request opens
	// with (a service-wide system prompt): every prompt shares its first
	// blocks.
	SharedTokens int
	// Conversations is the number of conversations.
	Conversations int
	// MeanContextTokens is the mean length of the context a conversation
	// opens with after the shared instructions (a document, retrieved
	// passages, tool descriptions), drawn log-normally with a standard
	// deviation of its logarithm of ContextSigma.
	MeanContextTokens int
	ContextSigma      float64
	// MeanTurns is the mean number of requests of a conversation, drawn
	// geometrically from 1 to MaxTurns.
	MeanTurns, MaxTurns int
	// MeanUserTokens is the mean length of a user message, drawn
	// exponentially (at least 1 token).
	MeanUserTokens int
	// MeanOutputTokens is the mean length of an answer, drawn
	// log-normally with a standard deviation of its logarithm of
	// OutputSigma, from 1 to MaxOutputTokens.
	MeanOutputTokens int
	OutputSigma      float64
	MaxOutputTokens  int
	// MaxContextTokens ends a conversation before a turn whose prompt and
	// answer would exceed it.
	MaxContextTokens int
	// ConversationsPerSecond is the mean rate at which conversations
	// start. Starts come in bursts: the rate alternates between
	// BurstFactor times the mean and what keeps the mean, in periods drawn
	// exponentially with a mean of BurstPeriod, bursts taking BurstShare of
	// the time.
	ConversationsPerSecond float64
	BurstFactor            float64
	BurstShare             float64
	BurstPeriod            time.Duration
	// MeanTurnGap is the mean of the exponentially distributed time between
	// a turn's arrival and the next turn's, in which the user reads the
	// answer and writes the next message.
	MeanTurnGap time.Duration
	// Seed seeds the generator.
	Seed uint64
}

// DefaultConversation is the conversation workload of the benchmark's
// defaults: 900 conversations opening with 1,024 shared tokens and 8,000
// tokens of context of their own on average, 4 turns on average (up to 12)
// of 200 user tokens and 300 generated tokens (up to 2,048) on average,
// 32,768 tokens at most; conversations start at 0.75 a second on average,
// three times as fast in bursts that take a fifth of the time, and turns
// follow 40 s apart on average.
var DefaultConversation = ConversationConfig{
	SharedTokens:           1024,
	Conversations:          900,
	MeanContextTokens:      8000,
	ContextSigma:           0.8,
	MeanTurns:              4,
	MaxTurns:               12,
	MeanUserTokens:         200,
	MeanOutputTokens:       300,
	OutputSigma:            0.7,
	MaxOutputTokens:        2048,
	MaxContextTokens:       32768,
	ConversationsPerSecond: 0.75,
	BurstFactor:            3,
	BurstShare:             0.2,
	BurstPeriod:            30 * time.Second,
	MeanTurnGap:            40 * time.Second,
}

func (c ConversationConfig) withDefaults() ConversationConfig {
	d := DefaultConversation
	c.SharedTokens = cmp.Or(c.SharedTokens, d.SharedTokens)
	c.Conversations = cmp.Or(c.Conversations, d.Conversations)
	c.MeanContextTokens = cmp.Or(c.MeanContextTokens, d.MeanContextTokens)
	c.ContextSigma = cmp.Or(c.ContextSigma, d.ContextSigma)
	c.MeanTurns = cmp.Or(c.MeanTurns, d.MeanTurns)
	c.MaxTurns = cmp.Or(c.MaxTurns, d.MaxTurns)
	c.MeanUserTokens = cmp.Or(c.MeanUserTokens, d.MeanUserTokens)
	c.MeanOutputTokens = cmp.Or(c.MeanOutputTokens, d.MeanOutputTokens)
	c.OutputSigma = cmp.Or(c.OutputSigma, d.OutputSigma)
	c.MaxOutputTokens = cmp.Or(c.MaxOutputTokens, d.MaxOutputTokens)
	c.MaxContextTokens = cmp.Or(c.MaxContextTokens, d.MaxContextTokens)
	c.ConversationsPerSecond = cmp.Or(c.ConversationsPerSecond, d.ConversationsPerSecond)
	c.BurstFactor = cmp.Or(c.BurstFactor, d.BurstFactor)
	c.BurstShare = cmp.Or(c.BurstShare, d.BurstShare)
	c.BurstPeriod = cmp.Or(c.BurstPeriod, d.BurstPeriod)
	c.MeanTurnGap = cmp.Or(c.MeanTurnGap, d.MeanTurnGap)
	return c
}

func (c ConversationConfig) validate() error {
	switch {
	case c.SharedTokens < 0 || c.Conversations < 0 || c.MeanContextTokens < 0 || c.MeanUserTokens < 0 ||
		c.MeanOutputTokens < 0 || c.MaxOutputTokens < 0 || c.MaxContextTokens < 0 || c.MeanTurns < 0 ||
		c.MaxTurns < 0 || c.BurstPeriod < 0 || c.MeanTurnGap < 0:
		return errors.New("conversation workload: sizes, periods and gaps must not be negative")
	case !(c.ContextSigma >= 0) || !(c.OutputSigma >= 0) || !(c.ConversationsPerSecond >= 0):
		return errors.New("conversation workload: sigmas and rate must not be negative")
	case c.MeanTurns > c.MaxTurns:
		return fmt.Errorf("conversation workload: %d turns on average but at most %d", c.MeanTurns, c.MaxTurns)
	case !(c.BurstFactor >= 1) || !(c.BurstShare > 0 && c.BurstShare < 1) || c.BurstFactor*c.BurstShare >= 1:
		return fmt.Errorf("conversation workload: bursts at %g x the mean rate for %g of the time leave no rate for the rest",
			c.BurstFactor, c.BurstShare)
	case c.SharedTokens+2 > c.MaxContextTokens:
		return fmt.Errorf("conversation workload: %d shared tokens leave no room in %d", c.SharedTokens, c.MaxContextTokens)
	}
	return nil
}

// GenerateConversations generates a conversation workload: every prompt
// opens with one shared block of instructions and its conversation's own
// context; turn k adds every earlier user message and answer and the new
// user message. The answers are the tokens the engines generate
// (sim.GeneratedTokens, engines with output seed 0), so a turn finds the
// previous turn's decode-filled blocks cached where it ran, as with a chat
// client that sends the answers back. Conversations start in bursts (see
// ConversationConfig); the requests arrive whatever the latency of the
// answers (an open-loop workload). Requests are named
// "conv-<conversation>-<turn>". It fails on an invalid configuration.
func GenerateConversations(cfg ConversationConfig) (Workload, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return Workload{}, err
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0xc0de))
	tokens := func(n int) []uint32 { return sim.RandomPieces(rng, n) }
	// logNormal draws a log-normal length of the given mean.
	logNormal := func(mean int, sigma float64) int {
		return int(math.Round(float64(mean) * math.Exp(sigma*rng.NormFloat64()-sigma*sigma/2)))
	}
	shared := tokens(cfg.SharedTokens)
	starts := burstyStarts(rng, cfg)
	w := Workload{Name: "conversation"}
	for conv, start := range starts {
		// Geometric: P(k turns) = p(1-p)^(k-1), of mean 1/p.
		p := 1 / float64(cfg.MeanTurns)
		turns := min(1+int(math.Floor(math.Log(1-rng.Float64())/math.Log(1-p))), cfg.MaxTurns)
		ctx := min(logNormal(cfg.MeanContextTokens, cfg.ContextSigma), cfg.MaxContextTokens-cfg.SharedTokens-2)
		// Each prompt is a prefix of the conversation's tokens, so that the
		// turns share memory as they share tokens.
		text := append(slices.Clone(shared), tokens(ctx)...)
		at := start
		for turn := range turns {
			if turn > 0 {
				at += exponential(rng, cfg.MeanTurnGap)
			}
			user := tokens(max(int(rng.ExpFloat64()*float64(cfg.MeanUserTokens)), 1))
			out := min(max(logNormal(cfg.MeanOutputTokens, cfg.OutputSigma), 1), cfg.MaxOutputTokens)
			if len(text)+len(user)+out > cfg.MaxContextTokens {
				break
			}
			text = append(text, user...)
			prompt := text[:len(text):len(text)]
			w.Requests = append(w.Requests, Request{
				ID:           fmt.Sprintf("conv-%d-%d", conv, turn),
				Arrival:      at,
				Prompt:       prompt,
				OutputTokens: out,
			})
			text = append(text, sim.GeneratedTokens(0, prompt, 0, out)...)
		}
	}
	slices.SortStableFunc(w.Requests, func(a, b Request) int { return cmp.Compare(a.Arrival, b.Arrival) })
	return w, nil
}

// burstyStarts draws the start times of cfg.Conversations conversations
// from a Poisson process whose rate alternates between bursts and quiet
// periods.
func burstyStarts(rng *rand.Rand, cfg ConversationConfig) []time.Duration {
	mean := cfg.ConversationsPerSecond
	burst := cfg.BurstFactor * mean
	quiet := mean * (1 - cfg.BurstFactor*cfg.BurstShare) / (1 - cfg.BurstShare)
	// Periods of each kind last BurstPeriod on average, scaled so that
	// bursts take their share of the time.
	burstLen := float64(cfg.BurstPeriod) * 2 * cfg.BurstShare
	quietLen := float64(cfg.BurstPeriod) * 2 * (1 - cfg.BurstShare)
	starts := make([]time.Duration, 0, cfg.Conversations)
	at, inBurst := 0.0, false
	end := rng.ExpFloat64() * quietLen
	for len(starts) < cfg.Conversations {
		rate := quiet
		if inBurst {
			rate = burst
		}
		next := at + rng.ExpFloat64()*float64(time.Second)/rate
		if rate <= 0 || next > end {
			at, inBurst = end, !inBurst
			if inBurst {
				end = at + rng.ExpFloat64()*burstLen
			} else {
				end = at + rng.ExpFloat64()*quietLen
			}
			continue
		}
		at = next
		starts = append(starts, time.Duration(at))
	}
	return starts
}
