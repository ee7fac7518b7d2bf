// Package zmqwire holds what both ends of vLLM's KV-event stream need on
// the ZeroMQ wire: the 8-byte seq frame, multipart send and receive, and
// the endpoint rules of vLLM's publisher. The transport and the publisher
// use it; it is not part of kvgate's API.
package zmqwire

import (
	"encoding/binary"
	"math"
	"syscall"

	zmq "github.com/pebbe/zmq4"
)

// EndOfReplay is the seq vLLM's replay ROUTER sends in its end marker:
// (-1).to_bytes(8, "big", signed=True).
const EndOfReplay = math.MaxUint64

// SeqFrame encodes seq as vLLM does: 8 bytes, big-endian.
func SeqFrame(seq uint64) []byte {
	return binary.BigEndian.AppendUint64(make([]byte, 0, 8), seq)
}

// ParseSeqFrame decodes an 8-byte big-endian seq frame.
func ParseSeqFrame(frame []byte) (uint64, bool) {
	if len(frame) != 8 {
		return 0, false
	}
	return binary.BigEndian.Uint64(frame), true
}

// RecvFrames receives one whole multipart message into dst[:0], keeping
// its first keep frames, and returns them and the number of frames the
// message had. Frames beyond keep are received and dropped at once, so
// that a message of many frames, which is malformed for every caller, holds
// no more than keep frames in memory; and the elements of dst beyond those
// returned are cleared, so that dst keeps nothing of an earlier message.
// flags apply to the first frame (zmq.DONTWAIT to return syscall.EAGAIN
// when nothing is queued); the others are already there when the first one
// is.
func RecvFrames(s *zmq.Socket, flags zmq.Flag, dst [][]byte, keep int) ([][]byte, int, error) {
	frame, err := s.RecvBytes(flags)
	if err != nil {
		return clearFrames(dst[:0]), 0, err
	}
	return recvRest(s, frame, dst, keep)
}

// PeerAddress is the message property of the address of the peer a message
// came from (zmq_msg_gets); for tcp, its IP address without port.
const PeerAddress = "Peer-Address"

// RecvFramesFrom is RecvFrames that also returns the address of the peer
// the message came from ("" when the transport has none, as ipc and inproc).
func RecvFramesFrom(s *zmq.Socket, flags zmq.Flag, dst [][]byte, keep int) ([][]byte, int, string, error) {
	first, meta, err := s.RecvBytesWithMetadata(flags, PeerAddress)
	if err != nil {
		return clearFrames(dst[:0]), 0, "", err
	}
	frames, n, err := recvRest(s, first, dst, keep)
	if err != nil {
		return frames, n, "", err
	}
	return frames, n, meta[PeerAddress], nil
}

// recvRest receives the frames of a message after its first, received
// already, as RecvFrames describes.
func recvRest(s *zmq.Socket, first []byte, dst [][]byte, keep int) ([][]byte, int, error) {
	dst = dst[:0]
	frame := first
	for n := 1; ; n++ {
		if len(dst) < keep {
			dst = append(dst, frame)
		}
		more, err := s.GetRcvmore()
		if err != nil || !more {
			return clearFrames(dst), n, err
		}
		if frame, err = s.RecvBytes(0); err != nil {
			return clearFrames(dst), n, err
		}
	}
}

// clearFrames clears the elements of dst between its length and its
// capacity.
func clearFrames(dst [][]byte) [][]byte {
	clear(dst[len(dst):cap(dst)])
	return dst
}

// SendFrames sends frames as one multipart message.
func SendFrames(s *zmq.Socket, flags zmq.Flag, frames ...[]byte) error {
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

// IsAgain reports whether err means a non-blocking call found nothing to do.
func IsAgain(err error) bool {
	return zmq.AsErrno(err) == zmq.Errno(syscall.EAGAIN)
}
