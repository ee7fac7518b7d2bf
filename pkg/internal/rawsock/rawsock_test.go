package rawsock

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"
)

// pair returns the two ends of a loopback TCP connection, the first
// wrapped, both closed at the test's end.
func pair(t *testing.T) (*Conn, *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := Listener{ln}.Accept()
		if err != nil {
			t.Error(err)
		}
		accepted <- c
	}()
	peer, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := <-accepted
	rc, ok := c.(*Conn)
	if !ok {
		t.Fatalf("Accept returned a %T, want a *Conn", c)
	}
	t.Cleanup(func() { rc.Close(); peer.Close() })
	return rc, peer.(*net.TCPConn)
}

func randomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func TestBytesCrossBothWaysWholeAndInOrder(t *testing.T) {
	c, peer := pair(t)
	// Small socket buffers make the writes partial and wait for the
	// reader, several MaxIO over.
	for _, s := range []*net.TCPConn{c.Conn.(*net.TCPConn), peer} {
		_ = s.SetReadBuffer(16 << 10)
		_ = s.SetWriteBuffer(16 << 10)
	}
	head, body := randomBytes(3000, 1), randomBytes(3*MaxIO+12345, 2)
	back := randomBytes(2*MaxIO+777, 3)
	var wg sync.WaitGroup
	wg.Go(func() {
		n, err := c.WriteTwo(head, body)
		if err != nil || n != int64(len(head)+len(body)) {
			t.Errorf("WriteTwo = %d, %v; want %d bytes", n, err, len(head)+len(body))
		}
	})
	wg.Go(func() {
		if n, err := peer.Write(back); err != nil || n != len(back) {
			t.Errorf("peer's Write = %d, %v", n, err)
		}
	})
	got := make([]byte, len(head)+len(body))
	if _, err := io.ReadFull(peer, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, append(append([]byte{}, head...), body...)) {
		t.Error("the peer read other bytes than the head and body written")
	}
	gotBack := make([]byte, len(back))
	if _, err := io.ReadFull(c, gotBack); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(gotBack, back) {
		t.Error("Read returned other bytes than the peer wrote")
	}
	wg.Wait()
}

func TestEmptyReadsAndWritesMakeNoCall(t *testing.T) {
	c, _ := pair(t)
	if n, err := c.Read(nil); n != 0 || err != nil {
		t.Errorf("Read(nil) = %d, %v", n, err)
	}
	if n, err := c.Write(nil); n != 0 || err != nil {
		t.Errorf("Write(nil) = %d, %v", n, err)
	}
	if n, err := c.WriteTwo(nil, []byte{}); n != 0 || err != nil {
		t.Errorf("WriteTwo of nothing = %d, %v", n, err)
	}
}

func TestWriteTwoSkipsAnEmptyHalf(t *testing.T) {
	c, peer := pair(t)
	for _, tc := range []struct{ a, b string }{{"", "body"}, {"head", ""}} {
		if n, err := c.WriteTwo([]byte(tc.a), []byte(tc.b)); err != nil || n != int64(len(tc.a+tc.b)) {
			t.Fatalf("WriteTwo(%q, %q) = %d, %v", tc.a, tc.b, n, err)
		}
		got := make([]byte, len(tc.a+tc.b))
		if _, err := io.ReadFull(peer, got); err != nil || string(got) != tc.a+tc.b {
			t.Errorf("the peer read %q, %v; want %q", got, err, tc.a+tc.b)
		}
	}
}

func TestReadEndsWithEOFWhenThePeerCloses(t *testing.T) {
	c, peer := pair(t)
	if _, err := peer.Write([]byte("last")); err != nil {
		t.Fatal(err)
	}
	peer.Close()
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "last" {
		t.Errorf("ReadAll = %q, %v; want \"last\" and no error", got, err)
	}
	if n, err := c.Read(make([]byte, 8)); n != 0 || err != io.EOF {
		t.Errorf("Read after the end = %d, %v; want io.EOF", n, err)
	}
}

func TestCloseWriteEndsThePeersRead(t *testing.T) {
	c, peer := pair(t)
	if _, err := c.Write([]byte("bye")); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(peer)
	if err != nil || string(got) != "bye" {
		t.Errorf("the peer read %q, %v", got, err)
	}
	// The reading side stays open.
	if _, err := peer.Write([]byte("ok")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ok" {
		t.Errorf("Read after CloseWrite = %q, %v", buf, err)
	}
}

