package testsupport

import (
	"math/rand/v2"
	"net"
	"strconv"
	"testing"
)

// FreePorts returns n distinct TCP ports that were free on 127.0.0.1 when
// it was called: the kernel picks them and FreePorts releases them before
// returning, so another process may take one before the test binds it.
// It fails t when the kernel has no port to give.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, 0, n)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("find a free port on 127.0.0.1: %v", err)
		}
		defer ln.Close()
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// consecutiveAttempts is how many random bases ConsecutivePorts tries.
const consecutiveAttempts = 200

// ConsecutivePorts returns n consecutive TCP ports, p to p+n-1, that were
// all free on every one of hosts (127.0.0.1 when none is given) when it was
// called, for servers whose ports follow from one another, as vLLM's KV
// event PUB and replay ports do. The ports are picked at random between
// 20000 and 60000 and released before it returns. It fails t when no such
// run is found.
func ConsecutivePorts(t testing.TB, n int, hosts ...string) []int {
	t.Helper()
	if len(hosts) == 0 {
		hosts = []string{"127.0.0.1"}
	}
	for range consecutiveAttempts {
		base := 20000 + rand.IntN(40000)
		if portsFree(base, n, hosts) {
			ports := make([]int, n)
			for i := range ports {
				ports[i] = base + i
			}
			return ports
		}
	}
	t.Fatalf("no %d consecutive free ports on %v after %d attempts", n, hosts, consecutiveAttempts)
	return nil
}

// portsFree reports whether ports base to base+n-1 could all be bound on
// every host.
func portsFree(base, n int, hosts []string) bool {
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	for _, host := range hosts {
		for port := base; port < base+n; port++ {
			ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
			if err != nil {
				return false
			}
			lns = append(lns, ln)
		}
	}
	return true
}
