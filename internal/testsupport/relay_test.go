package testsupport

import (
	"bufio"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// echoServer echoes every line it reads until the test ends.
func echoServer(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

// roundTrip writes a line to c and reads it back.
func roundTrip(c net.Conn, line string) (string, error) {
	if err := c.SetDeadline(time.Now().Add(WaitTimeout)); err != nil {
		return "", err
	}
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return "", err
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	return got, err
}

func TestRelayForwardsCutsAndRestores(t *testing.T) {
	r := NewRelay(t, echoServer(t))
	c, err := net.Dial("tcp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := roundTrip(c, "hello"); err != nil || got != "hello\n" {
		t.Fatalf("through the relay: %q, %v", got, err)
	}

	r.Cut()
	if _, err := roundTrip(c, "lost"); err == nil {
		t.Fatal("a relayed connection outlived Cut")
	}
	if c2, err := net.Dial("tcp", r.Addr()); err == nil {
		c2.Close()
		t.Fatal("dialling a cut relay succeeded")
	} else if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dialling a cut relay: %v, want the connection refused", err)
	}

	r.Restore()
	c3, err := net.Dial("tcp", r.Addr())
	if err != nil {
		t.Fatalf("dialling a restored relay: %v", err)
	}
	defer c3.Close()
	if got, err := roundTrip(c3, "again"); err != nil || got != "again\n" {
		t.Fatalf("through the restored relay: %q, %v", got, err)
	}
}
