package promreg

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestRegisterRegistersAllOrNone(t *testing.T) {
	reg := prometheus.NewRegistry()
	a := prometheus.NewCounter(prometheus.CounterOpts{Name: "a_total", Help: "a"})
	b := prometheus.NewCounter(prometheus.CounterOpts{Name: "b_total", Help: "b"})
	if err := Register(reg, "first", a); err != nil {
		t.Fatal(err)
	}
	again := prometheus.NewCounter(prometheus.CounterOpts{Name: "a_total", Help: "a"})
	err := Register(reg, "second", b, again)
	if err == nil || !strings.Contains(err.Error(), "register second metrics") {
		t.Fatalf("Register of a name taken = %v, want an error naming the component", err)
	}
	// b was registered, then unregistered when again failed: it can be
	// registered again.
	if err := reg.Register(b); err != nil {
		t.Fatalf("b left registered after the failure: %v", err)
	}
	if err := Register(nil, "none", a); err != nil {
		t.Fatalf("Register on no registry: %v", err)
	}
}
