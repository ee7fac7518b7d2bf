package kvevent

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"
)

// DecodeError describes why a payload is not a valid vLLM event batch and
// where the decoder found out.
type DecodeError struct {
	// Offset is the byte offset in the payload of the element at fault.
	Offset int
	// Event is the index of the event in the batch's event list (counting
	// skipped events), or -1 for the envelope around the events.
	Event int
	// Field names the field being decoded ("ts", "events" and
	// "data_parallel_rank" in the envelope, "type" for an event's tag, the
	// map key or positional field name in an event), or "" when none.
	Field string
	// Err says what is wrong.
	Err error
}

// Error describes the problem and where it is.
func (e *DecodeError) Error() string {
	where := "envelope"
	if e.Event >= 0 {
		where = fmt.Sprintf("event %d", e.Event)
	}
	if e.Field != "" {
		where += " field " + e.Field
	}
	return fmt.Sprintf("kvevent: decode batch: %s at byte %d: %v", where, e.Offset, e.Err)
}

// Unwrap returns the underlying problem.
func (e *DecodeError) Unwrap() error { return e.Err }

// ErrBatchTooLarge is the error a *DecodeError wraps when a batch would
// decode to more memory than DecodeEventBatchStats allows for its size.
var ErrBatchTooLarge = errors.New("batch decodes to more memory than its size allows")

// The decode budget: a batch of n payload bytes may decode to at most
// budgetPerByte*n + budgetFloor bytes. vLLM's densest event, a v0.9
// BlockRemoved of one 64-bit hash, takes 24 bytes on the wire and 352
// decoded; a batch crafted to expand (extra_keys of nils, tag-only events)
// would take up to 60 times its size.
const (
	budgetPerByte = 16
	budgetFloor   = 64 << 10
)

// What the decoder charges to the budget, in bytes of its scratch buffers
// and of the decoded batch: for each event the batch declares, its record
// and its slot in EventBatch.Events; for each known event, its struct (see
// eventSize); for each block hash, token id and extra_keys element, its
// scratch entry and its place in the batch; and the bytes of strings and
// extra keys copied from the payload.
const (
	eventCost = int(unsafe.Sizeof(eventRec{}) + unsafe.Sizeof(KVEvent(nil)))
	hashCost  = 2 * int(unsafe.Sizeof(BlockHash(0)))
	tokenCost = 2 * int(unsafe.Sizeof(uint32(0)))
	extraCost = int(unsafe.Sizeof(span{}) + unsafe.Sizeof([]byte(nil)))
)

// eventSize is the size of the struct of a known event of type typ.
func eventSize(typ EventType) int {
	switch typ {
	case EventTypeBlockStored:
		return int(unsafe.Sizeof(BlockStoredEvent{}))
	case EventTypeBlockRemoved:
		return int(unsafe.Sizeof(BlockRemovedEvent{}))
	}
	return int(unsafe.Sizeof(AllBlocksClearedEvent{}))
}

// DecodeStats counts what a decoder skipped in a batch it accepted. Non-zero
// counts mean the engine speaks a newer dialect than this package knows:
// everything known was decoded, the rest was ignored.
type DecodeStats struct {
	// UnknownEvents counts events whose tag names no known event type.
	UnknownEvents int
	// UnknownKeys counts map keys of known events that name no field of
	// that event, and keys of a map envelope other than its three fields.
	UnknownKeys int
	// UnknownFields counts trailing elements of positional events and of
	// the envelope beyond the fields this package knows.
	UnknownFields int
}

// DecodeEventBatch decodes one vLLM KV-event batch: the last frame of a
// message from vLLM's PUB socket or of a replay reply. See
// DecodeEventBatchStats for the formats it accepts; it is the same decoder
// without the counts of skipped elements.
func DecodeEventBatch(payload []byte) (*EventBatch, error) {
	b, _, err := DecodeEventBatchStats(payload)
	return b, err
}

