package publisher

import (
	"encoding/binary"
	"math"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvgate/kvgate/pkg/kvevent/internal/zmqwire"
)

// replayBuffer keeps the latest batches a publisher sent, oldest first, like
// vLLM's deque(maxlen=buffer_steps).
type replayBuffer struct {
	seqs     []uint64
	payloads [][]byte
	start    int // index of the oldest entry
	n        int
}

func (b *replayBuffer) init(size int) {
	b.seqs = make([]uint64, size)
	b.payloads = make([][]byte, size)
}

// add appends a batch, evicting the oldest when full.
func (b *replayBuffer) add(seq uint64, payload []byte) {
	i := (b.start + b.n) % len(b.seqs)
	if b.n == len(b.seqs) {
		b.start = (b.start + 1) % len(b.seqs)
	} else {
		b.n++
	}
	b.seqs[i], b.payloads[i] = seq, payload
}

// from calls fn for every buffered batch with seq >= start, oldest first.
func (b *replayBuffer) from(start uint64, fn func(seq uint64, payload []byte)) {
	for k := range b.n {
		i := (b.start + k) % len(b.seqs)
		if b.seqs[i] >= start {
			fn(b.seqs[i], b.payloads[i])
		}
	}
}

// parseStartSeq reads a replay request's start seq as vLLM does:
// int.from_bytes(frame, "big"), any length. A value beyond 64 bits is above
// every seq.
func parseStartSeq(frame []byte) uint64 {
	for len(frame) > 0 && frame[0] == 0 {
		frame = frame[1:]
	}
	if len(frame) > 8 {
		return math.MaxUint64
	}
	var v uint64
	for _, c := range frame {
		v = v<<8 | uint64(c)
	}
	return v
}

// serviceReplay answers every replay request waiting on the ROUTER: each
// buffered batch from the requested seq on, then the end marker. Requests
// that are not [identity, delimiter, start] are ignored, as vLLM does.
func (p *Publisher) serviceReplay() {
	if p.router == nil {
		return
	}
	for {
		frames, n, err := zmqwire.RecvFrames(p.router, zmq.DONTWAIT, p.frames, 3)
		p.frames = frames
		if err != nil {
			if !zmqwire.IsAgain(err) {
				p.logger.Error(err, "Receiving a replay request failed")
			}
			return
		}
		if n != 3 {
			p.logger.Info("Ignoring invalid replay request", "frames", n)
			continue
		}
		p.replay(frames[0], parseStartSeq(frames[2]))
	}
}

// replay sends one requester the batches from start on and the end marker.
func (p *Publisher) replay(identity []byte, start uint64) {
	var seqBuf [8]byte
	var err error
	p.buffer.from(start, func(seq uint64, payload []byte) {
		if err != nil {
			return
		}
		binary.BigEndian.PutUint64(seqBuf[:], seq)
		if p.cfg.ReplayLayout == ReplayWithTopic {
			err = zmqwire.SendFrames(p.router, 0, identity, nil, p.topic, seqBuf[:], payload)
		} else {
			err = zmqwire.SendFrames(p.router, 0, identity, nil, seqBuf[:], payload)
		}
	})
	if err == nil {
		binary.BigEndian.PutUint64(seqBuf[:], zmqwire.EndOfReplay)
		if p.cfg.ReplayLayout == ReplayWithTopic {
			err = zmqwire.SendFrames(p.router, 0, identity, nil, nil, seqBuf[:], nil)
		} else {
			err = zmqwire.SendFrames(p.router, 0, identity, nil, seqBuf[:], nil)
		}
	}
	if err != nil {
		p.logger.Error(err, "Answering a replay request failed", "fromSeq", start)
	}
}
