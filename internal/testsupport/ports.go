package testsupport

import (
	"testing"

	"github.com/kvgate/kvgate/internal/freeport"
)

// FreePorts returns n distinct TCP ports that were free on 127.0.0.1 when
// it was called, picked outside the kernel's ephemeral range (see package
// freeport). It fails t when it finds none.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	ports, err := freeport.Distinct(n)
	if err != nil {
		t.Fatal(err)
	}
	return ports
}

// ConsecutivePorts returns n consecutive TCP ports, p to p+n-1, that were
// all free on every one of hosts (127.0.0.1 when none is given) when it was
// called, for servers whose ports follow from one another, as vLLM's KV
// event PUB and replay ports do. It fails t when it finds none.
func ConsecutivePorts(t testing.TB, n int, hosts ...string) []int {
	t.Helper()
	ports, err := freeport.Consecutive(n, hosts...)
	if err != nil {
		t.Fatal(err)
	}
	return ports
}
