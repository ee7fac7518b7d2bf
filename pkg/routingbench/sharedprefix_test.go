package routingbench

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/sim"
)

// smallChat is a shared-prefix workload small enough for unit tests.
var smallChat = SharedPrefixConfig{
	Groups: 3, SystemPromptTokens: 64, Conversations: 12, Turns: 3,
	MinUserTokens: 8, MaxUserTokens: 24, MinAnswerTokens: 4, MaxAnswerTokens: 12,
	ConversationsPerSecond: 4, MeanTurnGap: time.Second, Seed: 7,
}

func TestSharedPrefixTurnsExtendThePreviousPromptAndGroupsShareASystemPrompt(t *testing.T) {
	w, err := GenerateSharedPrefix(smallChat)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.validate(sim.VocabSize); err != nil {
		t.Fatal(err)
	}
	if len(w.Requests) != 36 {
		t.Fatalf("%d requests, want 12 conversations of 3 turns", len(w.Requests))
	}
	turns := map[string]Request{}
	systems := map[string]int{}
	for _, r := range w.Requests {
		turns[r.ID] = r
		systems[fmt.Sprint(r.Prompt[:smallChat.SystemPromptTokens])]++
	}
	if len(systems) > smallChat.Groups {
		t.Errorf("%d distinct system prompts, want at most %d", len(systems), smallChat.Groups)
	}
	for conv := range smallChat.Conversations {
		for turn := 1; turn < smallChat.Turns; turn++ {
			prev, cur := turns[fmt.Sprintf("chat-%d-%d", conv, turn-1)], turns[fmt.Sprintf("chat-%d-%d", conv, turn)]
			// The next prompt holds the previous prompt, its answer (as
			// long as the previous request's output) and a new message.
			grown := len(cur.Prompt) - len(prev.Prompt) - prev.OutputTokens
			if !slices.Equal(cur.Prompt[:len(prev.Prompt)], prev.Prompt) || grown < smallChat.MinUserTokens || grown > smallChat.MaxUserTokens {
				t.Fatalf("conversation %d turn %d (%d tokens) does not extend turn %d (%d tokens, %d output) by a user message",
					conv, turn, len(cur.Prompt), turn-1, len(prev.Prompt), prev.OutputTokens)
			}
			if cur.Arrival < prev.Arrival {
				t.Fatalf("conversation %d turn %d arrives before turn %d", conv, turn, turn-1)
			}
		}
	}
}

func TestSharedPrefixRepeatsWithTheSameSeed(t *testing.T) {
	a, _ := GenerateSharedPrefix(smallChat)
	b, _ := GenerateSharedPrefix(smallChat)
	if !reflect.DeepEqual(a, b) {
		t.Error("the same configuration generated two workloads")
	}
	other := smallChat
	other.Seed++
	c, _ := GenerateSharedPrefix(other)
	if reflect.DeepEqual(a, c) {
		t.Error("another seed generated the same workload")
	}
}

func TestSharedPrefixRejectsBadShapes(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*SharedPrefixConfig)
		want string
	}{
		{"negative", func(c *SharedPrefixConfig) { c.Turns = -1 }, "negative"},
		{"user range", func(c *SharedPrefixConfig) { c.MinUserTokens, c.MaxUserTokens = 30, 20 }, "user tokens"},
		{"answer range", func(c *SharedPrefixConfig) { c.MinAnswerTokens, c.MaxAnswerTokens = 30, 20 }, "answer tokens"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := smallChat
			tt.mod(&cfg)
			if _, err := GenerateSharedPrefix(cfg); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one about %s", err, tt.want)
			}
		})
	}
}

func TestSharedPrefixRequestsAreTheChatsLaidOut(t *testing.T) {
	chats, err := GenerateSharedPrefixChats(smallChat)
	if err != nil {
		t.Fatal(err)
	}
	w, err := GenerateSharedPrefix(smallChat)
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]Request{}
	for _, r := range w.Requests {
		byID[r.ID] = r
	}
	if len(chats.Systems) != smallChat.Groups || len(chats.Conversations) != smallChat.Conversations {
		t.Fatalf("%d systems and %d conversations, want %d and %d",
			len(chats.Systems), len(chats.Conversations), smallChat.Groups, smallChat.Conversations)
	}
	for conv, c := range chats.Conversations {
		prompt, at := slices.Clone(chats.Systems[c.System]), c.Start
		for turn, tn := range c.Turns {
			at += tn.Gap
			prompt = append(prompt, tn.User...)
			r := byID[fmt.Sprintf("chat-%d-%d", conv, turn)]
			if !slices.Equal(r.Prompt, prompt) || r.Arrival != at || r.OutputTokens != len(tn.Answer) {
				t.Fatalf("conversation %d turn %d: request (%d tokens at %v, %d out) is not the chat's (%d tokens at %v, %d out)",
					conv, turn, len(r.Prompt), r.Arrival, r.OutputTokens, len(prompt), at, len(tn.Answer))
			}
			prompt = append(prompt, tn.Answer...)
		}
	}
}
