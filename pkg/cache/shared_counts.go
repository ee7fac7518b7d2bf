package cache

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis keys of the running-request counts shared by gateway replicas.
//
// Each replica keeps its counts in a hash SharedCountsKeyPrefix+<gateway
// id>, field "<namespace>/<pod>" holding its requests running on the pod and
// field "<namespace>/<pod>|<model>" those for one model. Every
// SharedCountsInterval it replaces the whole hash in one MULTI/EXEC and
// renews its expiry to SharedCountsTTL, so the hash always holds a
// consistent snapshot and disappears soon after its replica dies. Replicas
// list themselves in the sorted set SharedGatewaysKey (scored by the Unix
// milliseconds of their last publication) and read each other's hashes.
const (
	SharedCountsKeyPrefix = "kvgate:running_requests:"
	SharedGatewaysKey     = "kvgate:gateways"
)

// sharedRedisTimeout bounds one publication or read.
const sharedRedisTimeout = 2 * time.Second

// sharedCounts publishes this replica's running-request counts and reads the
// other replicas'.
type sharedCounts struct {
	s      *Store
	id     string
	key    string
	others atomic.Pointer[remoteCounts]
}

// remoteCounts sums the other replicas' counts by hash field.
type remoteCounts map[string]int64

func newSharedCounts(s *Store, id string) *sharedCounts {
	if id == "" {
		id = defaultGatewayID()
	}
	c := &sharedCounts{s: s, id: id, key: SharedCountsKeyPrefix + id}
	c.others.Store(&remoteCounts{})
	return c
}

func defaultGatewayID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "gateway"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return host + "-" + hex.EncodeToString(b[:])
}

// remote returns the other replicas' running requests on the pod, for model
// when it is not "".
func (c *sharedCounts) remote(podKey, model string) int64 {
	field := podKey
	if model != "" {
		field = podKey + "|" + model
	}
	return (*c.others.Load())[field]
}

// run publishes and reads every interval until ctx is cancelled. Failures
// are counted each time and logged when they start and end. When reads keep
// failing for longer than the TTL, the other replicas' counts are dropped
// rather than trusted.
func (c *sharedCounts) run(ctx context.Context) {
	interval, ttl := c.s.cfg.SharedCountsInterval, c.s.cfg.SharedCountsTTL
	t := time.NewTicker(interval)
	defer t.Stop()
	lastRead := time.Now()
	var failing bool
	for {
		err := c.publish(ctx)
		if err != nil {
			c.s.metrics.redisErrors.WithLabelValues(redisOpSharedPublish).Inc()
		}
		if readErr := c.read(ctx); readErr == nil {
			lastRead = time.Now()
		} else {
			c.s.metrics.redisErrors.WithLabelValues(redisOpSharedRead).Inc()
			err = errors.Join(err, readErr)
			if time.Since(lastRead) > ttl && len(*c.others.Load()) > 0 {
				c.others.Store(&remoteCounts{})
				c.s.log.Info("Dropped other gateways' running-request counts: Redis unreadable", "gateway", c.id, "for", time.Since(lastRead))
			}
		}
		if ctx.Err() != nil {
			return
		}
		switch {
		case err != nil && !failing:
			c.s.log.Error(err, "Sharing running-request counts through Redis failed", "gateway", c.id)
		case err == nil && failing:
			c.s.log.Info("Sharing running-request counts through Redis recovered", "gateway", c.id)
		}
		failing = err != nil
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// publish replaces this replica's hash with its current counts.
func (c *sharedCounts) publish(ctx context.Context) error {
	fields := map[string]any{}
	for _, e := range c.s.reg.entries() {
		var total int64
		for model, n := range e.state.load.perModel() {
			fields[e.ep.ID+"|"+model] = n
			total += n
		}
		if total > 0 {
			fields[e.ep.ID] = total
		}
	}
	ctx, cancel := context.WithTimeout(ctx, sharedRedisTimeout)
	defer cancel()
	now := time.Now()
	prune := max(10*c.s.cfg.SharedCountsTTL, time.Minute)
	_, err := c.s.redis.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, c.key)
		if len(fields) > 0 {
			p.HSet(ctx, c.key, fields)
			p.PExpire(ctx, c.key, c.s.cfg.SharedCountsTTL)
		}
		p.ZAdd(ctx, SharedGatewaysKey, redis.Z{Score: float64(now.UnixMilli()), Member: c.id})
		p.ZRemRangeByScore(ctx, SharedGatewaysKey, "-inf", strconv.FormatInt(now.Add(-prune).UnixMilli(), 10))
		return nil
	})
	if err != nil {
		return fmt.Errorf("publish %s: %w", c.key, err)
	}
	return nil
}

// read sums the hashes of the other replicas.
func (c *sharedCounts) read(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, sharedRedisTimeout)
	defer cancel()
	ids, err := c.s.redis.ZRange(ctx, SharedGatewaysKey, 0, -1).Result()
	if err != nil {
		return fmt.Errorf("list gateways in %s: %w", SharedGatewaysKey, err)
	}
	pipe := c.s.redis.Pipeline()
	var cmds []*redis.MapStringStringCmd
	for _, id := range ids {
		if id != c.id {
			cmds = append(cmds, pipe.HGetAll(ctx, SharedCountsKeyPrefix+id))
		}
	}
	sum := remoteCounts{}
	if len(cmds) > 0 {
		if _, err := pipe.Exec(ctx); err != nil {
			return fmt.Errorf("read %d gateways' counts: %w", len(cmds), err)
		}
	}
	for _, cmd := range cmds {
		for field, v := range cmd.Val() {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err == nil && n > 0 {
				sum[field] += n
			}
		}
	}
	c.others.Store(&sum)
	return nil
}

// withdraw removes this replica's counts so the others stop counting them
// at once.
func (c *sharedCounts) withdraw() {
	ctx, cancel := context.WithTimeout(context.Background(), sharedRedisTimeout)
	defer cancel()
	_, err := c.s.redis.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, c.key)
		p.ZRem(ctx, SharedGatewaysKey, c.id)
		return nil
	})
	if err != nil {
		c.s.log.Info("Running-request counts not withdrawn; they expire on their own", "gateway", c.id, "ttl", c.s.cfg.SharedCountsTTL, "err", err)
	}
}
