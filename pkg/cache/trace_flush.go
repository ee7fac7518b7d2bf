package cache

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
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

// runTraceFlusher writes the request traces at every multiple of the trace
// interval (in Unix time) until ctx is cancelled.
func (s *Store) runTraceFlusher(ctx context.Context) {
	for {
		next := s.nextTraceWindowEnd(time.Now())
		t := time.NewTimer(time.Until(next))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		s.flushTraces(ctx, next)
	}
}

// nextTraceWindowEnd returns the first multiple of the trace interval after
// now.
func (s *Store) nextTraceWindowEnd(now time.Time) time.Time {
	step := int64(s.cfg.RequestTraceInterval / time.Second)
	return time.Unix((now.Unix()/step+1)*step, 0)
}

// flushPartialTraces writes the traces of the window in progress when the
// Store closes, under the key of the window's end, where they merge with
// the other replicas' traces of that window.
func (s *Store) flushPartialTraces() {
	s.writeTraces(context.Background(), s.nextTraceWindowEnd(time.Now()), s.tracer.swap())
}

// flushTraces ends the current trace window, which closed at windowEnd, and
// merges every model's trace into Redis. Models without requests in the
// window but with requests in flight get a trace too, so that their pending
// load stays visible.
func (s *Store) flushTraces(ctx context.Context, windowEnd time.Time) {
	delay := time.Since(windowEnd)
	s.metrics.traceFlushDelay.Observe(delay.Seconds())
	if delay > MaxRequestTraceIntervalOffset {
		s.log.Info("Request trace flush started late", "windowEnd", windowEnd, "delay", delay, "maxDelay", MaxRequestTraceIntervalOffset)
	}
	s.writeTraces(ctx, windowEnd, s.tracer.swap())
}

// writeTraces merges the traces of the window ending at windowEnd into
// Redis, adding one for every model with requests in flight.
func (s *Store) writeTraces(ctx context.Context, windowEnd time.Time, window map[string]*RequestTrace) {
	inFlight := s.requests.modelsWithPending()
	for model := range inFlight {
		if window[model] == nil {
			window[model] = NewRequestTrace(s.cfg.RequestTraceInterval)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, traceFlushTimeout)
	defer cancel()
	for model, tr := range window {
		load := inFlight[model]
		key := RequestTraceKey(model, windowEnd.Unix())
		if err := s.writeTrace(ctx, key, tr.ToMap(int(load.pending), int(load.pending-load.routed))); err != nil {
			s.metrics.traceFlushes.WithLabelValues("error").Inc()
			s.metrics.redisErrors.WithLabelValues(redisOpTraceFlush).Inc()
			s.log.Error(err, "Request trace not written", "model", model, "key", key)
			continue
		}
		s.metrics.traceFlushes.WithLabelValues("ok").Inc()
	}
}

func (s *Store) writeTrace(ctx context.Context, key string, trace map[string]int) error {
	value, err := json.Marshal(trace)
	if err != nil {
		return fmt.Errorf("encode request trace %s: %w", key, err)
	}
	ttl := int64(RequestTraceTTL / time.Second)
	if err := mergeTraceScript.Run(ctx, s.redis, []string{key}, value, ttl).Err(); err != nil {
		return fmt.Errorf("write request trace %s: %w", key, err)
	}
	return nil
}
