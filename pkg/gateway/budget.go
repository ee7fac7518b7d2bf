package gateway

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// errBodyBudget reports a body that would pass the gateway's bound on the
// request bytes it holds.
var errBodyBudget = errors.New("the gateway holds as many request bytes as it may")

// holdBody takes n bytes of the budget for x's body; x gives them back when
// returned to the pool.
func (g *Gateway) holdBody(x *exchange, n int64) bool {
	if !g.bodies.Take(n) {
		return false
	}
	x.budget, x.held = g.bodies, x.held+n
	return true
}

// heldRefusal counts a request refused because its body would pass the
// bound, and returns the 503 it is answered with.
func (g *Gateway) heldRefusal() *Error {
	g.metrics.heldRefusals.Inc()
	return &Error{Status: http.StatusServiceUnavailable, Type: typeServiceUnavailable, Code: codeOverloaded, RetryAfter: time.Second,
		Message: fmt.Sprintf("the gateway holds as many request bytes as it may (%d): retry later", g.cfg.MaxHeldRequestBytes)}
}

// heldReader takes the budget for a body of unknown length as its bytes
// are read.
type heldReader struct {
	r io.Reader
	g *Gateway
	x *exchange
}

func (h *heldReader) Read(p []byte) (int, error) {
	n, err := h.r.Read(p)
	if n > 0 && !h.g.holdBody(h.x, int64(n)) {
		return n, errBodyBudget
	}
	return n, err
}
