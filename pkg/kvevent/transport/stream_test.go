package transport

import (
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/kvgate/kvgate/pkg/kvevent/internal/kvtest"
)

func TestProcessingYieldsAfterTheBatchThatUsesUpItsSlice(t *testing.T) {
	cfg := DefaultZMQClientConfig("default/p", "127.0.0.1", "llama")
	cfg.RouterPort, cfg.Logger = 0, logr.Discard()
	rec := &kvtest.Recorder{}
	c, err := NewZMQClient(cfg, rec)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := c.idle.s
	const batches = 16
	for i := range batches {
		if !s.live.push(inMsg{seq: uint64(i), payload: kvtest.Payload(t, 1, i)}) {
			t.Fatal("the receive buffer is full")
		}
	}
	for want := 1; want <= 3; want++ {
		s.process(time.Now().Add(-processSlice)) // a slice used up before its first batch
		if got := rec.Count(); got != want {
			t.Fatalf("a used-up slice applied %d batches in all after %d calls, want %d", got, want, want)
		}
	}
	for s.hasWork() {
		s.process(time.Now())
	}
	got, _ := rec.Snapshot()
	kvtest.CheckSequence(t, got, 1, 0, batches)
}

func TestAStreamWithLiveMessagesToApplyIsNotProbed(t *testing.T) {
	cfg := DefaultZMQClientConfig("default/p", "127.0.0.1", "llama")
	cfg.RouterPort, cfg.Logger = 0, logr.Discard()
	c, err := NewZMQClient(cfg, &kvtest.Recorder{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := c.idle.s
	now := time.Now()
	s.up(now.Add(-time.Hour)) // quiet for an hour: its probe is due
	due := s.probeAt
	s.live.push(inMsg{seq: 0, payload: kvtest.Payload(t, 1, 0)})
	s.runTimers(now)
	if s.probeAt != due {
		t.Fatalf("probed a stream with a live message to apply: next probe %v, was due %v", s.probeAt, due)
	}
	for s.hasWork() {
		s.process(now)
	}
	s.runTimers(now)
	if !s.probeAt.After(now) {
		t.Errorf("a quiet stream with nothing to apply was not probed: next probe %v", s.probeAt)
	}
}
