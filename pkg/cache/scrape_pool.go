package cache

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// scrapePool runs one scrapeLoop per routable pod. Registry changes nudge it;
// it then compares the loops that should run with the ones that do, starts
// what is new, stops what is gone and restarts a loop whose pod moved to
// another address or was replaced. A slow or failing pod only delays its own
// loop.
type scrapePool struct {
	reg      *registry
	client   *http.Client
	interval time.Duration
	timeout  time.Duration
	window   time.Duration
	// prefillWindow is the window of PrefillTokensPerSecond.
	prefillWindow time.Duration
	defaultPort   int
	selection     func() *metricSelection
	metrics       *storeMetrics
	log           klog.Logger

	nudge chan struct{}

	mu    sync.Mutex // guards loops; held by sync and by the targets gauge
	loops map[string]*runningLoop
}

type runningLoop struct {
	url    string
	state  *podState
	cancel context.CancelFunc
	done   chan struct{}
}

// notify asks the pool to sync; it never blocks.
func (p *scrapePool) notify() {
	select {
	case p.nudge <- struct{}{}:
	default:
	}
}

// run syncs on every nudge until ctx is cancelled, then stops every loop and
// returns once they have exited.
func (p *scrapePool) run(ctx context.Context) {
	for {
		p.sync(ctx)
		select {
		case <-ctx.Done():
			p.mu.Lock()
			for key, l := range p.loops {
				p.stop(key, l)
			}
			p.mu.Unlock()
			return
		case <-p.nudge:
		}
	}
}

func (p *scrapePool) sync(ctx context.Context) {
	desired := map[string]*podEntry{}
	for _, e := range p.reg.entries() {
		if e.routable {
			desired[e.key] = e
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for key, l := range p.loops {
		if e := desired[key]; e == nil || e.state != l.state || metricsURL(e, p.defaultPort) != l.url {
			p.stop(key, l)
		}
	}
	for key, e := range desired {
		if p.loops[key] == nil {
			p.start(ctx, e)
		}
	}
}

func (p *scrapePool) start(ctx context.Context, e *podEntry) {
	ctx, cancel := context.WithCancel(ctx)
	l := &scrapeLoop{
		pod:       klog.KObj(e.pod),
		podLabel:  e.key,
		url:       metricsURL(e, p.defaultPort),
		state:     e.state,
		client:    p.client,
		interval:  p.interval,
		timeout:   p.timeout,
		selection: p.selection,
		metrics:   p.metrics,
		log:       p.log,
		proj:      newProjector(p.window, p.prefillWindow),
		parser:    newTextParser(),
	}
	r := &runningLoop{url: l.url, state: e.state, cancel: cancel, done: make(chan struct{})}
	p.loops[e.key] = r
	go func() {
		defer close(r.done)
		l.run(ctx)
	}()
	p.log.V(2).Info("Started scraping pod metrics", "pod", l.pod, "url", l.url)
}

// stop cancels the loop and waits for it. The pod's values stay, marked
// stale; a pod that left the registry takes its failure series with it.
func (p *scrapePool) stop(key string, l *runningLoop) {
	l.cancel()
	<-l.done
	delete(p.loops, key)
	l.state.markStale()
	if p.reg.byKey(key) == nil {
		p.metrics.scrapeFailures.DeleteLabelValues(key)
	}
	p.log.V(2).Info("Stopped scraping pod metrics", "pod", key, "url", l.url)
}

func (p *scrapePool) targets() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.loops)
}

// metricsURL is where the pod serves /metrics: its IP and MetricsPort.
func metricsURL(e *podEntry, defaultPort int) string {
	host := net.JoinHostPort(e.pod.Status.PodIP, strconv.Itoa(MetricsPort(e.pod, defaultPort)))
	return "http://" + host + "/metrics"
}

func newScrapeClient(timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 2,
			IdleConnTimeout:     90 * time.Second,
		},
	}
}
