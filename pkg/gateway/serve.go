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
	"github.com/kvgate/kvgate/pkg/routing"
)

// newPodSource returns the pod source cfg describes, and the Kubernetes
// client configuration it needs.
func newPodSource(cfg Config) (cache.PodSource, *rest.Config, error) {
	if cfg.PodSource != nil {
		return cfg.PodSource, cfg.RestConfig, nil
	}
	switch cfg.Discovery.Mode {
	case config.DiscoveryStatic:
		return &discovery.StaticSource{Path: cfg.Discovery.StaticFile, Logger: cfg.Logger}, nil, nil
	case config.DiscoveryKubernetes:
		rc, err := kubernetesConfig(cfg.Kubeconfig)
		if err != nil {
			return nil, nil, err
		}
		return &discovery.KubernetesSource{Namespace: cfg.Discovery.Namespace, LabelSelector: cfg.Discovery.LabelSelector,
			Logger: cfg.Logger}, rc, nil
	}
	return nil, nil, fmt.Errorf("unknown discovery mode %q: want %s or %s", cfg.Discovery.Mode,
		config.DiscoveryKubernetes, config.DiscoveryStatic)
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
		g.release()
		return fmt.Errorf("gateway: listen on %s: %w", g.cfg.ListenAddress, err)
	}
	return g.Serve(ctx, ln)
}

// Serve serves the gateway's HTTP API on ln until ctx ends; with an admin
// listen address in the configuration, it also listens there and serves
// /metrics and /debug/* there only, and the probes on both. It answers
// /healthz at once, then starts the Store: with KV event sync, the KV event
// manager (binding its endpoint in bind mode) and the prefix index's sweep,
// and the pod source, whose first delivery of pods makes the gateway ready.
// When ctx ends it fails /readyz on both listeners, goes on serving for
// ShutdownDelay, stops accepting connections, waits up to ShutdownTimeout
// for requests in flight (the API's first, then the admin listener's), then
// stops the Store, the KV event manager, the tokenizer and the Redis client,
// and returns nil.
//
// Serve fails, having released everything, ln included, when it cannot
// listen on the admin address or the Store cannot start: the KV event
// manager cannot start (a bind endpoint in use), the pod source fails
// before delivering pods, or Redis features are misconfigured.
func (g *Gateway) Serve(ctx context.Context, ln net.Listener) error {
	servers, served, err := g.startServers(ln)
	if err != nil {
		_ = ln.Close()
		g.release()
		return err
	}
	g.logRedisFeatures()

	indexCtx, stopIndex := context.WithCancel(context.Background())
	indexDone := make(chan struct{})
	go func() {
		defer close(indexDone)
		if g.index != nil {
			_ = g.index.Run(indexCtx)
		}
	}()
	stopAll := func(store *cache.Store) {
		g.shutdown(servers, store, stopIndex)
		<-indexDone
	}

	store, err := g.startStore(ctx)
	if err != nil {
		stopAll(nil)
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	g.log.Info("Ready", "pods", len(store.ListPods()), "models", len(store.ListModels()))

	select {
	case <-ctx.Done():
		g.log.Info("Shutting down", "timeout", g.cfg.ShutdownTimeout)
		stopAll(store)
		return nil
	case err := <-served:
		stopAll(store)
		return err
	}
}

// startServers serves the API on ln and, with an admin listen address, the
// admin endpoints there. served receives the error of a server that stopped
// serving.
func (g *Gateway) startServers(ln net.Listener) (servers []*http.Server, served <-chan error, err error) {
	listeners := []net.Listener{ln}
	handlers := []http.Handler{g.handler}
	if g.adminHandler != nil {
		admin, err := net.Listen("tcp", g.cfg.AdminListenAddress)
		if err != nil {
			return nil, nil, fmt.Errorf("gateway: listen on the admin address %s: %w", g.cfg.AdminListenAddress, err)
		}
		listeners, handlers = append(listeners, admin), append(handlers, g.adminHandler)
	}
	errs := make(chan error, len(listeners))
	for i, l := range listeners {
		srv := &http.Server{Handler: handlers[i], ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
		servers = append(servers, srv)
		go func() { errs <- fmt.Errorf("gateway: serve on %s: %w", l.Addr(), srv.Serve(l)) }()
	}
	admin := ""
	if len(listeners) > 1 {
		admin = listeners[1].Addr().String()
	}
	g.log.Info("Serving", "address", ln.Addr().String(), "adminAddress", admin, "discovery", g.sourceName(),
		"kvEventSync", g.manager != nil, "remoteTokenizer", g.tokenizer != nil, "tokenizerDir", g.cfg.Tokenizer.LocalDir,
		"redis", g.cfg.Redis.Address != "")
	return servers, errs, nil
}

// startStore starts the Store and the router reading it, and makes the
// gateway ready.
func (g *Gateway) startStore(ctx context.Context) (*cache.Store, error) {
	cc := g.cfg.Cache
	cc.Registerer, cc.Logger = g.registry, g.cfg.Logger
	opts := cache.InitOptions{Config: cc, RedisClient: g.redis, PodSource: g.source}
	if g.manager != nil {
		opts.EnableKVSync, opts.KVEventManager = true, g.manager
	}
	// ctx ending aborts the start; once started, the Store runs until the
	// shutdown has drained the requests in flight and closes it.
	abort, started := make(chan struct{}), make(chan struct{})
	defer close(started)
	go func() {
		select {
		case <-ctx.Done():
			close(abort)
		case <-started:
		}
	}()
	store, err := cache.InitWithOptions(g.restConfig, abort, opts)
	if err != nil {
		return nil, fmt.Errorf("gateway: start: %w", err)
	}
	rc := g.cfg.Routing
	rc.Metrics, rc.Scrapes, rc.Registerer, rc.Logger = store, store, g.registry, g.cfg.Logger
	if g.index != nil {
		rc.Index = g.index
	}
	router, err := routing.New(rc)
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("gateway: %w", err)
	}
	g.backend.Store(&backend{store: store, router: router})
	return store, nil
}

// logRedisFeatures says which Store features run, and why those needing
// Redis do not.
func (g *Gateway) logRedisFeatures() {
	c := g.cfg.Cache
	if g.redis == nil {
		g.log.Info("Running without Redis: request traces, shared request counts and GPU profiles from Redis are off")
		return
	}
	g.log.Info("Using Redis", "address", g.cfg.Redis.Address, "requestTraces", c.EnableRequestTrace,
		"sharedRequestCounts", c.SharedRequestCounts, "gpuProfiles", c.EnableProfileCache)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := g.redis.Ping(ctx).Err(); err != nil {
		g.log.Error(err, "Redis does not answer; the features using it retry in the background", "address", g.cfg.Redis.Address)
	}
}

// release closes the clients New created: the tokenizer, the idle
// connections to pods and Redis. shutdown calls it last; Run and Serve call
// it alone when they fail before serving.
func (g *Gateway) release() {
	if g.tokenizer != nil {
		g.tokenizer.Close()
	}
	g.transport.CloseIdleConnections()
	if g.redis != nil {
		if err := g.redis.Close(); err != nil {
			g.log.Error(err, "Closing the Redis client failed")
		}
	}
}

// errNotReady is the reason the inference endpoints give before the pods
// are known.
var errNotReady = errors.New("the gateway is starting: it does not know the pods yet")
