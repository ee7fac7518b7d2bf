package cache

import (
	"bytes"
	"context"
	"fmt"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// maxScrapeBytes bounds the /metrics page read from one pod: a vLLM
// server's page is around 100 KB. A larger page fails the scrape (reason
// too_large), so that a broken or hostile engine costs the parser no more
// than this.
const maxScrapeBytes = 4 << 20

// scrapeLoop scrapes one pod's /metrics every interval and publishes what it
// derives in the pod's state. Its fields are owned by its goroutine.
type scrapeLoop struct {
	podLabel  string
	model     string // the pod's base model, for logs
	page      *pageClient
	state     *podState
	interval  time.Duration
	selection func() *metricSelection
	// served returns the models the pod serves now: series of other
	// model_name values are not broken down.
	served  func() []string
	metrics *storeMetrics
	// reached, when set, is called after every successful scrape: it
	// readmits the pod to routing. scraped, when set, is called after it.
	reached, scraped func()

	proj     *projector
	pages    *pageMemo
	body     bytes.Buffer
	filtered bytes.Buffer
	failures failureLog
	// unservedLogged is set once the loop has logged series of models the
	// pod does not serve.
	unservedLogged bool
}

// metricSelection is what scrapes keep: the subscribed families and the
// line filter that lets them and the built-in ones through. It is replaced,
// never modified, when a subscriber is added.
type metricSelection struct {
	subscribed map[string]struct{}
	filter     *lineFilter
}

func newMetricSelection(subscribed map[string]struct{}) *metricSelection {
	return &metricSelection{subscribed: subscribed, filter: newLineFilter(subscribed)}
}

// run scrapes right away and then on every tick until ctx is cancelled.
func (l *scrapeLoop) run(ctx context.Context) {
	defer l.page.close()
	pollEvery(ctx, l.interval, l.scrapeOnce)
}

func (l *scrapeLoop) scrapeOnce(ctx context.Context) {
	defer l.trim()
	start := time.Now()
	sel := l.selection()
	families, err := l.fetch(ctx, sel.filter)
	if ctx.Err() != nil {
		return // stopping: the scrape was cut short, not failed
	}
	l.metrics.scrapeDuration.Observe(time.Since(start).Seconds())
	if err != nil {
		l.metrics.scrapeFailures.WithLabelValues(l.podLabel, readReason(err)).Inc()
		l.state.markStale()
		l.failures.failed(err, "keeping its last values as stale")
		return
	}
	l.failures.succeeded()
	m, dropped := l.proj.project(start, families, sel.subscribed, l.served())
	l.state.metrics.Store(m)
	if dropped.unserved > 0 {
		l.dropUnserved(dropped)
	}
	if dropped.notRank > 0 {
		l.metrics.seriesDropped.WithLabelValues(l.podLabel, dropInvalidRank).Add(float64(dropped.notRank))
	}
	if l.reached != nil {
		l.reached()
	}
	if l.scraped != nil {
		l.scraped()
	}
}

// dropUnserved counts the series of a scrape labelled with models the pod
// does not serve, and logs the first scrape that had some.
func (l *scrapeLoop) dropUnserved(u droppedSeries) {
	l.metrics.seriesDropped.WithLabelValues(l.podLabel, dropUnservedModel).Add(float64(u.unserved))
	if l.unservedLogged {
		return
	}
	l.unservedLogged = true
	l.failures.log.Info("The pod's /metrics has series of models it does not serve: they count for the pod as a "+
		"whole, not for a model (does the engine's --served-model-name differ from the pod's model?)",
		"pod", l.failures.pod, "model", l.model, "modelName", clipForLog(u.example), "series", u.unserved)
}

// fetch GETs and parses the pod's /metrics within the scrape timeout.
func (l *scrapeLoop) fetch(ctx context.Context, f *lineFilter) (map[string]*dto.MetricFamily, error) {
	if err := l.page.get(ctx, &l.body); err != nil {
		return nil, fmt.Errorf("scrape: %w", err)
	}
	families, err := l.decode(l.body.Bytes(), f)
	if err != nil {
		return nil, &readError{reason: readBadBody, err: fmt.Errorf("scrape %s: %w", l.page.url, err)}
	}
	return families, nil
}

// decode parses the lines of an exposition that f keeps.
func (l *scrapeLoop) decode(body []byte, f *lineFilter) (map[string]*dto.MetricFamily, error) {
	l.filtered.Reset()
	f.filter(&l.filtered, body)
	families, err := l.pages.parse(l.filtered.Bytes())
	if err != nil {
		return nil, fmt.Errorf("parse exposition: %w", err)
	}
	return families, nil
}

// trim releases the memory a large page grew: the buffers, and the page
// memo, whose parsers keep their longest token and the families they parsed
// last.
func (l *scrapeLoop) trim() {
	trimBuffer(&l.body)
	if trimBuffer(&l.filtered) {
		l.pages = newPageMemo()
	}
}

func newTextParser() expfmt.TextParser {
	return expfmt.NewTextParser(model.UTF8Validation)
}
