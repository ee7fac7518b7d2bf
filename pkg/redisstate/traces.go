package redisstate

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/inflight"
)

// traceFlushTimeout bounds the Redis writes of one flush.
const traceFlushTimeout = 5 * time.Second

// mergeTraceScript adds a gateway's trace to the one stored under the same
// key by other gateway replicas, so that the stored trace covers the whole
// fleet: bucket counts, meta_total_reqs, meta_pending_reqs and
// meta_queueing_reqs are summed; the other meta keys are the same for every
// replica. A stored value that is not a JSON object is replaced.
var mergeTraceScript = redis.NewScript(`
local mine = cjson.decode(ARGV[1])
local stored = redis.call('GET', KEYS[1])
if stored then
  local ok, other = pcall(cjson.decode, stored)
  if ok and type(other) == 'table' then
    for k, v in pairs(other) do
      if type(v) == 'number' then
        if string.sub(k, 1, 5) ~= 'meta_' or k == 'meta_total_reqs' or k == 'meta_pending_reqs' or k == 'meta_queueing_reqs' then
          mine[k] = (mine[k] or 0) + v
        elseif mine[k] == nil then
          mine[k] = v
        end
      end
    end
  end
end
redis.call('SET', KEYS[1], cjson.encode(mine), 'EX', tonumber(ARGV[2]))
return 1
`)

// ModelCounts reads the requests in flight per model; *inflight.Ledger
// implements it.
type ModelCounts interface {
	Models() map[string]inflight.ModelCounts
	Model(model string) inflight.ModelCounts
}

// TracerConfig configures a Tracer.
type TracerConfig struct {
	// Interval is the trace window, a whole number of seconds
	// (default cache.RequestTraceWriteInterval, 10 s).
	Interval time.Duration
	// Logger receives the tracer's logs (default klog.Background()).
	Logger klog.Logger
}

// Tracer counts each model's requests per window and writes the window's
// trace to Redis (see cache.RequestTrace) at every multiple of the
// interval in Unix time, merged with the other gateway replicas' traces of
// the same window, for autoscalers. It counts a request when it is
// admitted, and its token usage when an attempt of it completes with its
// usage reported (see Observer); the requests in flight and queueing come
// from the request ledger when the window is written. All its methods are
// safe for concurrent use.
type Tracer struct {
	client   *redis.Client
	counts   ModelCounts
	metrics  *Metrics
	interval time.Duration
	log      klog.Logger

	mu     sync.Mutex
	window map[string]*cache.RequestTrace
}

// NewTracer returns a Tracer writing to client, reading the requests in
// flight from counts. It fails when the interval is not a whole number of
// seconds.
func NewTracer(client *redis.Client, counts ModelCounts, m *Metrics, cfg TracerConfig) (*Tracer, error) {
	cfg.Interval = cmp.Or(cfg.Interval, cache.RequestTraceWriteInterval)
	if cfg.Interval < time.Second || cfg.Interval%time.Second != 0 {
		return nil, fmt.Errorf("request trace interval %v is not a whole number of seconds", cfg.Interval)
	}
	if cfg.Logger.GetSink() == nil {
		cfg.Logger = klog.Background()
	}
	return &Tracer{client: client, counts: counts, metrics: m, interval: cfg.Interval,
		log: cfg.Logger.WithName("request-traces"), window: map[string]*cache.RequestTrace{}}, nil
}

// Observer returns the request ledger observer that feeds the traces: an
// admitted request counts in its model's window, and an attempt closed as
// done with its usage reported adds the request's tokens to its bucket.
func (t *Tracer) Observer() inflight.Observer {
	return inflight.Observer{
		Admitted: func(r *inflight.Request) {
			t.mu.Lock()
			defer t.mu.Unlock()
			t.traceLocked(r.Model()).AddRequest()
		},
		Closed: func(h *inflight.Handle) {
			u, ok := h.Usage()
			if o, _ := h.Outcome(); !ok || o != inflight.Done {
				return
			}
			t.mu.Lock()
			defer t.mu.Unlock()
			t.traceLocked(h.Request().Model()).AddRequestTrace(u.PromptTokens, u.CompletionTokens)
		},
	}
}

