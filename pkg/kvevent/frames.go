package kvevent

import (
	"encoding/binary"
	"math"
	"syscall"

	zmq "github.com/pebbe/zmq4"
)

// endOfReplay is the seq vLLM's replay ROUTER sends in its end marker:
// (-1).to_bytes(8, "big", signed=True).
const endOfReplay = math.MaxUint64

// seqFrame encodes seq as vLLM does: 8 bytes, big-endian.
func seqFrame(seq uint64) []byte {
	return binary.BigEndian.AppendUint64(make([]byte, 0, 8), seq)
}

// parseSeqFrame decodes an 8-byte big-endian seq frame.
func parseSeqFrame(frame []byte) (uint64, bool) {
	if len(frame) != 8 {
		return 0, false
	}
	return binary.BigEndian.Uint64(frame), true
}

// recvFrames receives one whole multipart message into dst[:0]. flags apply
// to the first frame (zmq.DONTWAIT to return syscall.EAGAIN when nothing is
// queued); the others are already there when the first one is.
func recvFrames(s *zmq.Socket, flags zmq.Flag, dst [][]byte) ([][]byte, error) {
	dst = dst[:0]
	for {
		frame, err := s.RecvBytes(flags)
		if err != nil {
			return dst, err
		}
		dst = append(dst, frame)
		more, err := s.GetRcvmore()
		if err != nil {
			return dst, err
		}
		if !more {
			return dst, nil
		}
		flags = 0
	}
}

// sendFrames sends frames as one multipart message.
func sendFrames(s *zmq.Socket, flags zmq.Flag, frames ...[]byte) error {
	for i, f := range frames {
		fl := flags
		if i < len(frames)-1 {
			fl |= zmq.SNDMORE
		}
		if _, err := s.SendBytes(f, fl); err != nil {
			return err
		}
	}
	return nil
}

// isAgain reports whether err means a non-blocking call found nothing to do.
func isAgain(err error) bool {
	return zmq.AsErrno(err) == zmq.Errno(syscall.EAGAIN)
}
