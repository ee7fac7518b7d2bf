package redisstate

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"k8s.io/klog/v2"
)

// StoredResponseKeyPrefix prefixes the Redis key of the record of an
// OpenAI Responses API response: StoredResponseKeyPrefix+<response id>, a
// string (see EncodeStoredResponse) expiring after
// StoredResponsesConfig.TTL.
const StoredResponseKeyPrefix = "kvgate:stored_response:"

// Defaults of StoredResponsesConfig's zero fields.
const (
	DefaultStoredResponseTTL           = time.Hour
	DefaultStoredResponseLookupTimeout = 50 * time.Millisecond
	// DefaultStoredResponseQueue bounds the records waiting to be
	// written: a record that finds it full is dropped.
	DefaultStoredResponseQueue = 4096
	// DefaultStoredResponseLookups bounds the look-ups waiting for Redis:
	// one that finds the bound reached does not ask.
	DefaultStoredResponseLookups = 64
)

// MaxStoredResponseBytes bounds the encoded record of a response, written
// or read: a longer record is neither written nor taken.
const MaxStoredResponseBytes = 1024

// storedResponseBatch bounds the records one pipeline writes.
const storedResponseBatch = 256

// storedResponseWriteTimeout bounds the writes of one pipeline, and of the
// records written when Run returns.
const storedResponseWriteTimeout = 2 * time.Second

// storedResponseVersion opens every encoded record.
const storedResponseVersion = "1"

// Results of kvgate_cache_stored_response_writes_total.
const (
	storedWritten = "written"
	storedExists  = "exists"
	storedDropped = "dropped"
	storedRefused = "refused"
	storedError   = "error"
)

// Results of kvgate_cache_stored_response_lookups_total.
const (
	lookupHit       = "hit"
	lookupMiss      = "miss"
	lookupInvalid   = "invalid"
	lookupTimeout   = "timeout"
	lookupError     = "error"
	lookupCoalesced = "coalesced"
	lookupBusy      = "busy"
)

// StoredResponse names the engine that made an OpenAI Responses API
// response: its pod's namespace, name, UID and address, and the model the
// request that made it named.
type StoredResponse struct {
	Namespace, Name, UID, Address, Model string
}

// EncodeStoredResponse returns the record of r as stored in Redis: a
// version and r's fields, one a line, the model last. It fails when a
// field but the model holds a line break, the name or address is empty,
// or the record would be longer than MaxStoredResponseBytes.
func EncodeStoredResponse(r StoredResponse) (string, error) {
	if r.Name == "" || r.Address == "" {
		return "", errors.New("stored response record: no pod name or address")
	}
	for _, f := range []string{r.Namespace, r.Name, r.UID, r.Address} {
		if strings.Contains(f, "\n") {
			return "", fmt.Errorf("stored response record: line break in %q", f)
		}
	}
	v := strings.Join([]string{storedResponseVersion, r.Namespace, r.Name, r.UID, r.Address, r.Model}, "\n")
	if len(v) > MaxStoredResponseBytes {
		return "", fmt.Errorf("stored response record of %d bytes: longer than %d", len(v), MaxStoredResponseBytes)
	}
	return v, nil
}

// DecodeStoredResponse returns the record v encodes; ok is false when v is
// longer than MaxStoredResponseBytes, of another version, or malformed.
func DecodeStoredResponse(v string) (r StoredResponse, ok bool) {
	if len(v) > MaxStoredResponseBytes {
		return r, false
	}
	f := strings.SplitN(v, "\n", 6)
	if len(f) != 6 || f[0] != storedResponseVersion || f[2] == "" || f[4] == "" {
		return r, false
	}
	return StoredResponse{Namespace: f[1], Name: f[2], UID: f[3], Address: f[4], Model: f[5]}, true
}

// StoredResponsesConfig configures StoredResponses.
type StoredResponsesConfig struct {
	// TTL is how long a record lives in Redis after it is written
	// (default DefaultStoredResponseTTL); it must be a whole number of
	// seconds.
	TTL time.Duration
	// LookupTimeout bounds one look-up (default
	// DefaultStoredResponseLookupTimeout).
	LookupTimeout time.Duration
	// Queue bounds the records waiting to be written (default
	// DefaultStoredResponseQueue).
	Queue int
	// MaxLookups bounds the look-ups waiting for Redis at once (default
	// DefaultStoredResponseLookups); look-ups of an id another one is
	// asking for wait for its answer, and do not count.
	MaxLookups int
	// Logger receives the component's logs (default klog.Background()).
	Logger klog.Logger
}

