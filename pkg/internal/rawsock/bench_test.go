package rawsock

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// peerEnv names the environment variable that makes the test binary the
// peer of BenchmarkRoundTrip.
const peerEnv = "RAWSOCK_BENCH_PEER"

func TestMain(m *testing.M) {
	if os.Getenv(peerEnv) != "" {
		servePeer()
		return
	}
	os.Exit(m.Run())
}

// servePeer answers each 200-byte request of one connection with 300
// bytes, telling its address on stdout first.
func servePeer() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(ln.Addr())
	p, err := ln.Accept()
	if err != nil {
		os.Exit(1)
	}
	req, resp := make([]byte, 200), make([]byte, 300)
	for {
		if _, err := io.ReadFull(p, req); err != nil {
			return
		}
		if _, err := p.Write(resp); err != nil {
			return
		}
	}
}

// BenchmarkRoundTrip sends a 200-byte request over loopback TCP to a peer
// process that answers 300 bytes, one request at a time, through the net
// package's connection and through a Conn. cpu-µs/op is this process's
// CPU time a round trip, its runtime's threads included: the process waits
// idle for every answer, as a proxy does for its engine's, and what the
// scheduler spends around the system calls shows there rather than in
// the time per op.
func BenchmarkRoundTrip(b *testing.B) {
	for _, wrap := range []struct {
		name string
		fn   func(net.Conn) net.Conn
	}{
		{"net", func(c net.Conn) net.Conn { return c }},
		{"rawsock", Wrap},
	} {
		b.Run(wrap.name, func(b *testing.B) {
			peer := exec.Command(os.Args[0])
			peer.Env = append(os.Environ(), peerEnv+"=1")
			out, err := peer.StdoutPipe()
			if err != nil {
				b.Fatal(err)
			}
			peer.Stderr = os.Stderr
			if err := peer.Start(); err != nil {
				b.Fatal(err)
			}
			defer func() { _ = peer.Wait() }()
			addr, err := bufio.NewReader(out).ReadString('\n')
			if err != nil {
				b.Fatal(err)
			}
			nc, err := net.Dial("tcp", strings.TrimSpace(addr))
			if err != nil {
				b.Fatal(err)
			}
			c := wrap.fn(nc)
			defer c.Close()
			req, resp := make([]byte, 200), make([]byte, 300)
			round := func() {
				if _, err := c.Write(req); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(c, resp); err != nil {
					b.Fatal(err)
				}
			}
			round()
			before := cpuTime()
			b.ResetTimer()
			for b.Loop() {
				round()
			}
			b.StopTimer()
			b.ReportMetric(float64(cpuTime()-before)/float64(time.Microsecond)/float64(b.N), "cpu-µs/op")
		})
	}
}

// cpuTime returns the CPU time the process has used, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
