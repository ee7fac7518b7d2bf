package transport

// An inbox holds the messages read from a socket and not yet applied,
// bounded in bytes.
//
// A stream reads its sockets as soon as they are readable and applies what
// it read in slices of at most processSlice, reading again in between. The
// messages waiting in between sit in an inbox, so that ZeroMQ's own queue,
// whose high-water mark counts messages of any size, stays close to empty
// and the bytes a stream holds are the inbox's, which are counted and
// bounded: a live message that does not fit is dropped (the stream
// recovers it through replay, as it would one the engine's PUB dropped),
// and a replay whose replies do not fit is cut short (the stream replays
// the rest again later).

// inboxOverhead is what one message costs an inbox besides its frames.
const inboxOverhead = 64

// inMsg is one message in an inbox: a live batch, or a replay reply.
type inMsg struct {
	seq     uint64
	payload []byte
	// topic is a reply's topic frame, when hasTopic (see replayReply).
	topic    []byte
	hasTopic bool
}

// size is what m counts against an inbox's bound.
func (m *inMsg) size() int { return len(m.payload) + len(m.topic) + inboxOverhead }

// inbox is a FIFO of messages bounded in bytes. Its owner goroutine alone
// uses it.
type inbox struct {
	msgs  []inMsg
	head  int // index of the oldest message
	bytes int
	limit int
}

// push appends m unless that would take the inbox beyond its limit, and
// reports whether it did. An empty inbox takes any message, so that one
// message as large as the limit always fits.
func (b *inbox) push(m inMsg) bool {
	size := m.size()
	if b.bytes > 0 && b.bytes+size > b.limit {
		return false
	}
	if b.head > 0 && len(b.msgs) == cap(b.msgs) {
		// Reuse the room of the messages popped rather than grow.
		n := copy(b.msgs, b.msgs[b.head:])
		clear(b.msgs[n:])
		b.msgs, b.head = b.msgs[:n], 0
	}
	b.msgs = append(b.msgs, m)
	b.bytes += size
	return true
}

// pop removes and returns the oldest message.
func (b *inbox) pop() (inMsg, bool) {
	if b.head == len(b.msgs) {
		return inMsg{}, false
	}
	m := b.msgs[b.head]
	b.msgs[b.head] = inMsg{}
	b.head++
	b.bytes -= m.size()
	if b.head == len(b.msgs) {
		b.msgs, b.head = b.msgs[:0], 0
	}
	return m, true
}

// empty reports whether nothing waits.
func (b *inbox) empty() bool { return b.head == len(b.msgs) }

// clear drops every message.
func (b *inbox) clear() {
	clear(b.msgs)
	b.msgs, b.head, b.bytes = b.msgs[:0], 0, 0
}
