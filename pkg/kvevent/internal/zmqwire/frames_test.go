package zmqwire

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// pair returns a PUSH socket connected over loopback tcp to a PULL socket,
// which gives up a receive after a few seconds.
func pair(t *testing.T) (push, pull *zmq.Socket) {
	t.Helper()
	ctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctx.Term() }) // after the sockets close
	sockets := make([]*zmq.Socket, 2)
	for i, ty := range []zmq.Type{zmq.PUSH, zmq.PULL} {
		if sockets[i], err = ctx.NewSocket(ty); err != nil {
			t.Fatal(err)
		}
		s := sockets[i]
		t.Cleanup(func() { s.Close() })
		if err := s.SetLinger(0); err != nil {
			t.Fatal(err)
		}
	}
	push, pull = sockets[0], sockets[1]
	if err := pull.SetRcvtimeo(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := pull.Bind("tcp://127.0.0.1:*"); err != nil {
		t.Fatal(err)
	}
	ep, err := pull.GetLastEndpoint()
	if err != nil {
		t.Fatal(err)
	}
	if err := push.Connect(ep); err != nil {
		t.Fatal(err)
	}
	return push, pull
}

// numbered returns n frames of size bytes, each filled with its index.
func numbered(n, size int) [][]byte {
	frames := make([][]byte, n)
	for i := range frames {
		frames[i] = bytes.Repeat([]byte{byte(i)}, size)
	}
	return frames
}

func TestRecvFramesKeepsTheFramesAskedForAndNothingElse(t *testing.T) {
	push, pull := pair(t)
	receivers := map[string]func(dst [][]byte, keep int) ([][]byte, int, error){
		"RecvFrames": func(dst [][]byte, keep int) ([][]byte, int, error) { return RecvFrames(pull, 0, dst, keep) },
		"RecvFramesFrom": func(dst [][]byte, keep int) ([][]byte, int, error) {
			frames, n, peer, err := RecvFramesFrom(pull, 0, dst, keep)
			if err == nil && peer != "127.0.0.1" {
				err = fmt.Errorf("peer %q, want 127.0.0.1", peer)
			}
			return frames, n, err
		},
	}
	// Messages of 4, 1000 and 3 frames, received keeping 4 frames.
	messages := []struct{ n, kept int }{{4, 4}, {1000, 4}, {3, 3}}
	for name, recv := range receivers {
		t.Run(name, func(t *testing.T) {
			for _, m := range messages {
				if err := SendFrames(push, 0, numbered(m.n, 1024)...); err != nil {
					t.Fatal(err)
				}
			}
			var dst [][]byte
			for _, m := range messages {
				var n int
				var err error
				if dst, n, err = recv(dst, 4); err != nil {
					t.Fatal(err)
				}
				if n != m.n || len(dst) != m.kept {
					t.Fatalf("received %d frames, kept %d; want %d and %d", n, len(dst), m.n, m.kept)
				}
				for i, f := range dst {
					if len(f) != 1024 || f[0] != byte(i) {
						t.Fatalf("frame %d holds %d bytes %x..., want frame %d", i, len(f), f[:min(len(f), 4)], i)
					}
				}
				if cap(dst) > 8 {
					t.Errorf("a message of %d frames grew the frame slice to %d", n, cap(dst))
				}
				for i, f := range dst[len(dst):cap(dst)] {
					if f != nil {
						t.Errorf("after a message of %d frames, the frame slice still holds %d bytes at %d", n, len(f), len(dst)+i)
					}
				}
			}
		})
	}
}
