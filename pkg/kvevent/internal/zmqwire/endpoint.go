package zmqwire

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// OffsetEndpointPort returns the endpoint that data-parallel rank rank of a
// vLLM engine uses when rank 0 uses endpoint, exactly as vLLM's
// offset_endpoint_port does for both its PUB and its replay endpoint: rank 0
// keeps endpoint, a tcp endpoint gets rank added to the port after its last
// ':', and an inproc endpoint gets the suffix "_dp<rank>". Any other transport
// with a rank above 0, a tcp endpoint without a numeric port, a negative rank
// or a port pushed beyond 65535 is an error.
func OffsetEndpointPort(endpoint string, rank int) (string, error) {
	switch {
	case rank < 0:
		return "", fmt.Errorf("offset endpoint %q: negative data-parallel rank %d", endpoint, rank)
	case rank == 0:
		return endpoint, nil
	case strings.HasPrefix(endpoint, "inproc://"):
		return endpoint + "_dp" + strconv.Itoa(rank), nil
	case !strings.HasPrefix(endpoint, "tcp://"):
		return "", fmt.Errorf("offset endpoint %q for rank %d: only tcp:// and inproc:// endpoints can be offset", endpoint, rank)
	}
	i := strings.LastIndexByte(endpoint, ':')
	port, err := strconv.Atoi(endpoint[i+1:])
	if err != nil || port < 0 {
		return "", fmt.Errorf("offset endpoint %q for rank %d: no numeric port after the last ':'", endpoint, rank)
	}
	if port+rank > 65535 {
		return "", fmt.Errorf("offset endpoint %q for rank %d: port %d is out of range", endpoint, rank, port+rank)
	}
	return endpoint[:i+1] + strconv.Itoa(port+rank), nil
}

// TCPEndpoint formats a ZeroMQ tcp endpoint, bracketing IPv6 addresses.
func TCPEndpoint(host string, port int) string {
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(port))
}

// PublisherBinds reports whether vLLM's publisher binds its PUB socket to
// endpoint rather than connecting it: it binds when the endpoint contains
// '*' or "::" or uses the ipc or inproc transport.
func PublisherBinds(endpoint string) bool {
	return strings.Contains(endpoint, "*") || strings.Contains(endpoint, "::") ||
		strings.HasPrefix(endpoint, "ipc://") || strings.HasPrefix(endpoint, "inproc://")
}

// NeedsIPv6 reports whether a socket must enable IPv6 to use endpoint: a tcp
// endpoint whose host is a bracketed IPv6 address.
func NeedsIPv6(endpoint string) bool {
	return strings.HasPrefix(endpoint, "tcp://[")
}

// ValidEndpoint reports an error unless endpoint names a ZeroMQ transport the
// client and the publisher can use.
func ValidEndpoint(endpoint string) error {
	for _, prefix := range []string{"tcp://", "ipc://", "inproc://"} {
		if strings.HasPrefix(endpoint, prefix) && len(endpoint) > len(prefix) {
			return nil
		}
	}
	return fmt.Errorf("endpoint %q must start with tcp://, ipc:// or inproc:// and name an address", endpoint)
}