// DecodeEventBatchStats decodes one vLLM KV-event batch and counts what it
// skipped.
//
// It accepts every layout vLLM has sent: the envelope [ts, events] of v0.9
// (the batch gets NoRank) and [ts, events, data_parallel_rank] of later
// versions, with extra trailing elements ignored; the same envelope as a map
// {"ts", "events", "data_parallel_rank"} in any key order, as msgspec writes
// it without array_like (a vLLM development branch, and engines that copied
// it), with unknown keys skipped and counted; events as positional arrays
// (tag first, vLLM <= v0.23) or as maps keyed by field name with the tag
// under "type" (vLLM >= v0.24), mixed freely. Events with an unknown tag, unknown
// map keys and unknown trailing positional fields are skipped and counted.
// Fields an event does not carry get their zero value, NoGroup for GroupIdx.
// Block hashes become BlockHash values as the BlockHash documentation
// describes. Every event is stamped with the batch time.
//
// The batch shares no memory with payload, which the caller may reuse as soon
// as DecodeEventBatchStats returns. The slices of the returned events share a
// few allocations per batch, so keeping any of them keeps the whole batch's
// hashes and tokens; copy what is kept for long. Decoding is safe for
// concurrent use.
//
// A payload that is not a well-formed batch (truncated, wrong types, token ids
// outside uint32, empty digests, trailing bytes, ...) yields a nil batch, zero
// stats and a *DecodeError saying what is wrong and where.
//
// The memory a batch decodes to is bounded by its size: the decoded batch
// and what the decoder's scratch buffers hold for it take at most 16 bytes
// per payload byte, plus 64 KiB (256 MiB for a 16 MiB payload); the spare
// capacity of the scratch buffers adds at most a quarter of what they hold.
// Every batch vLLM publishes fits: a prefill takes 2 to 8 bytes per payload
// byte, a step's evictions 5.5 (12 in the positional layout of v0.10 to
// v0.23, 15 in v0.9's, the densest). A payload crafted to expand further
// (long arrays of nils, tiny events) is refused with a *DecodeError that
// wraps ErrBatchTooLarge before the decoder allocates for the element that
// would exceed the budget.
func DecodeEventBatchStats(payload []byte) (*EventBatch, DecodeStats, error) {
	d := decoderPool.Get().(*decoder)
	defer d.release()
	b, err := d.decode(payload)
	if err != nil {
		if de, ok := err.(*DecodeError); ok {
			de.Event = d.event
			de.Field = d.fieldName()
		}
		return nil, DecodeStats{}, err
	}
	return b, d.stats, nil
}

var decoderPool = sync.Pool{New: func() any { return new(decoder) }}

// maxPooledScratch bounds the scratch a pooled decoder keeps between batches,
// in elements per buffer, so one huge batch does not pin its memory.
const maxPooledScratch = 1 << 16

// decoder decodes one batch at a time. It collects the events' numbers in
// scratch buffers that it reuses across batches, then copies them into
// allocations sized exactly for the batch (see build).
type decoder struct {
	r      reader
	stats  DecodeStats
	budget int // bytes the batch may still decode to

	// Where the decoder is, for errors.
	event int    // index of the event being decoded, -1 in the envelope
	field string // name of the field being decoded
	key   []byte // unknown map key whose value is being skipped

	recs   []eventRec
	hashes []BlockHash
	tokens []uint32
	extras []span
}

// span is a range [lo, hi) of a scratch buffer or of the payload; for an
// extra_keys element, lo < 0 means nil.
type span struct{ lo, hi int }

// eventRec is one decoded event before it gets its final memory.
type eventRec struct {
	typ       EventType
	hashes    span // in decoder.hashes
	tokens    span // in decoder.tokens
	extras    span // in decoder.extras
	hasExtras bool
	parent    BlockHash
	hasParent bool

	blockSize, loraID, groupIdx, window                        int
	medium, loraName, specKind, locality, ownership, sessionID string
}

func (d *decoder) release() {
	clear(d.recs)
	d.recs = trimScratch(d.recs)
	d.hashes = trimScratch(d.hashes)
	d.tokens = trimScratch(d.tokens)
	d.extras = trimScratch(d.extras)
	d.r = reader{}
	d.stats = DecodeStats{}
	d.key = nil
	decoderPool.Put(d)
}

func trimScratch[T any](s []T) []T {
	if cap(s) > maxPooledScratch {
		return nil
	}
	return s[:0]
}

// maxKeyInError bounds the bytes of an unknown map key that a DecodeError
// names, so that an error about a huge key stays small.
const maxKeyInError = 256

func (d *decoder) fieldName() string {
	if d.field == "" && d.key != nil {
		if len(d.key) > maxKeyInError {
			return string(d.key[:maxKeyInError]) + "..."
		}
		return string(d.key)
	}
	return d.field
}

// charge takes n bytes from the batch's decode budget, failing for the
// element at off when they are not left.
func (d *decoder) charge(off, n int) error {
	if d.budget -= n; d.budget < 0 {
		return d.overBudget(off)
	}
	return nil
}

func (d *decoder) overBudget(off int) error {
	size := len(d.r.buf)
	return d.r.failf(off, "%w: a payload of %d bytes may decode to %d bytes", ErrBatchTooLarge, size, budgetPerByte*size+budgetFloor)
}

func (d *decoder) decode(payload []byte) (*EventBatch, error) {
	d.r = reader{buf: payload}
	d.budget = budgetPerByte*len(payload) + budgetFloor
	d.event, d.field = -1, ""
	c, err := d.r.peek()
	if err != nil {
		return nil, err
	}
	var ts float64
	var rank int
	if mapHeader.is(c) {
		ts, rank, err = d.mapEnvelope()
	} else {
		ts, rank, err = d.arrayEnvelope()
	}
	if err != nil {
		return nil, err
	}
	if d.r.remaining() > 0 {
		return nil, d.r.failf(d.r.off, "%d bytes follow the batch", d.r.remaining())
	}
	return d.build(ts, rank), nil
}

