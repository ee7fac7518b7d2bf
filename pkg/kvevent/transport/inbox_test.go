package transport

import "testing"

func TestInboxIsAByteBoundedFIFO(t *testing.T) {
	t.Parallel()
	b := inbox{limit: 3 * (10 + inboxOverhead)}
	msg := func(seq uint64) inMsg { return inMsg{seq: seq, payload: make([]byte, 10)} }
	for seq := range uint64(3) {
		if !b.push(msg(seq)) {
			t.Fatalf("push %d refused below the limit", seq)
		}
	}
	if b.push(msg(3)) {
		t.Fatal("push beyond the limit accepted")
	}
	if m, ok := b.pop(); !ok || m.seq != 0 {
		t.Fatalf("pop = %v, %v; want seq 0", m.seq, ok)
	}
	if !b.push(msg(3)) {
		t.Fatal("push refused after a pop made room")
	}
	for want := uint64(1); want <= 3; want++ {
		if m, ok := b.pop(); !ok || m.seq != want {
			t.Fatalf("pop = %v, %v; want seq %d", m.seq, ok, want)
		}
	}
	if _, ok := b.pop(); ok || !b.empty() || b.bytes != 0 {
		t.Fatalf("inbox not empty: %+v", b)
	}
	big := inMsg{payload: make([]byte, 10*b.limit)}
	if !b.push(big) {
		t.Error("an empty inbox refused a message larger than its limit")
	}
}

func TestInboxThatNeverEmptiesKeepsItsRoom(t *testing.T) {
	t.Parallel()
	b := inbox{limit: 1 << 20}
	b.push(inMsg{})
	for seq := range uint64(100000) {
		b.push(inMsg{seq: seq})
		if _, ok := b.pop(); !ok {
			t.Fatal("pop from a non-empty inbox failed")
		}
	}
	if c := cap(b.msgs); c > 64 {
		t.Errorf("backing array of %d messages for an inbox that never holds more than a few", c)
	}
}
