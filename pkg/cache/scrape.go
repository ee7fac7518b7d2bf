package cache

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/klog/v2"
)

// maxScrapeBytes bounds the /metrics body read from one pod.
const maxScrapeBytes = 16 << 20

// scrapeLoop scrapes one pod's /metrics every interval and publishes what it
// derives in the pod's state. Its fields are owned by its goroutine.
type scrapeLoop struct {
	pod       klog.ObjectRef
	podLabel  string
	url       string
	state     *podState
	client    *http.Client
	interval  time.Duration
	timeout   time.Duration
	selection func() *metricSelection
	metrics   *storeMetrics
	log       klog.Logger

	proj     *projector
	parser   expfmt.TextParser
	body     bytes.Buffer
	filtered bytes.Buffer
	failing  bool
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

// run scrapes right away and then on every tick until ctx is cancelled. A
// scrape that takes longer than the interval delays the next one instead of
// overlapping it.
func (l *scrapeLoop) run(ctx context.Context) {
	t := time.NewTicker(l.interval)
	defer t.Stop()
	for {
		l.scrapeOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (l *scrapeLoop) scrapeOnce(ctx context.Context) {
	start := time.Now()
	sel := l.selection()
	families, err := l.fetch(ctx, sel.filter)
	if ctx.Err() != nil {
		return // stopping: the scrape was cut short, not failed
	}
	l.metrics.scrapeDuration.Observe(time.Since(start).Seconds())
	if err != nil {
		l.metrics.scrapeFailures.WithLabelValues(l.podLabel).Inc()
		l.state.markStale()
		if !l.failing {
			l.failing = true
			l.log.Info("Pod metrics scrape failed; keeping its last values as stale", "pod", l.pod, "url", l.url, "err", err)
		} else if v := l.log.V(4); v.Enabled() {
			v.Info("Pod metrics scrape failed again", "pod", l.pod, "err", err)
		}
		return
	}
	if l.failing {
		l.failing = false
		l.log.Info("Pod metrics scrape recovered", "pod", l.pod, "url", l.url)
	}
	l.state.metrics.Store(l.proj.project(start, families, sel.subscribed))
}

// fetch GETs and parses the pod's /metrics within the scrape timeout.
func (l *scrapeLoop) fetch(ctx context.Context, f *lineFilter) (map[string]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, l.url, nil)
	if err != nil {
		return nil, fmt.Errorf("build scrape request for %s: %w", l.url, err)
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := l.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", l.url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
		return nil, fmt.Errorf("scrape %s: HTTP status %s", l.url, resp.Status)
	}
	l.body.Reset()
	n, err := l.body.ReadFrom(io.LimitReader(resp.Body, maxScrapeBytes+1))
	if err != nil {
		return nil, fmt.Errorf("scrape %s: read body: %w", l.url, err)
	}
	if n > maxScrapeBytes {
		return nil, fmt.Errorf("scrape %s: body exceeds %d bytes", l.url, maxScrapeBytes)
	}
	families, err := l.decode(l.body.Bytes(), f)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", l.url, err)
	}
	return families, nil
}

// decode parses the lines of an exposition that f keeps.
func (l *scrapeLoop) decode(body []byte, f *lineFilter) (map[string]*dto.MetricFamily, error) {
	l.filtered.Reset()
	f.filter(&l.filtered, body)
	families, err := l.parser.TextToMetricFamilies(&l.filtered)
	if err != nil {
		return nil, fmt.Errorf("parse exposition: %w", err)
	}
	return families, nil
}

func newTextParser() expfmt.TextParser {
	return expfmt.NewTextParser(model.UTF8Validation)
}