// arrayEnvelope decodes the positional envelope every released vLLM sends:
// [ts, events] (v0.9) or [ts, events, data_parallel_rank], extra trailing
// elements skipped.
func (d *decoder) arrayEnvelope() (ts float64, rank int, err error) {
	n, err := d.r.arrayLen()
	if err != nil {
		return 0, 0, err
	}
	if n < 2 {
		return 0, 0, d.r.failf(0, "envelope has %d elements, want at least 2 (ts, events)", n)
	}
	d.field = "ts"
	if ts, err = d.r.float(); err != nil {
		return 0, 0, err
	}
	if err := d.events(); err != nil {
		return 0, 0, err
	}
	rank = NoRank
	if n >= 3 {
		d.field = "data_parallel_rank"
		if rank, err = d.optInteger(NoRank, false); err != nil {
			return 0, 0, err
		}
		d.field = ""
	}
	for i := 3; i < n; i++ {
		d.stats.UnknownFields++
		if err := d.r.skip(); err != nil {
			return 0, 0, err
		}
	}
	return ts, rank, nil
}

// Keys of the map envelope.
const (
	envelopeTS     = "ts"
	envelopeEvents = "events"
	envelopeRank   = "data_parallel_rank"
)

// mapEnvelope decodes the envelope as a map keyed by field name, {"ts": ts,
// "events": [...], "data_parallel_rank": rank}, as msgspec writes EventBatch
// without array_like (a vLLM development branch did). Keys come in any
// order; ts and events are required, the rank is optional, unknown keys are
// skipped and counted, and a key that appears twice is an error.
func (d *decoder) mapEnvelope() (ts float64, rank int, err error) {
	n, err := d.r.mapLen()
	if err != nil {
		return 0, 0, err
	}
	rank = NoRank
	var hasTS, hasEvents, hasRank bool
	for range n {
		c, err := d.r.peek()
		if err != nil {
			return 0, 0, err
		}
		if !strHeader.is(c) {
			d.stats.UnknownKeys++
			if err := d.r.skip(); err != nil {
				return 0, 0, err
			}
			if err := d.r.skip(); err != nil {
				return 0, 0, err
			}
			continue
		}
		start := d.r.off
		key, err := d.r.data(&strHeader)
		if err != nil {
			return 0, 0, err
		}
		var seen *bool
		switch string(key) {
		case envelopeTS:
			seen = &hasTS
		case envelopeEvents:
			seen = &hasEvents
		case envelopeRank:
			seen = &hasRank
		default:
			d.stats.UnknownKeys++
			d.key = key
			if err := d.r.skip(); err != nil {
				return 0, 0, err
			}
			d.key = nil
			continue
		}
		if *seen {
			return 0, 0, d.r.failf(start, "duplicate envelope key %q", key)
		}
		*seen = true
		switch string(key) {
		case envelopeTS:
			d.field = envelopeTS
			if ts, err = d.r.float(); err != nil {
				return 0, 0, err
			}
			d.field = ""
		case envelopeEvents:
			err = d.events()
		default:
			d.field = envelopeRank
			if rank, err = d.optInteger(NoRank, false); err == nil {
				d.field = ""
			}
		}
		if err != nil {
			return 0, 0, err
		}
	}
	switch {
	case !hasTS:
		return 0, 0, d.r.failf(0, "envelope map has no %q key", envelopeTS)
	case !hasEvents:
		return 0, 0, d.r.failf(0, "envelope map has no %q key", envelopeEvents)
	}
	return ts, rank, nil
}

// events decodes the list of events. It charges every event's record
// before it makes room for them.
func (d *decoder) events() error {
	d.field = envelopeEvents
	start := d.r.off
	n, err := d.r.arrayLen()
	if err != nil {
		return err
	}
	if err := d.charge(start, n*eventCost); err != nil {
		return err
	}
	if cap(d.recs) < n {
		d.recs = make([]eventRec, 0, n)
	}
	d.field = ""
	for d.event = 0; d.event < n; d.event++ {
		if err := d.decodeEvent(); err != nil {
			return err
		}
	}
	d.event = -1
	return nil
}

