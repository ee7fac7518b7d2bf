package main

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/pkg/routingbench"
)

// workload is the demo's chat workload: the shared-prefix conversations of
// the routing benchmark (routingbench.GenerateSharedPrefixChats), sent as
// text that the engines tokenize back into as many tokens: the same ids
// with the simulator's tokenizer, one word per id with a real one. Users take
// conversations in order, so every run of a workload with the same seed
// sees the same conversations in the same order.
type workload struct {
	systems []string
	convs   []routingbench.Conversation
	texter  texter
	next    atomic.Int64
	// reasoning has every answer sent back with the reasoning a thinking
	// model gave before it (-reasoning).
	reasoning bool
}

// newWorkload generates cfg's conversations and renders the system
// prompts as text with tx.
func newWorkload(cfg routingbench.SharedPrefixConfig, tx texter) (*workload, error) {
	chats, err := routingbench.GenerateSharedPrefixChats(cfg)
	if err != nil {
		return nil, err
	}
	w := &workload{convs: chats.Conversations, texter: tx}
	for i, ids := range chats.Systems {
		text, err := tx.Text(ids)
		if err != nil {
			return nil, fmt.Errorf("system prompt %d: %w", i, err)
		}
		w.systems = append(w.systems, text)
	}
	return w, nil
}

// restart makes the next conversation handed out the first one again.
func (w *workload) restart() { w.next.Store(0) }

// conversation hands out the next conversation, false when all were
// handed out.
func (w *workload) conversation() (routingbench.Conversation, bool) {
	i := w.next.Add(1) - 1
	if i >= int64(len(w.convs)) {
		return routingbench.Conversation{}, false
	}
	return w.convs[i], true
}

// chatMessage is a message of an OpenAI chat request. id, which the chat
// does not send, is an answer's output message id in the Responses API.
type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
	// Reasoning is what a thinking model reasoned before an answer, which
	// its clients send back with the answer.
	Reasoning string `json:"reasoning,omitempty"`
	id        string
}

// dialog is a conversation in progress: the messages sent so far and the
// answers received.
type dialog struct {
	texter    texter
	conv      routingbench.Conversation
	messages  []chatMessage
	turn      int
	reasoning bool
}

func (w *workload) startDialog(c routingbench.Conversation) *dialog {
	return &dialog{texter: w.texter, conv: c, messages: []chatMessage{{Role: "system", Content: w.systems[c.System]}}, reasoning: w.reasoning}
}

// done reports whether every turn was sent.
func (d *dialog) done() bool { return d.turn >= len(d.conv.Turns) }

// thinkTime is how long the user waits before the next turn: the turn's
// gap in the workload.
func (d *dialog) thinkTime() time.Duration { return d.conv.Turns[d.turn].Gap }

// nextTurn appends the next user message and returns the messages to send
// and the answer's length.
func (d *dialog) nextTurn() ([]chatMessage, int, error) {
	t := d.conv.Turns[d.turn]
	text, err := d.texter.Text(t.User)
	if err != nil {
		return nil, 0, fmt.Errorf("turn %d: %w", d.turn, err)
	}
	d.messages = append(d.messages, chatMessage{Role: "user", Content: text})
	return d.messages, len(t.Answer), nil
}

// answered records the assistant's answer to the turn just sent, and the
// id of the output message that held it (Responses API; "" otherwise).
// With reasoning, the answer carries the reasoning that preceded it.
func (d *dialog) answered(answer, id string) {
	m := chatMessage{Role: "assistant", Content: answer, id: id}
	if d.reasoning {
		m.Reasoning = fmt.Sprintf("Turn %d asks for more of the same; answer it directly.", d.turn+1)
	}
	d.messages = append(d.messages, m)
	d.turn++
}
