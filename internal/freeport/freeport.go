// Package freeport picks TCP ports that are free for a server to bind by
// number: the local fleets, benchmarks and tests that start servers in
// other processes, which must be told their ports before they listen.
//
// A port found free is released before it is returned, so it can be taken
// before its server binds it. Ports are therefore picked at random outside
// the kernel's ephemeral range: a port the kernel hands out itself (a
// listener on port 0) would go to the next outgoing connection of any
// process on the machine, and busy machines make such connections all the
// time; below the ephemeral range a port is taken only by a process that
// binds it by number. A process is never handed the same port twice, so
// ports picked one after another for servers that have yet to start do
// not collide.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"sync"
)

const (
	// lowest is the lowest port handed out.
	lowest = 10000
	// enough is how many ports a side of the ephemeral range must hold to
	// be picked from.
	enough = 4096
	// attempts is how many random picks a call makes per port it returns
	// before it gives up.
	attempts = 200
)

// pickRange returns the range [lo, hi) of this machine's ports to pick
// from.
var pickRange = sync.OnceValues(func() (lo, hi int) {
	return rangeOutside(ephemeral())
})

// ephemeral returns the kernel's ephemeral port range, first to last, or
// Linux's default when it cannot be read.
func ephemeral() (first, last int) {
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if _, err := fmt.Sscan(string(b), &first, &last); err == nil && 0 < first && first <= last {
			return first, last
		}
	}
	return 32768, 60999
}

// rangeOutside returns the range [lo, hi) to pick from when the ephemeral
// range is first to last: from lowest up to the ephemeral range, or above
// it when that leaves fewer than enough ports, or any port from lowest
// when neither side has that many.
func rangeOutside(first, last int) (lo, hi int) {
	switch {
	case first-lowest >= enough:
		return lowest, first
	case 65535-max(last, lowest) >= enough:
		return max(last+1, lowest), 65536
	default:
		return lowest, 65536
	}
}

// random returns a port picked at random from the range.
func random() int {
	lo, hi := pickRange()
	return lo + rand.IntN(hi-lo)
}

// handedOut holds every port this process was handed, at most the whole
// range.
var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// claim records ports base to base+n-1 as handed out, unless one of them
// was already.
func claim(base, n int) bool {
	handedOut.Lock()
	defer handedOut.Unlock()
	for p := base; p < base+n; p++ {
		if handedOut.ports[p] {
			return false
		}
	}
	for p := base; p < base+n; p++ {
		handedOut.ports[p] = true
	}
	return true
}

// Distinct returns n distinct ports that were free on 127.0.0.1 when it
// was called.
func Distinct(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for attempt := 0; len(ports) < n; attempt++ {
		if attempt == attempts*n {
			return nil, fmt.Errorf("found %d of %d free ports on 127.0.0.1 in %d attempts", len(ports), n, attempt)
		}
		if p := random(); free(p, 1, []string{"127.0.0.1"}) && claim(p, 1) {
			ports = append(ports, p)
		}
	}
	return ports, nil
}

// Consecutive returns n consecutive ports, p to p+n-1, that were all free
// on every one of hosts (127.0.0.1 when none is given) when it was called,
// for servers whose ports follow from one another, as vLLM's KV event PUB
// and replay ports do.
func Consecutive(n int, hosts ...string) ([]int, error) {
	if len(hosts) == 0 {
		hosts = []string{"127.0.0.1"}
	}
	_, hi := pickRange()
	for range attempts {
		if base := random(); base+n <= hi && free(base, n, hosts) && claim(base, n) {
			ports := make([]int, n)
			for i := range ports {
				ports[i] = base + i
			}
			return ports, nil
		}
	}
	return nil, fmt.Errorf("no %d consecutive free ports on %v in %d attempts", n, hosts, attempts)
}

// Address returns a host:port on host whose port was free when it was
// called.
func Address(host string) (string, error) {
	p, err := Consecutive(1, host)
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(host, strconv.Itoa(p[0])), nil
}

// free reports whether ports base to base+n-1 could all be bound on every
// host.
func free(base, n int, hosts []string) bool {
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
