package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/discovery"
	"github.com/kvgate/kvgate/pkg/leanhttp"
)

// newPodSource returns the pod source cfg describes, the Kubernetes client
// configuration it needs, and the InferenceObjectives it reads: those
// cfg.Objectives names, else those the inferencepool discovery fills; nil
// in the other modes.
func newPodSource(cfg Config) (cache.PodSource, *rest.Config, ObjectivePriorities, error) {
	src, rc, objectives, err := podSourceOf(cfg)
	if cfg.Objectives != nil {
		return src, rc, cfg.Objectives, err
	}
	return src, rc, objectives, err
}

// podSourceOf is newPodSource without cfg.Objectives.
func podSourceOf(cfg Config) (cache.PodSource, *rest.Config, ObjectivePriorities, error) {
	if cfg.PodSource != nil {
		return cfg.PodSource, cfg.RestConfig, nil, nil
	}
	switch cfg.Discovery.Mode {
	case config.DiscoveryStatic:
		return &discovery.StaticSource{Path: cfg.Discovery.StaticFile, Logger: cfg.Logger}, nil, nil, nil
	case config.DiscoveryKubernetes:
		rc, err := kubernetesConfig(cfg.Kubeconfig)
		if err != nil {
			return nil, nil, nil, err
		}
		return &discovery.KubernetesSource{Namespace: cfg.Discovery.Namespace, LabelSelector: cfg.Discovery.LabelSelector,
			Logger: cfg.Logger}, rc, nil, nil
	case config.DiscoveryInferencePool:
		rc, err := kubernetesConfig(cfg.Kubeconfig)
		if err != nil {
			return nil, nil, nil, err
		}
		objectives := discovery.NewObjectives()
		src := &discovery.InferencePoolSource{Namespace: cfg.Discovery.Namespace, Pools: cfg.Discovery.Pools,
			PubPort: cfg.KVSync.PubPort, ReplayPort: cfg.KVSync.ReplayPort, Objectives: objectives, Logger: cfg.Logger}
		return src, rc, objectives, nil
	}
	return nil, nil, nil, fmt.Errorf("unknown discovery mode %q: want %s, %s or %s", cfg.Discovery.Mode,
		config.DiscoveryKubernetes, config.DiscoveryInferencePool, config.DiscoveryStatic)
}

// kubernetesConfig loads the client configuration from the kubeconfig
// files listed in kubeconfig, or from the pod's service account when it is
// empty.
func kubernetesConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		rc, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("kubernetes discovery outside a cluster needs a kubeconfig: %w", err)
		}
		return rc, nil
	}
	rules := &clientcmd.ClientConfigLoadingRules{Precedence: filepath.SplitList(kubeconfig)}
	rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	return rc, nil
}

// Run listens on cfg.ListenAddress and serves as Serve does.
func (g *Gateway) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", g.cfg.ListenAddress)
	if err != nil {
		g.closeFrontendListeners()
		g.release()
		return fmt.Errorf("gateway: listen on %s: %w", g.cfg.ListenAddress, err)
	}
	return g.Serve(ctx, ln)
}

