// Command vllm-sim simulates a vLLM OpenAI-compatible server without GPUs,
// for demos and tests of KV-cache aware routing: a paged KV cache with
// prefix caching, vLLM's scheduler, a latency model, and vLLM's HTTP API
// and Prometheus metrics. Run vllm-sim -help for its flags.
package main

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/kvevent/publisher"
	"github.com/kvgate/kvgate/pkg/sim"
	"github.com/kvgate/kvgate/pkg/sim/simserver"
)

func main() {
	fs := flag.NewFlagSet("vllm-sim", flag.ContinueOnError)
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	fs.Var(klogFlags.Lookup("v").Value, "v", "log verbosity")
	o, err := parseOptions(fs, os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(fs.Output(), "vllm-sim:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", net.JoinHostPort(o.host, strconv.Itoa(o.port)))
	if err == nil {
		err = serve(ctx, o, ln)
	}
	if err != nil {
		klog.ErrorS(err, "vllm-sim failed")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}

// serve runs the simulated server on ln until ctx ends, then stops taking
// requests, lets in-flight ones finish for up to -shutdown-grace, fails those
// still running, and stops the engines.
func serve(ctx context.Context, o options, ln net.Listener) error {
	cfg, err := o.serverConfig(rand.Reader)
	if err != nil {
		return err
	}
	cfg.Logger = klog.Background()
	if o.eventsOn {
		pubs, err := o.publishers()
		if err != nil {
			return err
		}
		defer closePublishers(pubs)
		for i, p := range pubs {
			cfg.Ranks[i].Sink = p
		}
	}
	s, err := simserver.New(cfg)
	if err != nil {
		return err
	}
	engineCtx, stopEngines := context.WithCancel(context.Background())
	enginesDone := make(chan struct{})
	go func() {
		defer close(enginesDone)
		s.Run(engineCtx)
	}()
	defer func() {
		stopEngines()
		<-enginesDone
	}()

	hs := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	klog.InfoS("Serving the simulated vLLM API", "address", ln.Addr().String(), "model", o.model,
		"ranks", o.dpSize, "blockSize", o.engine.BlockSize, "numGPUBlocks", o.engine.NumGPUBlocks)

	select {
	case err := <-served:
		return fmt.Errorf("serve http on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	klog.InfoS("Shutting down", "grace", o.shutdownGrace)
	sctx, cancel := context.WithTimeout(context.Background(), o.shutdownGrace)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		// Requests still running after the grace period are failed by
		// stopping the engines; their handlers then answer at once.
		klog.InfoS("Failing the requests still running", "grace", o.shutdownGrace)
		stopEngines()
		fctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := hs.Shutdown(fctx); err != nil {
			hs.Close()
		}
	}
	return nil
}

// rankPublisher publishes one rank's KV-event batches.
type rankPublisher interface {
	Publish(batch *kvevent.EventBatch) error
	Close() error
}

// publishers starts one KV-event publisher per data-parallel rank, each
// delaying and losing batches as -kv-events-delay, -kv-events-jitter and
// -kv-events-loss say.
func (o *options) publishers() ([]rankPublisher, error) {
	var pubs []rankPublisher
	for rank := range o.dpSize {
		log := klog.Background().WithValues("model", o.model)
		pc := o.events.publisherConfig(rank, o.wire, log)
		var p rankPublisher
		var err error
		if o.delivery == (sim.EventDelivery{}) {
			p, err = publisher.NewPublisher(pc)
		} else {
			p, err = newDelayedPublisher(o.events, rank, o.wire, o.delivery, o.engine.OutputSeed+uint64(rank), log)
		}
		if err != nil {
			closePublishers(pubs)
			return nil, fmt.Errorf("rank %d: %w", rank, err)
		}
		klog.InfoS("Publishing KV events", "rank", rank, "endpoint", pc.Endpoint, "replayEndpoint", pc.ReplayEndpoint,
			"delay", o.delivery.Delay, "jitter", o.delivery.Jitter, "lossRate", o.delivery.LossRate)
		pubs = append(pubs, p)
	}
	return pubs, nil
}

// closePublishers sends what the publishers have queued and closes them.
func closePublishers(pubs []rankPublisher) {
	for rank, p := range pubs {
		if err := p.Close(); err != nil {
			klog.ErrorS(err, "Closing a KV-event publisher failed", "rank", rank)
		}
	}
}