func TestDeadlinesEndReadsAndWritesAsTheNetPackagesDo(t *testing.T) {
	c, peer := pair(t)
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	n, err := c.Read(make([]byte, 8))
	var ne net.Error
	if n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("Read past its deadline = %d, %v; want a timeout", n, err)
	}
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != "read" || oe.Addr == nil || oe.Source == nil {
		t.Errorf("Read's error %#v is not a read's *net.OpError with both addresses", err)
	}

	// The peer reads one byte and no more: the socket's buffers fill and
	// the write waits for room until a deadline set in the past ends it,
	// having written part, which the peer then reads in full.
	_ = c.Conn.(*net.TCPConn).SetWriteBuffer(16 << 10)
	_ = peer.SetReadBuffer(16 << 10)
	big := randomBytes(4<<20, 4)
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := c.Write(big)
		done <- result{n, err}
	}()
	first := make([]byte, 1)
	if _, err := io.ReadFull(peer, first); err != nil || first[0] != big[0] {
		t.Fatalf("the peer read %x, %v; want the first byte", first, err)
	}
	_ = c.SetWriteDeadline(time.Unix(1, 0))
	r := <-done
	if !errors.Is(r.err, os.ErrDeadlineExceeded) || r.n < 1 || r.n >= len(big) {
		t.Fatalf("Write past its deadline = %d of %d bytes, %v; want part and a timeout", r.n, len(big), r.err)
	}
	rest := make([]byte, r.n-1)
	if _, err := io.ReadFull(peer, rest); err != nil || !bytes.Equal(rest, big[1:r.n]) {
		t.Errorf("the peer read other bytes than the %d Write reported, %v", r.n, err)
	}
}

func TestAConnectionResetIsTheSystemsError(t *testing.T) {
	c, peer := pair(t)
	_ = peer.SetLinger(0)
	if _, err := c.Write([]byte("unread")); err != nil {
		t.Fatal(err)
	}
	peer.Close() // sends a reset: linger 0
	_, err := c.Read(make([]byte, 8))
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("Read after a reset = %v; want ECONNRESET", err)
	}
	var se *os.SyscallError
	if !errors.As(err, &se) || se.Syscall != "read" {
		t.Errorf("Read's error %v does not name the read system call", err)
	}
	// A write to a reset connection fails and the process lives on.
	var werr error
	for range 100 {
		if _, werr = c.Write([]byte("more")); werr != nil {
			break
		}
	}
	if !errors.Is(werr, syscall.EPIPE) && !errors.Is(werr, syscall.ECONNRESET) {
		t.Errorf("Write to a reset connection = %v; want EPIPE or ECONNRESET", werr)
	}
}

func TestCloseEndsABlockedRead(t *testing.T) {
	c, _ := pair(t)
	done := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 8))
		done <- err
	}()
	// The read may start before or after the close; either way it ends
	// with the closed connection's error.
	c.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("Read on a closed connection = %v; want net.ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Read did not end when the connection closed")
	}
}

func TestConcurrentReadersAndWritersTakeTurns(t *testing.T) {
	c, peer := pair(t)
	const writers, each = 4, 200
	msg := func(w, i int) []byte { return []byte{byte(w), byte(i), byte(i >> 8), 0xAB} }
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				if _, err := c.WriteTwo(msg(w, i)[:2], msg(w, i)[2:]); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	got := make([]byte, writers*each*4)
	if _, err := io.ReadFull(peer, got); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	// Every message arrives whole: no write interleaves another's.
	next := make([]int, writers)
	for k := 0; k < len(got); k += 4 {
		w, i := int(got[k]), int(got[k+1])|int(got[k+2])<<8
		if w >= writers || i != next[w] || got[k+3] != 0xAB {
			t.Fatalf("message %d is %x: writes interleaved", k/4, got[k:k+4])
		}
		next[w]++
	}

	// Readers sharing the connection read every byte once between them.
	if _, err := peer.Write(got); err != nil {
		t.Fatal(err)
	}
	reads := make(chan int, len(got))
	for range 4 {
		wg.Go(func() {
			buf := make([]byte, 7)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					reads <- n
				}
				if err != nil {
					return
				}
			}
		})
	}
	for total := 0; total < len(got); {
		total += <-reads
	}
	c.Close()
	wg.Wait()
}

func TestWrapKeepsOtherConnectionsAsTheyAre(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if got := Wrap(a); got != a {
		t.Errorf("Wrap(net.Pipe end) = %T, want the connection itself", got)
	}
}

// Under -race, the detector must see what one goroutine wrote before it
// sent bytes as written before another goroutine read them, both ways
// between a Conn and the net package's connections, as it does between
// two of the net package's: a proxy's tests hand requests to handlers so.
func TestTheRaceDetectorOrdersAWriteBeforeTheReadOfItsBytes(t *testing.T) {
	c, peer := pair(t)
	for _, dir := range []struct {
		name     string
		from, to net.Conn
	}{{"Conn to net", c, peer}, {"net to Conn", peer, c}} {
		var set int
		go func() {
			set = 1
			if _, err := dir.from.Write([]byte{1}); err != nil {
				t.Error(err)
			}
		}()
		if _, err := io.ReadFull(dir.to, make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
		if set != 1 {
			t.Errorf("%s: the byte was read before the write that preceded it", dir.name)
		}
	}
}

func TestSyscallConnPeeksAtTheSameSocket(t *testing.T) {
	c, peer := pair(t)
	if _, err := peer.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var b [1]byte
	var n int
	var peekErr error
	err = rc.Read(func(fd uintptr) bool {
		n, _, peekErr = syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return peekErr != syscall.EAGAIN
	})
	if err != nil || peekErr != nil || n != 1 || b[0] != 'x' {
		t.Fatalf("peek = %d, %v, %v; want the peer's byte", n, err, peekErr)
	}
	got := make([]byte, 1)
	if _, err := io.ReadFull(c, got); err != nil || got[0] != 'x' {
		t.Errorf("Read after the peek = %q, %v; want the byte still there", got, err)
	}
}