// decodeEvent decodes the next event, positional or tagged map, or skips it
// if its tag is unknown.
func (d *decoder) decodeEvent() error {
	start := d.r.off
	c, err := d.r.peek()
	if err != nil {
		return err
	}
	d.recs = append(d.recs, eventRec{groupIdx: NoGroup})
	rec := &d.recs[len(d.recs)-1]
	var known bool
	switch {
	case mapHeader.is(c):
		known, err = d.mapEvent(rec)
	case arrayHeader.is(c):
		known, err = d.positionalEvent(rec)
	default:
		return d.r.failf(start, "expected event as map or array, got %s", typeName(c))
	}
	if err != nil {
		return err
	}
	if known {
		return d.charge(start, eventSize(rec.typ))
	}
	d.recs = d.recs[:len(d.recs)-1]
	d.stats.UnknownEvents++
	d.r.off = start
	return d.r.skip()
}

// positionalEvent decodes [tag, field...]. It reports false, having consumed
// only part of the event, if the tag is unknown.
func (d *decoder) positionalEvent(rec *eventRec) (bool, error) {
	start := d.r.off
	n, err := d.r.arrayLen()
	if err != nil {
		return false, err
	}
	if n == 0 {
		return false, d.r.failf(start, "positional event has no tag")
	}
	typ, known, err := d.tag()
	if err != nil || !known {
		return false, err
	}
	rec.typ = typ
	var order []field
	switch typ {
	case EventTypeBlockStored:
		order = storedPositional
	case EventTypeBlockRemoved:
		order = removedPositional
	}
	for i := 1; i < n; i++ {
		if i > len(order) {
			d.stats.UnknownFields++
			if err := d.r.skip(); err != nil {
				return false, err
			}
			continue
		}
		if err := d.decodeField(order[i-1], rec); err != nil {
			return false, err
		}
	}
	return true, nil
}

// mapEvent decodes {"type": tag, field: value...}, keys in any order. It
// reports false, having consumed only part of the event, if the tag is
// unknown.
func (d *decoder) mapEvent(rec *eventRec) (bool, error) {
	start := d.r.off
	n, err := d.r.mapLen()
	if err != nil {
		return false, err
	}
	body := d.r.off
	typ, known, err := d.findTag(start, n)
	if err != nil || !known {
		return false, err
	}
	rec.typ = typ
	d.r.off = body
	fields := removedFields
	switch typ {
	case EventTypeBlockStored:
		fields = storedFields
	case EventTypeAllCleared:
		fields = 0
	}
	m := mapState{fields: fields}
	for range n {
		if err := d.mapEntry(rec, &m); err != nil {
			return false, err
		}
	}
	return true, nil
}

// mapState tracks the keys of one tagged-map event.
type mapState struct {
	fields fieldSet // the fields of the event's type
	seen   fieldSet // the fields decoded so far
	tagged bool     // whether the "type" key was seen
	next   field    // the field the next key most likely names
}

// mapEntry decodes one key and value of a tagged-map event, skipping the tag
// and keys that name no field of the event. A key that appears twice is an
// error: which value to keep would be a guess.
func (d *decoder) mapEntry(rec *eventRec, m *mapState) error {
	if c, err := d.r.peek(); err != nil {
		return err
	} else if !strHeader.is(c) {
		d.stats.UnknownKeys++
		if err := d.r.skip(); err != nil {
			return err
		}
		return d.r.skip()
	}
	start := d.r.off
	key, err := d.r.data(&strHeader)
	if err != nil {
		return err
	}
	if string(key) == tagKey {
		if m.tagged {
			return d.r.failf(start, "duplicate key %q", key)
		}
		m.tagged = true
		return d.r.skip()
	}
	f, ok := lookupField(key, m.next)
	if !ok || !m.fields.has(f) {
		d.stats.UnknownKeys++
		d.key = key
		if err := d.r.skip(); err != nil {
			return err
		}
		d.key = nil
		return nil
	}
	if m.seen.has(f) {
		return d.r.failf(start, "duplicate key %q", key)
	}
	m.seen |= 1 << f
	m.next = f + 1
	return d.decodeField(f, rec)
}

// findTag scans the n pairs of the map at start for the "type" key and
// returns the event type it names.
func (d *decoder) findTag(start, n int) (EventType, bool, error) {
	for range n {
		c, err := d.r.peek()
		if err != nil {
			return "", false, err
		}
		if strHeader.is(c) {
			key, err := d.r.data(&strHeader)
			if err != nil {
				return "", false, err
			}
			if string(key) == tagKey {
				return d.tag()
			}
		} else if err := d.r.skip(); err != nil {
			return "", false, err
		}
		if err := d.r.skip(); err != nil {
			return "", false, err
		}
	}
	return "", false, d.r.failf(start, "event map has no %q key", tagKey)
}

// tag reads an event tag.
func (d *decoder) tag() (EventType, bool, error) {
	d.field = tagKey
	tag, err := d.r.data(&strHeader)
	if err != nil {
		return "", false, err
	}
	d.field = ""
	typ, ok := eventTypeOfTag(tag)
	return typ, ok, nil
}