func (t *Tracer) traceLocked(model string) *cache.RequestTrace {
	tr := t.window[model]
	if tr == nil {
		tr = cache.NewRequestTrace(t.interval)
		t.window[model] = tr
	}
	return tr
}

// swap ends the current window and returns its traces.
func (t *Tracer) swap() map[string]*cache.RequestTrace {
	t.mu.Lock()
	defer t.mu.Unlock()
	w := t.window
	t.window = map[string]*cache.RequestTrace{}
	return w
}

// DumpRequestTrace returns the trace of model for the current window in the
// stored format, nil when the model has no requests in the window.
func (t *Tracer) DumpRequestTrace(model string) map[string]int {
	load := t.counts.Model(model)
	t.mu.Lock()
	defer t.mu.Unlock()
	tr := t.window[model]
	if tr == nil {
		return nil
	}
	return tr.ToMap(int(load.Pending), int(load.Pending-load.Routed))
}

// Run writes the traces at every multiple of the interval (in Unix time)
// until ctx ends; it then writes the traces of the window in progress,
// under the key of the window's end, where they merge with the other
// replicas' traces of that window, and returns nil.
func (t *Tracer) Run(ctx context.Context) error {
	for {
		next := t.nextWindowEnd(time.Now())
		timer := time.NewTimer(time.Until(next))
		select {
		case <-ctx.Done():
			timer.Stop()
			t.write(context.Background(), t.nextWindowEnd(time.Now()), t.swap())
			return nil
		case <-timer.C:
		}
		t.flush(ctx, next)
	}
}

// nextWindowEnd returns the first multiple of the interval after now.
func (t *Tracer) nextWindowEnd(now time.Time) time.Time {
	step := int64(t.interval / time.Second)
	return time.Unix((now.Unix()/step+1)*step, 0)
}

// flush ends the current window, which closed at windowEnd, and merges
// every model's trace into Redis.
func (t *Tracer) flush(ctx context.Context, windowEnd time.Time) {
	delay := time.Since(windowEnd)
	t.metrics.traceFlushDelay.Observe(delay.Seconds())
	if delay > cache.MaxRequestTraceIntervalOffset {
		t.log.Info("Request trace flush started late", "windowEnd", windowEnd, "delay", delay, "maxDelay", cache.MaxRequestTraceIntervalOffset)
	}
	t.write(ctx, windowEnd, t.swap())
}

// write merges the traces of the window ending at windowEnd into Redis.
// Models without requests in the window but with requests in flight get a
// trace too, so that their pending load stays visible.
func (t *Tracer) write(ctx context.Context, windowEnd time.Time, window map[string]*cache.RequestTrace) {
	inFlight := t.counts.Models()
	for model := range inFlight {
		if window[model] == nil {
			window[model] = cache.NewRequestTrace(t.interval)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, traceFlushTimeout)
	defer cancel()
	for model, tr := range window {
		load := inFlight[model]
		key := cache.RequestTraceKey(model, windowEnd.Unix())
		if err := t.writeTrace(ctx, key, tr.ToMap(int(load.Pending), int(load.Pending-load.Routed))); err != nil {
			t.metrics.traceFlushes.WithLabelValues("error").Inc()
			t.metrics.redisErrors.WithLabelValues(opTraceFlush).Inc()
			t.log.Error(err, "Request trace not written", "model", model, "key", key)
			continue
		}
		t.metrics.traceFlushes.WithLabelValues("ok").Inc()
	}
}

func (t *Tracer) writeTrace(ctx context.Context, key string, trace map[string]int) error {
	value, err := json.Marshal(trace)
	if err != nil {
		return fmt.Errorf("encode request trace %s: %w", key, err)
	}
	ttl := int64(cache.RequestTraceTTL / time.Second)
	if err := mergeTraceScript.Run(ctx, t.client, []string{key}, value, ttl).Err(); err != nil {
		return fmt.Errorf("write request trace %s: %w", key, err)
	}
	return nil
}
