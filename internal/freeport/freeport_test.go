package freeport

import (
	"net"
	"strconv"
	"testing"
)

// listenAll binds every port on host and closes them when t ends, failing
// t when one cannot be bound.
func listenAll(t *testing.T, host string, ports []int) {
	t.Helper()
	for _, p := range ports {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(p)))
		if err != nil {
			t.Fatalf("port %d on %s is not free: %v", p, host, err)
		}
		t.Cleanup(func() { ln.Close() })
	}
}

func TestDistinctPortsAreDistinctAndBindable(t *testing.T) {
	ports, err := Distinct(3)
	if err != nil {
		t.Fatal(err)
	}
	if len(ports) != 3 || ports[0] == ports[1] || ports[1] == ports[2] || ports[0] == ports[2] {
		t.Fatalf("Distinct(3) = %v, want 3 distinct ports", ports)
	}
	listenAll(t, "127.0.0.1", ports)
}

func TestConsecutivePortsFollowOneAnotherOnEveryHost(t *testing.T) {
	for _, tc := range []struct {
		name  string
		hosts []string
	}{
		{"default host", nil},
		{"two loopback addresses", []string{"127.0.0.1", "127.0.0.2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ports, err := Consecutive(3, tc.hosts...)
			if err != nil {
				t.Fatal(err)
			}
			if len(ports) != 3 || ports[1] != ports[0]+1 || ports[2] != ports[0]+2 {
				t.Fatalf("Consecutive(3) = %v, want 3 consecutive ports", ports)
			}
			hosts := tc.hosts
			if hosts == nil {
				hosts = []string{"127.0.0.1"}
			}
			for _, h := range hosts {
				listenAll(t, h, ports)
			}
		})
	}
}

func TestAddressIsBindable(t *testing.T) {
	addr, err := Address("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("Address = %s, not free: %v", addr, err)
	}
	ln.Close()
}

func TestPortsLieOutsideTheEphemeralRange(t *testing.T) {
	first, last := ephemeral()
	distinct, err := Distinct(20)
	if err != nil {
		t.Fatal(err)
	}
	consecutive, err := Consecutive(20)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range append(distinct, consecutive...) {
		if first <= p && p <= last {
			t.Errorf("port %d is in the kernel's ephemeral range %d-%d", p, first, last)
		}
	}
}

func TestRangeOutsideTheEphemeralRange(t *testing.T) {
	for _, tc := range []struct{ first, last, lo, hi int }{
		{32768, 60999, 10000, 32768}, // Linux's default
		{49152, 65535, 10000, 49152}, // IANA's
		{12000, 60999, 61000, 65536}, // too little room below: above it
		{1024, 65535, 10000, 65536},  // no room either side: any port from 10000
	} {
		if lo, hi := rangeOutside(tc.first, tc.last); lo != tc.lo || hi != tc.hi {
			t.Errorf("rangeOutside(%d, %d) = [%d, %d), want [%d, %d)", tc.first, tc.last, lo, hi, tc.lo, tc.hi)
		}
	}
}

// Servers are often told their ports one after another and start later:
// a port picked twice would have the second fail to bind.
func TestNoPortIsHandedOutTwice(t *testing.T) {
	seen := map[int]bool{}
	for range 1000 {
		ports, err := Consecutive(2)
		if err != nil {
			t.Fatal(err)
		}
		more, err := Distinct(1)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range append(ports, more...) {
			if seen[p] {
				t.Fatalf("port %d handed out twice", p)
			}
			seen[p] = true
		}
	}
}
