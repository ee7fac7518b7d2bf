package kvevent

import (
	"bytes"
	"fmt"
	"math"
	"reflect"
	"time"
)

// diffBatch describes the first difference between two batches, or returns
// "". Timestamps compare as instants, TS by its bits (so NaN equals NaN),
// empty and nil hash and token lists as equal, and ExtraKeys strictly (a nil
// list is not an empty one, a nil entry is not an empty one).
func diffBatch(got, want *EventBatch) string {
	if math.Float64bits(got.TS) != math.Float64bits(want.TS) {
		return fmt.Sprintf("TS %v, want %v", got.TS, want.TS)
	}
	if got.DataParallelRank != want.DataParallelRank {
		return fmt.Sprintf("DataParallelRank %d, want %d", got.DataParallelRank, want.DataParallelRank)
	}
	if len(got.Events) != len(want.Events) {
		return fmt.Sprintf("%d events, want %d", len(got.Events), len(want.Events))
	}
	for i := range got.Events {
		if d := diffEvent(got.Events[i], want.Events[i]); d != "" {
			return fmt.Sprintf("event %d: %s", i, d)
		}
	}
	return ""
}

// diffEvent describes the first difference between two events, compared as
// diffBatch does, or returns "".
func diffEvent(got, want KVEvent) string {
	if reflect.TypeOf(got) != reflect.TypeOf(want) {
		return fmt.Sprintf("%T, want %T", got, want)
	}
	if !got.GetTimestamp().Equal(want.GetTimestamp()) {
		return fmt.Sprintf("Timestamp %v, want %v", got.GetTimestamp(), want.GetTimestamp())
	}
	g, w := plainFields(got), plainFields(want)
	if gs, ok := got.(*BlockStoredEvent); ok {
		if d := diffExtraKeys(gs.ExtraKeys, want.(*BlockStoredEvent).ExtraKeys); d != "" {
			return d
		}
	}
	if !reflect.DeepEqual(g, w) {
		return fmt.Sprintf("\n got %+v\nwant %+v", g, w)
	}
	return ""
}

// plainFields returns a copy of ev without what diffEvent compares by hand,
// with empty lists as nil.
func plainFields(ev KVEvent) any {
	switch e := ev.(type) {
	case *BlockStoredEvent:
		c := *e
		c.Timestamp, c.ExtraKeys = time.Time{}, nil
		c.BlockHashes, c.TokenIDs = nilIfEmpty(c.BlockHashes), nilIfEmpty(c.TokenIDs)
		return c
	case *BlockRemovedEvent:
		c := *e
		c.Timestamp = time.Time{}
		c.BlockHashes = nilIfEmpty(c.BlockHashes)
		return c
	}
	return nil
}

func nilIfEmpty[T any](s []T) []T {
	if len(s) == 0 {
		return nil
	}
	return s
}

func diffExtraKeys(got, want [][]byte) string {
	if (got == nil) != (want == nil) || len(got) != len(want) {
		return fmt.Sprintf("ExtraKeys %x, want %x", got, want)
	}
	for i := range got {
		if (got[i] == nil) != (want[i] == nil) || !bytes.Equal(got[i], want[i]) {
			return fmt.Sprintf("ExtraKeys[%d] %x, want %x", i, got[i], want[i])
		}
	}
	return ""
}
