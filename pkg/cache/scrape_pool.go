package cache

import (
	"context"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/endpoint"
)

// scrapePool runs, per routable pod, a scrapeLoop reading its /metrics
// (when interval is positive) and an adapterLoop reading its /v1/models
// (when adapterInterval is positive). Registry changes nudge it; it then
// compares the pods that should have loops with the ones that do, starts
// what is new, stops what is gone and restarts the loops of a pod that moved
// to another address or was replaced. A slow or failing pod only delays its
// own loops. A pod's failure series go once it has left the registry and
// its loops have stopped, in whichever order the two happen.
type scrapePool struct {
	reg             *registry
	interval        time.Duration
	adapterInterval time.Duration
	maxAdapters     int
	timeout         time.Duration
	// modelsAuthorization is the Authorization header of the reads of
	// /v1/models, "" for none.
	modelsAuthorization string
	window              time.Duration
	// prefillWindow is the window of PrefillTokensPerSecond.
	prefillWindow   time.Duration
	selection       func() *metricSelection
	publishAdapters func(key endpoint.Key, state *podState, adapters []string) ([]string, bool)
	// readmit ends the ejection of a pod whose scrape showed it reachable.
	readmit func(e *podEntry, by string)
	// onScrape is Config.OnScrape.
	onScrape func()
	metrics  *storeMetrics
	log      klog.Logger

	nudge chan struct{}

	mu    sync.Mutex // guards loops and idle; held by sync and by the targets gauge
	loops map[endpoint.Key]*runningLoop
	// idle holds the registered pods whose loops stopped (the pod became
	// unroutable): their series stay until the pod leaves the registry.
	idle map[endpoint.Key]struct{}
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
	desired := map[endpoint.Key]*podEntry{}
	for _, e := range p.reg.entries() {
		if e.ep.Ready() {
			desired[e.ep.Key] = e
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for key, l := range p.loops {
		if e := desired[key]; e == nil || e.state != l.state || metricsURL(e.ep) != l.metricsURL ||
			modelsURL(e.ep) != l.modelsURL {
			p.stop(key, l)
		}
	}
	for key := range p.idle {
		if p.reg.entry(key) == nil {
			delete(p.idle, key)
			p.deleteSeries(key)
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
	ep := e.ep
	r := &runningLoop{metricsURL: metricsURL(ep), modelsURL: modelsURL(ep),
		state: e.state, cancel: cancel, done: make(chan struct{})}
	p.loops[ep.Key] = r
	delete(p.idle, ep.Key)
	var wg sync.WaitGroup
	if p.interval > 0 {
		l := &scrapeLoop{
			podLabel:  ep.ID,
			model:     ep.Model,
			page:      newPageClient(metricsHost(ep), metricsPath, metricsAccept, p.timeout, maxScrapeBytes),
			state:     e.state,
			interval:  p.interval,
			selection: p.selection,
			served:    p.servedBy(e),
			metrics:   p.metrics,
			proj:      newProjector(p.window, p.prefillWindow),
			pages:     newPageMemo(),
			reached:   p.reachedBy(e),
			scraped:   p.onScrape,
			failures:  failureLog{log: p.log, pod: klog.KObj(ep.Pod), url: r.metricsURL, what: "Pod metrics scrape"},
		}
		wg.Go(func() { l.run(ctx) })
	}
	if p.adapterInterval > 0 {
		page := newPageClient(ep.Address, modelsPath, "application/json", p.timeout, maxModelListBytes)
		page.authorization = p.modelsAuthorization
		a := &adapterLoop{
			key:         ep.Key,
			id:          ep.ID,
			model:       ep.Model,
			page:        page,
			state:       e.state,
			interval:    p.adapterInterval,
			maxAdapters: p.maxAdapters,
			publish:     p.publishAdapters,
			counter:     p.metrics.modelListFailures,
			dropped:     p.metrics.adaptersDropped,
			failures:    failureLog{log: p.log, pod: klog.KObj(ep.Pod), url: r.modelsURL, what: "Listing the pod's models"},
		}
		wg.Go(func() { a.run(ctx) })
	}
	go func() {
		wg.Wait()
		close(r.done)
	}()
	p.log.V(2).Info("Started reading pod metrics and models", "pod", klog.KObj(ep.Pod), "metricsURL", r.metricsURL,
		"modelsURL", r.modelsURL)
}

// stop cancels the pod's loops and waits for them. The pod's values and
// adapters stay, its metrics marked stale; a pod that left the registry
// takes its failure series with it, one still registered keeps them until
// it leaves (see idle). p.mu must be held.
func (p *scrapePool) stop(key endpoint.Key, l *runningLoop) {
	l.cancel()
	<-l.done
	delete(p.loops, key)
	l.state.markStale()
	if p.reg.entry(key) == nil {
		p.deleteSeries(key)
	} else {
		p.idle[key] = struct{}{}
	}
	p.log.V(2).Info("Stopped reading pod metrics and models", "pod", key)
}

// deleteSeries drops the per-pod series the loops of the pod of key wrote.
// p.mu must be held with no loop of the pod running, so that none writes
// them again.
func (p *scrapePool) deleteSeries(key endpoint.Key) {
	pod := prometheus.Labels{"pod": key.String()}
	p.metrics.scrapeFailures.DeletePartialMatch(pod)
	p.metrics.modelListFailures.DeletePartialMatch(pod)
	p.metrics.seriesDropped.DeletePartialMatch(pod)
	p.metrics.adaptersDropped.DeletePartialMatch(pod)
}

// reachedBy returns what a successful scrape of e calls: it readmits the pod
// when /metrics is served on the port requests go to, and is nil otherwise,
// since a metrics port that answers says nothing of the serving port.
func (p *scrapePool) reachedBy(e *podEntry) func() {
	if e.ep.MetricsPort != e.ep.Port {
		return nil
	}
	return func() { p.readmit(e, "scrape") }
}

// servedBy returns what the scrapes of e read the pod's models with: those
// of its entry in the registry now, none once it is replaced or gone.
func (p *scrapePool) servedBy(e *podEntry) func() []string {
	return func() []string {
		if cur := p.reg.entry(e.ep.Key); cur != nil && cur.state == e.state {
			return cur.models
		}
		return nil
	}
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
func metricsURL(ep *endpoint.Endpoint) string { return "http://" + metricsHost(ep) + metricsPath }

func metricsHost(ep *endpoint.Endpoint) string {
	return net.JoinHostPort(ep.IP, strconv.Itoa(ep.MetricsPort))
}

// The page the scrapes read, in Prometheus's text format.
const (
	metricsPath   = "/metrics"
	metricsAccept = "text/plain;version=0.0.4"
)
