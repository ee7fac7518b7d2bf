package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/discovery"
	"github.com/kvgate/kvgate/pkg/internal/jsonscan"
)

// HeaderModelRewrite is the request header naming the model a request goes
// to (the Gateway API Inference Extension's x-gateway-model-name-rewrite):
// it wins over the model the body names and over the rewrite rules. Its
// value is at most MaxModelRewriteHeaderBytes bytes; a longer one is
// refused with 400. An empty value is no rewrite.
const HeaderModelRewrite = "x-gateway-model-name-rewrite"

// MaxModelRewriteHeaderBytes bounds the value of HeaderModelRewrite, as
// Kubernetes bounds the model names of an InferenceModelRewrite.
const MaxModelRewriteHeaderBytes = discovery.MaxModelNameBytes

// modelRewriteKey is HeaderModelRewrite's canonical name, which the
// request header map is keyed by.
var modelRewriteKey = http.CanonicalHeaderKey(HeaderModelRewrite)

// ModelRewriter rewrites the model a request names before it is routed:
// RewriteModel returns the model a request for model goes to, and whether a
// rule matched. It must be safe for concurrent use and quick: it is called
// on every request. discovery.ModelRewriteSource is one.
type ModelRewriter interface {
	RewriteModel(model string) (target string, ok bool)
}

// Sources of a rewrite, in kvgate_gateway_model_rewrites_total.
const (
	rewriteByHeader = "header"
	rewriteByRule   = "rule"
)

// modelRewrites is the gateway's model rewriting: the rewriter, the source
// it runs when it reads the InferenceModelRewrites itself, and the count
// of the rewrites by source.
type modelRewrites struct {
	rewriter ModelRewriter
	source   *discovery.ModelRewriteSource
	count    *prometheus.CounterVec
}

// newModelRewrites sets up the gateway's model rewriting: the rewriter of
// the configuration, or, with inferencepool discovery, a
// discovery.ModelRewriteSource reading the rewrites of the pools followed.
func (g *Gateway) newModelRewrites() error {
	g.rewrites.count = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvgate_gateway_model_rewrites_total",
		Help: "Requests whose model was rewritten before routing, by source: header (" + HeaderModelRewrite +
			") or rule (an InferenceModelRewrite).",
	}, []string{"source"})
	if err := g.registry.Register(g.rewrites.count); err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	for _, s := range []string{rewriteByHeader, rewriteByRule} {
		g.rewrites.count.WithLabelValues(s)
	}
	g.rewrites.rewriter = g.cfg.ModelRewrites
	if g.rewrites.rewriter == nil && g.cfg.PodSource == nil && g.cfg.Discovery.Mode == config.DiscoveryInferencePool {
		g.rewrites.source = &discovery.ModelRewriteSource{Namespace: g.cfg.Discovery.Namespace, Pools: g.cfg.Discovery.Pools,
			Logger: g.cfg.Logger}
		g.rewrites.rewriter = g.rewrites.source
	}
	return nil
}

// startModelRewrites starts the source of the rewrites, when the gateway
// reads them itself, and waits until it read those that exist (or found it
// cannot read any), for as long as ctx lasts.
func (g *Gateway) startModelRewrites(ctx context.Context, comps *components) error {
	src := g.rewrites.source
	if src == nil {
		return nil
	}
	return comps.start("model rewrites", func(run context.Context) (<-chan error, error) {
		synced, done := make(chan struct{}), make(chan error, 1)
		go func() { done <- src.Run(run, g.restConfig, func() { close(synced) }) }()
		select {
		case <-synced:
			return done, nil
		case err := <-done:
			return nil, fmt.Errorf("model rewrites: %w", err)
		case <-ctx.Done():
			return nil, fmt.Errorf("model rewrites: stopped before serving: %w", context.Cause(ctx))
		}
	})
}

// rewriteModel returns the model a request for model whose
// HeaderModelRewrite value is a.override goes to: the header's, else the
// rewriter's, else model ("" when model is: a request naming no model is
// not rewritten). It counts a rewrite that changes the model, and fails
// with 400 when the header's value passes its bound.
func (g *Gateway) rewriteModel(a *admitted, model string) (string, *Error) {
	o := a.override
	if len(o) > MaxModelRewriteHeaderBytes {
		return "", &Error{Status: http.StatusBadRequest, Type: typeInvalidRequest, Code: codeInvalidField, Param: HeaderModelRewrite,
			Message: fmt.Sprintf("header %s: a model name of %d bytes; at most %d", HeaderModelRewrite, len(o), MaxModelRewriteHeaderBytes)}
	}
	if model == "" {
		// Refused for naming no model: the header renames a model.
		return model, nil
	}
	if o != "" {
		if o != model {
			g.rewrites.count.WithLabelValues(rewriteByHeader).Inc()
		}
		return o, nil
	}
	if g.rewrites.rewriter == nil {
		return model, nil
	}
	if m, ok := g.rewrites.rewriter.RewriteModel(model); ok && m != "" && m != model {
		g.rewrites.count.WithLabelValues(rewriteByRule).Inc()
		return m, nil
	}
	return model, nil
}

// withModel returns a copy of body, a JSON object, whose model members
// name model instead.
func withModel(body []byte, model string) ([]byte, error) {
	name, err := json.Marshal(model)
	if err != nil {
		return nil, err
	}
	var spans [][2]int
	err = jsonscan.Members(body, func(n, value []byte) error {
		if string(jsonscan.Name(n)) == "model" {
			start := cap(body) - cap(value)
			spans = append(spans, [2]int{start, start + len(value)})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	out.Grow(len(body) + len(spans)*len(name))
	last := 0
	for _, s := range spans {
		out.Write(body[last:s[0]])
		out.Write(name)
		last = s[1]
	}
	out.Write(body[last:])
	return out.Bytes(), nil
}

// setModel makes the decoded request name model, as the body forwarded,
// rewritten to model, does: body.
func (in *inference) setModel(model string, body []byte) {
	switch in.kind {
	case kindChat:
		in.chat.Model = model
	case kindMessages, kindResponses:
		in.conv.Model, in.conv.body, in.conv.chat = model, body, nil
	default:
		in.comp.Model = model
	}
}

// renamed returns body rewritten for a request whose model is rewritten
// from model (see rewriteModel), and the model the request goes to; body
// itself when it is not rewritten.
func (g *Gateway) renamed(a *admitted, body []byte, model string) ([]byte, string, *Error) {
	to, err := g.rewriteModel(a, model)
	if err != nil || to == model {
		return body, model, err
	}
	out, jerr := withModel(body, to)
	if jerr != nil {
		return nil, "", &Error{Status: http.StatusBadRequest, Type: typeInvalidRequest, Code: codeInvalidJSON, Message: jsonError(jerr)}
	}
	a.renamed = true
	return out, to, nil
}
