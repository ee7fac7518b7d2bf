package kvevent

import (
	"encoding/hex"
	"testing"
)

// envelopeParts returns the raw elements of payload's positional envelope:
// ts, events and, when present, the rank.
func envelopeParts(t testing.TB, payload []byte) (ts, events, rank raw) {
	t.Helper()
	r := reader{buf: payload}
	n, err := r.arrayLen()
	if err != nil || n < 2 {
		t.Fatalf("envelope of %x: %d elements, %v", payload, n, err)
	}
	parts := make([]raw, 0, 3)
	for range min(n, 3) {
		start := r.off
		if err := r.skip(); err != nil {
			t.Fatal(err)
		}
		parts = append(parts, raw(payload[start:r.off]))
	}
	if n > 2 {
		rank = parts[2]
	}
	return parts[0], parts[1], rank
}

// asMapEnvelopes rewrites payload's positional envelope as map envelopes:
// keys in struct order as msgspec writes them, reversed, and with a key
// this package does not know.
func asMapEnvelopes(t testing.TB, payload []byte) map[string][]byte {
	ts, events, rank := envelopeParts(t, payload)
	ordered := obj{"ts", ts, "events", events}
	reversed := obj{"events", events, "ts", ts}
	if rank != nil {
		ordered = append(ordered, "data_parallel_rank", rank)
		reversed = append(obj{"data_parallel_rank", rank}, reversed...)
	}
	return map[string][]byte{
		"struct order": mp(ordered),
		"reversed":     mp(reversed),
		"unknown key":  mp(append(obj{"publisher_id", raw{0xc4, 2, 1, 2}}, ordered...)),
	}
}

func TestMapEnvelopeDecodesLikeThePositionalOne(t *testing.T) {
	for _, g := range loadGoldens(t) {
		want, err := DecodeEventBatch(g.Payload)
		if err != nil {
			t.Fatal(err)
		}
		for name, payload := range asMapEnvelopes(t, g.Payload) {
			t.Run(g.Name+"/"+name, func(t *testing.T) {
				b, stats, err := DecodeEventBatchStats(payload)
				if err != nil {
					t.Fatal(err)
				}
				if d := diffBatch(b, want); d != "" {
					t.Error(d)
				}
				wantStats := DecodeStats{}
				if name == "unknown key" {
					wantStats.UnknownKeys = 1
				}
				if stats != wantStats {
					t.Errorf("stats %+v, want %+v", stats, wantStats)
				}
			})
		}
	}
}

// TestDecodeMapEnvelopeGolden pins the bytes msgspec writes for an
// EventBatch without array_like: a map of its three fields in declaration
// order.
func TestDecodeMapEnvelopeGolden(t *testing.T) {
	const golden = "83" + // map(3)
		"a27473" + "cb41da305498100000" + // "ts": 1757500000.25
		"a66576656e7473" + "91" + // "events": array(1)
		"81" + "a474797065" + "b0416c6c426c6f636b73436c6561726564" + // {"type": "AllBlocksCleared"}
		"b2646174615f706172616c6c656c5f72616e6b" + "03" // "data_parallel_rank": 3
	payload, err := hex.DecodeString(golden)
	if err != nil {
		t.Fatal(err)
	}
	b, err := DecodeEventBatch(payload)
	if err != nil {
		t.Fatal(err)
	}
	want := &EventBatch{TS: 1757500000.25, DataParallelRank: 3,
		Events: []KVEvent{&AllBlocksClearedEvent{Timestamp: TimeFromTS(1757500000.25)}}}
	if d := diffBatch(b, want); d != "" {
		t.Error(d)
	}
	ref, err := reference(payload)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkUntyped(b, ref); err != nil {
		t.Errorf("the reference decoder reads the golden differently: %v", err)
	}
}
