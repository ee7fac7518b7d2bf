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

// scrapePool runs, per routable pod, a scrapeLoop reading its /metrics
// (when interval is positive) and an adapterLoop reading its /v1/models
// (when adapterInterval is positive). Registry changes nudge it; it then
// compares the pods that should have loops with the ones that do, starts
// what is new, stops what is gone and restarts the loops of a pod that moved
// to another address or was replaced. A slow or failing pod only delays its
// own loops.
type scrapePool struct {
	reg             *registry
	client          *http.Client
	interval        time.Duration
	adapterInterval time.Duration
	timeout         time.Duration
	window          time.Duration
	// prefillWindow is the window of PrefillTokensPerSecond.
	prefillWindow   time.Duration
	defaultPort     int
	selection       func() *metricSelection
	publishAdapters func(key string, state *podState, adapters []string) ([]string, bool)
	// readmit ends the ejection of a pod whose scrape showed it reachable.
	readmit func(e *podEntry, by string)
	metrics *storeMetrics
	log     klog.Logger

	nudge chan struct{}

	mu    sync.Mutex // guards loops; held by sync and by the targets gauge
	loops map[string]*runningLoop
}

// runningLoop is the loops of one pod.
type runningLoop struct {
	metricsURL string
	modelsURL  string
	state      *podState
	cancel     context.CancelFunc
	done       chan struct{}
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
		if e := desired[key]; e == nil || e.state != l.state || metricsURL(e, p.defaultPort) != l.metricsURL ||
			modelsURL(e, p.defaultPort) != l.modelsURL {
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
	r := &runningLoop{metricsURL: metricsURL(e, p.defaultPort), modelsURL: modelsURL(e, p.defaultPort),
		state: e.state, cancel: cancel, done: make(chan struct{})}
	p.loops[e.key] = r
	var wg sync.WaitGroup
	if p.interval > 0 {
		l := &scrapeLoop{
			podLabel:  e.key,
			url:       r.metricsURL,
			state:     e.state,
			client:    p.client,
			interval:  p.interval,
			timeout:   p.timeout,
			selection: p.selection,
			metrics:   p.metrics,
			proj:      newProjector(p.window, p.prefillWindow),
			parser:    newTextParser(),
			reached:   p.reachedBy(e),
			failures:  failureLog{log: p.log, pod: klog.KObj(e.pod), url: r.metricsURL, what: "Pod metrics scrape"},
		}
		wg.Go(func() { l.run(ctx) })
	}
	if p.adapterInterval > 0 {
		a := &adapterLoop{
			key:      e.key,
			model:    ModelName(e.pod),
			url:      r.modelsURL,
			state:    e.state,
			client:   p.client,
			interval: p.adapterInterval,
			timeout:  p.timeout,
			publish:  p.publishAdapters,
			counter:  p.metrics.modelListFailures,
			failures: failureLog{log: p.log, pod: klog.KObj(e.pod), url: r.modelsURL, what: "Listing the pod's models"},
		}
		wg.Go(func() { a.run(ctx) })
	}
	go func() {
		wg.Wait()
		close(r.done)
	}()
	p.log.V(2).Info("Started reading pod metrics and models", "pod", klog.KObj(e.pod), "metricsURL", r.metricsURL,
		"modelsURL", r.modelsURL)
}

// stop cancels the pod's loops and waits for them. The pod's values and
// adapters stay, its metrics marked stale; a pod that left the registry
// takes its failure series with it.
func (p *scrapePool) stop(key string, l *runningLoop) {
	l.cancel()
	<-l.done
	delete(p.loops, key)
	l.state.markStale()
	if p.reg.byKey(key) == nil {
		p.metrics.scrapeFailures.DeleteLabelValues(key)
		p.metrics.modelListFailures.DeleteLabelValues(key)
	}
	p.log.V(2).Info("Stopped reading pod metrics and models", "pod", key)
}

// reachedBy returns what a successful scrape of e calls: it readmits the pod
// when /metrics is served on the port requests go to, and is nil otherwise,
// since a metrics port that answers says nothing of the serving port.
func (p *scrapePool) reachedBy(e *podEntry) func() {
	if MetricsPort(e.pod, p.defaultPort) != ServingPort(e.pod, p.defaultPort) {
		return nil
	}
	return func() { p.readmit(e, "scrape") }
}

// targets returns the number of pods whose /metrics are scraped.
func (p *scrapePool) targets() int {
	if p.interval <= 0 {
		return 0
	}
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