// StoredResponses shares through Redis which engine made each OpenAI
// Responses API response a gateway replica relayed, so that another
// replica can send the requests that need the response there. Record
// queues a record and never waits: Run writes the queue in pipelines (SET
// with the TTL, NX: the first record of an id stands, as a replica's own
// record does, since a client may choose a response's id), and a record
// that finds the queue full is dropped and counted. Lookup reads one
// record, waiting at most the look-up timeout: look-ups of one id at once
// share one read, and one that finds MaxLookups reads in flight does not
// ask Redis. Its methods are safe for concurrent use.
type StoredResponses struct {
	client  *redis.Client
	metrics *Metrics
	cfg     StoredResponsesConfig
	log     klog.Logger
	queue   chan storedRecord

	mu sync.Mutex
	// lookups holds the reads in flight, by response id, at most
	// cfg.MaxLookups.
	lookups map[string]*storedLookup
}

// storedLookup is a read of a record in flight, which the look-ups of its
// id made meanwhile wait for.
type storedLookup struct {
	// done is closed once r and ok hold the answer.
	done chan struct{}
	r    StoredResponse
	ok   bool
	// waiters counts the look-ups waiting for the answer, under
	// StoredResponses.mu.
	waiters int
}

// storedRecord is a record waiting to be written.
type storedRecord struct {
	id string
	r  StoredResponse
}

// NewStoredResponses returns the component sharing the records of
// responses through client, which must respect its contexts' deadlines
// (redis.Options.ContextTimeoutEnabled) so that a look-up waits no longer
// than its timeout. It fails when it does not, when the TTL is not a whole
// positive number of seconds, or the timeout, queue or look-up bound is
// negative.
func NewStoredResponses(client *redis.Client, m *Metrics, cfg StoredResponsesConfig) (*StoredResponses, error) {
	cfg.TTL = cmp.Or(cfg.TTL, DefaultStoredResponseTTL)
	cfg.LookupTimeout = cmp.Or(cfg.LookupTimeout, DefaultStoredResponseLookupTimeout)
	cfg.Queue = cmp.Or(cfg.Queue, DefaultStoredResponseQueue)
	cfg.MaxLookups = cmp.Or(cfg.MaxLookups, DefaultStoredResponseLookups)
	if client != nil && !client.Options().ContextTimeoutEnabled {
		return nil, errors.New("stored responses: the Redis client must have ContextTimeoutEnabled, or look-ups wait its read timeout")
	}
	if cfg.TTL < time.Second || cfg.TTL%time.Second != 0 {
		return nil, fmt.Errorf("stored responses: TTL %v is not a whole number of seconds", cfg.TTL)
	}
	if cfg.LookupTimeout < 0 || cfg.Queue < 0 || cfg.MaxLookups < 0 {
		return nil, fmt.Errorf("stored responses: look-up timeout %v, queue %d or look-up bound %d is negative",
			cfg.LookupTimeout, cfg.Queue, cfg.MaxLookups)
	}
	if cfg.Logger.GetSink() == nil {
		cfg.Logger = klog.Background()
	}
	return &StoredResponses{client: client, metrics: m, cfg: cfg, log: cfg.Logger.WithName("stored-responses"),
		queue: make(chan storedRecord, cfg.Queue), lookups: make(map[string]*storedLookup)}, nil
}

// Record queues the record that r made the response id, to be written by
// Run; it never waits. A record that finds the queue full is dropped,
// counted in kvgate_cache_stored_response_writes_total{result="dropped"}.
func (s *StoredResponses) Record(id string, r StoredResponse) {
	select {
	case s.queue <- storedRecord{id: id, r: r}:
	default:
		s.metrics.storedWrites.WithLabelValues(storedDropped).Inc()
	}
}

// Run writes the queued records until ctx ends; it then writes those
// queued, within a bounded time, and returns nil. Failed writes are
// counted and logged when they start and end; their records are not
// retried.
func (s *StoredResponses) Run(ctx context.Context) error {
	batch := make([]storedRecord, 0, storedResponseBatch)
	failing := false
	for {
		select {
		case <-ctx.Done():
			s.flush(batch)
			return nil
		case rec := <-s.queue:
			batch = s.fill(append(batch[:0], rec))
		}
		err := s.write(ctx, batch)
		switch {
		case err != nil && !failing:
			s.log.Error(err, "Writing the engines of stored responses to Redis failed")
		case err == nil && failing:
			s.log.Info("Writing the engines of stored responses to Redis recovered")
		}
		failing = err != nil
	}
}

// fill appends to batch the records queued, up to storedResponseBatch.
func (s *StoredResponses) fill(batch []storedRecord) []storedRecord {
	for len(batch) < storedResponseBatch {
		select {
		case rec := <-s.queue:
			batch = append(batch, rec)
		default:
			return batch
		}
	}
	return batch
}

