package gateway

import (
	"context"
	"fmt"
	"net"
	"sync"
)

// Frontend is a server a Gateway runs beside its HTTP API, on a listener of
// its own: an Envoy external processor serving the gateway's Picker, for
// one.
type Frontend interface {
	// Serve serves on ln, which it closes, until Shutdown; it returns nil
	// once shut down, or the error that stopped it.
	Serve(ln net.Listener) error
	// Shutdown stops accepting work, waits for the work in flight until ctx
	// ends, then cuts what remains; it returns once Serve has returned.
	Shutdown(ctx context.Context)
}

// attached is a Frontend and its listener.
type attached struct {
	name string
	ln   net.Listener
	f    Frontend
}

// Attach makes Serve (or Run) serve f on ln beside the HTTP API, logging
// it under name. f serves from the start, before the pods are known (its
// Picker then refuses every request as not ready), until shutdown: once the
// shutdown delay has passed it is shut down together with the API's
// listener, before the components stop. Call Attach before Serve; the
// gateway closes ln when it does not get to serve it.
func (g *Gateway) Attach(name string, ln net.Listener, f Frontend) {
	g.frontends = append(g.frontends, attached{name: name, ln: ln, f: f})
}

// startFrontends serves the attached frontends, sending the error of one
// that stops serving to errs.
func (g *Gateway) startFrontends(errs chan<- error) {
	for _, a := range g.frontends {
		g.log.Info("Serving a frontend", "frontend", a.name, "address", a.ln.Addr().String())
		go func() {
			if err := a.f.Serve(a.ln); err != nil {
				errs <- fmt.Errorf("gateway: %s on %s: %w", a.name, a.ln.Addr(), err)
			}
		}()
	}
}

// shutdownFrontends shuts the attached frontends down in parallel, each
// within ctx, and returns once all have; shutdownHTTP runs meanwhile.
func (g *Gateway) shutdownFrontends(ctx context.Context, shutdownHTTP func()) {
	var wg sync.WaitGroup
	for _, a := range g.frontends {
		wg.Go(func() { a.f.Shutdown(ctx) })
	}
	shutdownHTTP()
	wg.Wait()
}

// closeFrontendListeners closes the listeners of frontends that never got
// to serve.
func (g *Gateway) closeFrontendListeners() {
	for _, a := range g.frontends {
		_ = a.ln.Close()
	}
}