// Serve serves the gateway's HTTP API on ln until ctx ends; with an admin
// listen address in the configuration, it also listens there and serves
// /metrics and /debug/* there only, and the probes on both. It serves the
// attached frontends (see Attach) on their listeners. It answers
// /healthz at once, then starts the components in order: the prefix index's
// sweep, the request ledger's reaper, the Store, the components keeping
// state in Redis (request traces, GPU profiles, shared request counts and
// stored responses), the KV event manager (binding its endpoint in bind
// mode) subscribed to the Store's pod changes, and the pod source, whose
// first delivery of pods makes the gateway ready. When ctx ends it fails
// /readyz on both listeners, goes on serving for ShutdownDelay, stops
// accepting connections, waits up to ShutdownTimeout for requests in flight
// (the API's first, then the admin listener's), then stops the components
// in the reverse order, releases the tokenizer and the Redis client, and
// returns nil.
//
// Serve fails, having released everything, ln included, when it cannot
// listen on the admin address, the KV event manager cannot start (a bind
// endpoint in use), or the pod source fails before delivering pods. When
// ctx ends before the pods are delivered, Serve stops and returns nil.
func (g *Gateway) Serve(ctx context.Context, ln net.Listener) error {
	servers, served, err := g.startServers(ln)
	if err != nil {
		_ = ln.Close()
		g.closeFrontendListeners()
		g.release()
		return err
	}
	g.logRedisFeatures()

	comps := &components{log: g.log}
	if err := g.start(ctx, comps); err != nil {
		g.shutdown(servers, comps, false)
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	g.backend.Store(&backend{store: g.store, router: g.router})
	g.log.Info("Ready", "pods", len(g.store.ListPods()), "models", len(g.store.ListModels()))

	select {
	case <-ctx.Done():
		g.log.Info("Shutting down", "timeout", g.cfg.ShutdownTimeout)
		g.shutdown(servers, comps, true)
		return nil
	case err := <-served:
		g.shutdown(servers, comps, true)
		return err
	}
}

// start starts the components in comps: the pool of connections to pods,
// the index's sweep, the request ledger's reaper, the Store, the SLO
// queues, the components keeping state in Redis, the KV
// event manager and the pod source, and returns once the source has
// delivered the pods. ctx ending aborts the start; once started, the
// components run until comps stops them.
func (g *Gateway) start(ctx context.Context, comps *components) error {
	if err := comps.start("connections to pods", runner(g.pods.Run)); err != nil {
		return err
	}
	if g.index != nil {
		if err := comps.start("prefix index", runner(g.index.Run)); err != nil {
			return err
		}
	}
	if err := comps.start("request ledger", runner(g.ledger.Run)); err != nil {
		return err
	}
	if err := comps.start("cache store", runner(g.store.Run)); err != nil {
		return err
	}
	if err := comps.start("SLO queues", runner(g.queues.Run)); err != nil {
		return err
	}
	for _, c := range []struct {
		name string
		run  interface{ Run(context.Context) error }
		on   bool
	}{
		{"request traces", g.tracer, g.tracer != nil},
		{"GPU profiles", g.profileLoader, g.profileLoader != nil},
		{"shared request counts", g.shared, g.shared != nil},
		{"shared stored responses", g.stored.shared, g.stored.shared != nil},
	} {
		if !c.on {
			continue
		}
		if err := comps.start(c.name, runner(c.run.Run)); err != nil {
			return err
		}
	}
	if g.follower != nil {
		if err := comps.start("KV event manager", g.startFollower); err != nil {
			return fmt.Errorf("gateway: start: %w", err)
		}
	}
	if err := g.startModelRewrites(ctx, comps); err != nil {
		return fmt.Errorf("gateway: start: %w", err)
	}
	err := comps.start("pod source", func(run context.Context) (<-chan error, error) {
		run, abort := context.WithCancel(run)
		stopAbort := context.AfterFunc(ctx, abort)
		done, err := cache.RunPodSource(run, g.source, g.restConfig, g.store)
		if err == nil && !stopAbort() {
			// ctx ended just as the source synced: it is stopping.
			<-done
			err = errors.New("pod source: stopped before serving")
		}
		if err != nil {
			abort()
			return nil, err
		}
		stopped := make(chan error, 1)
		go func() {
			stopped <- <-done
			abort()
		}()
		return stopped, nil
	})
	if err != nil {
		return fmt.Errorf("gateway: start: %w", err)
	}
	return nil
}

// startFollower starts the KV event manager and subscribes it to the
// Store's pod changes, which first tells it of every registered pod; the
// manager stops when ctx ends.
func (g *Gateway) startFollower(ctx context.Context) (<-chan error, error) {
	if err := g.follower.Start(); err != nil {
		return nil, fmt.Errorf("start KV event manager: %w", err)
	}
	g.store.AddPodListener(g.follower)
	done := make(chan error, 1)
	go func() {
		<-ctx.Done()
		g.follower.Stop()
		done <- nil
	}()
	return done, nil
}

// startServers serves the API on ln and, with an admin listen address, the
// admin endpoints there. served receives the error of a server that stopped
// serving. The API's inference requests are read by a leanhttp.Server,
// which hands every other request to net/http's.
func (g *Gateway) startServers(ln net.Listener) (servers []httpServer, served <-chan error, err error) {
	listeners := []net.Listener{ln}
	handlers := []http.Handler{g.handler}
	if g.adminHandler != nil {
		admin, err := net.Listen("tcp", g.cfg.AdminListenAddress)
		if err != nil {
			return nil, nil, fmt.Errorf("gateway: listen on the admin address %s: %w", g.cfg.AdminListenAddress, err)
		}
		listeners, handlers = append(listeners, admin), append(handlers, g.adminHandler)
	}
	errs := make(chan error, len(listeners)+len(g.frontends))
	for i, l := range listeners {
		srv := &http.Server{Handler: handlers[i], ReadHeaderTimeout: readHeaderTimeout, IdleTimeout: 2 * time.Minute}
		var server httpServer = srv
		if i == 0 {
			// The API's connections tell the handlers when a request's
			// first byte was read; the listener holds at most
			// MaxClientConnections of them open.
			srv.ConnContext = withConn
			l = newTimedListener(l, g.cfg.ClientWriteTimeout, g.cfg.MaxClientConnections, g.metrics)
			if !g.cfg.DisableProxy {
				server = &leanhttp.Server{HTTP: srv, Hot: []string{
					http.MethodPost + " " + PathCompletions, http.MethodPost + " " + PathChatCompletions,
					http.MethodPost + " " + PathMessages, http.MethodPost + " " + PathResponses}}
			}
		}
		servers = append(servers, server)
		go func() { errs <- fmt.Errorf("gateway: serve on %s: %w", l.Addr(), server.Serve(l)) }()
	}
	g.startFrontends(errs)
	admin := ""
	if len(listeners) > 1 {
		admin = listeners[1].Addr().String()
	}
	g.log.Info("Serving", "address", ln.Addr().String(), "adminAddress", admin, "discovery", g.sourceName(),
		"kvEventSync", g.manager != nil, "remoteTokenizer", g.tokenizer != nil, "tokenizerDir", g.cfg.Tokenizer.LocalDir,
		"redis", g.cfg.Redis.Address != "")
	return servers, errs, nil
}

// logRedisFeatures says which features keeping state in Redis run, and why
// they do not.
func (g *Gateway) logRedisFeatures() {
	c := g.cfg.Redis
	if g.redis == nil {
		g.log.Info("Running without Redis: request traces, shared request counts, shared stored responses and GPU profiles " +
			"from Redis are off")
		return
	}
	g.log.Info("Using Redis", "address", c.Address, "requestTraces", c.RequestTraces,
		"sharedRequestCounts", c.SharedCounts, "sharedStoredResponses", c.StoredResponses, "gpuProfiles", c.GPUProfiles)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := g.redis.Ping(ctx).Err(); err != nil {
		g.log.Error(err, "Redis does not answer; the features using it retry in the background", "address", g.cfg.Redis.Address)
	}
}

// httpServer is a server of the gateway's HTTP listeners.
type httpServer interface {
	Serve(net.Listener) error
	Shutdown(context.Context) error
	Close() error
}

// readHeaderTimeout bounds reading a request's headers.
const readHeaderTimeout = 10 * time.Second

// release closes the clients New created: the tokenizer, the idle
// connections to pods and Redis. shutdown calls it last; Run and Serve call
// it alone when they fail before serving.
func (g *Gateway) release() {
	if g.tokenizer != nil {
		g.tokenizer.Close()
	}
	g.pods.close()
	if g.redis != nil {
		if err := g.redis.Close(); err != nil {
			g.log.Error(err, "Closing the Redis client failed")
		}
	}
}

// errNotReady is the reason the inference endpoints give before the pods
// are known.
var errNotReady = errors.New("the gateway is starting: it does not know the pods yet")