// flush writes the records queued when Run ends, within
// storedResponseWriteTimeout.
func (s *StoredResponses) flush(batch []storedRecord) {
	ctx, cancel := context.WithTimeout(context.Background(), storedResponseWriteTimeout)
	defer cancel()
	for {
		batch = s.fill(batch[:0])
		if len(batch) == 0 || ctx.Err() != nil {
			return
		}
		if err := s.write(ctx, batch); err != nil {
			s.log.Error(err, "Writing the engines of stored responses to Redis on shutdown failed")
			return
		}
	}
}

// write sets the records of batch in one pipeline.
func (s *StoredResponses) write(ctx context.Context, batch []storedRecord) error {
	ctx, cancel := context.WithTimeout(ctx, storedResponseWriteTimeout)
	defer cancel()
	p := s.client.Pipeline()
	n := 0
	for _, rec := range batch {
		v, err := EncodeStoredResponse(rec.r)
		if err != nil {
			s.metrics.storedWrites.WithLabelValues(storedRefused).Inc()
			continue
		}
		p.SetNX(ctx, StoredResponseKeyPrefix+rec.id, v, s.cfg.TTL)
		n++
	}
	if n == 0 {
		return nil
	}
	cmds, err := p.Exec(ctx)
	failed, exists := 0, 0
	for _, c := range cmds {
		switch set, ok := c.(*redis.BoolCmd); {
		case c.Err() != nil:
			failed++
		case ok && !set.Val():
			exists++
		}
	}
	if len(cmds) == 0 && err != nil {
		failed = n
	}
	s.metrics.storedWrites.WithLabelValues(storedWritten).Add(float64(n - failed - exists))
	s.metrics.storedWrites.WithLabelValues(storedExists).Add(float64(exists))
	if failed > 0 {
		s.metrics.storedWrites.WithLabelValues(storedError).Add(float64(failed))
		s.metrics.redisErrors.WithLabelValues(opStoredWrite).Inc()
		return fmt.Errorf("write %d of %d stored response records: %w", failed, n, err)
	}
	return nil
}

// Lookup returns the record of the response id, waiting at most the
// look-up timeout; ok is false when Redis holds none, holds one longer
// than MaxStoredResponseBytes or malformed (counted as invalid; it reads
// no more than that bound and one byte), or does not answer in time
// (counted as timeout, or error). A look-up of an id another one is
// reading waits for that read's answer instead of asking (counted as
// coalesced); one that finds MaxLookups reads in flight returns at once
// without asking (counted as busy, ok false).
func (s *StoredResponses) Lookup(id string) (r StoredResponse, ok bool) {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.LookupTimeout)
	defer cancel()
	s.mu.Lock()
	if l, found := s.lookups[id]; found {
		l.waiters++
		s.mu.Unlock()
		select {
		case <-l.done:
			s.metrics.storedLookups.WithLabelValues(lookupCoalesced).Inc()
			return l.r, l.ok
		case <-ctx.Done():
			s.metrics.storedLookups.WithLabelValues(lookupTimeout).Inc()
			return r, false
		}
	}
	if len(s.lookups) >= s.cfg.MaxLookups {
		s.mu.Unlock()
		s.metrics.storedLookups.WithLabelValues(lookupBusy).Inc()
		return r, false
	}
	l := &storedLookup{done: make(chan struct{})}
	s.lookups[id] = l
	s.mu.Unlock()
	l.r, l.ok = s.read(ctx, id)
	s.mu.Lock()
	delete(s.lookups, id)
	s.mu.Unlock()
	close(l.done)
	return l.r, l.ok
}

// read reads the record of the response id in Redis, within ctx, and
// counts the result.
func (s *StoredResponses) read(ctx context.Context, id string) (r StoredResponse, ok bool) {
	// GETRANGE reads the first bytes alone, however long the value is; a
	// missing key reads as "", which no record is.
	v, err := s.client.GetRange(ctx, StoredResponseKeyPrefix+id, 0, MaxStoredResponseBytes).Result()
	result := lookupHit
	switch {
	case err != nil && strings.HasPrefix(err.Error(), "WRONGTYPE"):
		result = lookupInvalid
	case err != nil && isTimeout(ctx, err):
		result = lookupTimeout
	case err != nil:
		result = lookupError
	case v == "":
		result = lookupMiss
	default:
		r, ok = DecodeStoredResponse(v)
		if !ok {
			result = lookupInvalid
		}
	}
	if result == lookupTimeout || result == lookupError {
		s.metrics.redisErrors.WithLabelValues(opStoredLookup).Inc()
	}
	s.metrics.storedLookups.WithLabelValues(result).Inc()
	return r, ok
}

// isTimeout reports whether err, of an operation under ctx, came from its
// deadline.
func isTimeout(ctx context.Context, err error) bool {
	var ne net.Error
	return ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}
