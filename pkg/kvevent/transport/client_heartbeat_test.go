package transport

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testsupport"
	"github.com/kvgate/kvgate/pkg/kvevent/internal/kvtest"
)

// freezingProxy forwards TCP connections to a target until frozen: a frozen
// connection stays open but carries nothing, like a peer behind a network
// partition or a hung process. Connections accepted after freeze forward
// normally.
type freezingProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	frozen []*atomic.Bool
	wg     sync.WaitGroup
}

func startFreezingProxy(t *testing.T, target string) *freezingProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &freezingProxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *freezingProxy) port() int { return p.ln.Addr().(*net.TCPAddr).Port }

func (p *freezingProxy) accept() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			in.Close()
			continue
		}
		frozen := &atomic.Bool{}
		p.mu.Lock()
		p.conns = append(p.conns, in, out)
		p.frozen = append(p.frozen, frozen)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(out, in, frozen)
		go p.pipe(in, out, frozen)
	}
}

// pipe copies src to dst until either closes or the connection is frozen.
func (p *freezingProxy) pipe(dst, src net.Conn, frozen *atomic.Bool) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if frozen.Load() {
			return
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				return
			}
			dst.Close()
			return
		}
	}
}

func (p *freezingProxy) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, f := range p.frozen {
		f.Store(true)
	}
}

func (p *freezingProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func TestClientHeartbeatsDetectASilentPeerAndReconnect(t *testing.T) {
	t.Parallel()
	ports := kvtest.NewPorts(t)
	pub := kvtest.NewPublisher(t, ports, nil)
	proxy := startFreezingProxy(t, fmt.Sprintf("127.0.0.1:%d", ports.Pub))

	cfg := testClientConfig(ports)
	cfg.PubEndpoint = fmt.Sprintf("tcp://127.0.0.1:%d", proxy.port())
	cfg.ReplayEndpoint = fmt.Sprintf("tcp://127.0.0.1:%d", ports.Router)
	cfg.HeartbeatInterval = 100 * time.Millisecond
	cfg.HeartbeatTimeout = 300 * time.Millisecond
	cfg.HeartbeatTTL = time.Second
	rec := &kvtest.Recorder{}
	c := startClient(t, cfg, rec)
	if err := c.WaitForConnection(testsupport.WaitTimeout); err != nil {
		t.Fatal(err)
	}
	kvtest.Publish(t, pub, 1, 0, 3)
	testsupport.Eventually(t, "the first batches", func() bool { return rec.Count() >= 3 })

	// Nothing closes the connection: only missing heartbeats reveal it.
	proxy.freeze()
	testsupport.Eventually(t, "the silent peer to be noticed", func() bool { return c.Stats().Disconnections >= 1 })
	testsupport.Eventually(t, "a new connection", func() bool { return c.Stats().Connections >= 2 })
	kvtest.Publish(t, pub, 1, 3, 6)
	testsupport.Eventually(t, "the batches after the reconnection", func() bool { return rec.Count() >= 6 })
	got, resets := rec.Snapshot()
	kvtest.CheckSequence(t, got, 1, 0, 6)
	if len(resets) != 0 {
		t.Errorf("resets %v, want none", resets)
	}
}
