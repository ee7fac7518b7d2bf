package testsupport

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

func TestFreePortsAreDistinctAndBindable(t *testing.T) {
	ports := FreePorts(t, 3)
	if len(ports) != 3 || ports[0] == ports[1] || ports[1] == ports[2] || ports[0] == ports[2] {
		t.Fatalf("FreePorts(3) = %v, want 3 distinct ports", ports)
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
			ports := ConsecutivePorts(t, 3, tc.hosts...)
			if len(ports) != 3 || ports[1] != ports[0]+1 || ports[2] != ports[0]+2 {
				t.Fatalf("ConsecutivePorts(3) = %v, want 3 consecutive ports", ports)
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
