package redisstate

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/inflight"
)

// Redis keys of the running-request counts shared by gateway replicas.
//
// Each replica keeps its counts in a hash SharedCountsKeyPrefix+<gateway
// id>, field "<namespace>/<pod>" holding its requests running on the pod,
// field "<namespace>/<pod>|<model>" those for one model, field
// "<namespace>/<pod>#pending" their pending load by the GPU profiles and
// field "<namespace>/<pod>#prefill" the seconds of prefill work it predicts
// left in the prefills it sent to the pod. Every
// SharedCountsInterval it replaces the whole hash in one MULTI/EXEC and
// renews its expiry to SharedCountsTTL, so the hash always holds a
// consistent snapshot and disappears soon after its replica dies. Replicas
// list themselves in the sorted set SharedGatewaysKey, scored by the Unix
// milliseconds of their last publication by the Redis server's clock, and
// read each other's hashes: those of at most MaxReplicas-1 others, the
// latest to publish, whose publications are no older than the TTL by the
// server's clock (nor further ahead of it, which only another writer of
// the set could cause). Every time compared is the server's, so that the
// replicas' own clocks may disagree by any amount. Entries more than
// max(10 TTL, 1 min) from the server's clock are removed from the set.
const (
	SharedCountsKeyPrefix = "kvgate:running_requests:"
	SharedGatewaysKey     = "kvgate:gateways"
)

// Defaults of SharedCountsConfig's zero fields.
const (
	DefaultSharedCountsInterval = 200 * time.Millisecond
	DefaultSharedCountsTTL      = 5 * time.Second
	// DefaultSharedMaxReplicas bounds the replicas sharing state, this one
	// included: each read takes the hashes of at most 63 others.
	DefaultSharedMaxReplicas = 64
	// DefaultSharedMaxHashFields bounds the fields of another replica's
	// hash: about 5 per pod (counts, work, prompt blocks) and 1 per model
	// served and pod, 2000 pods of 3 models each.
	DefaultSharedMaxHashFields = 1 << 14
	// DefaultSharedHashBytes is what SharedCountsConfig.MaxHashBytes'
	// default allows beyond the prompt blocks: 16Ki fields of counts as
	// Redis stores them (about 60 bytes each) and output histories.
	DefaultSharedHashBytes = 2 << 20
)

// sharedRedisTimeout bounds one publication or read.
const sharedRedisTimeout = 2 * time.Second

// maxSharedCount and maxSharedWork bound a count (requests on a pod) and a
// work value (pending load, seconds of prefill) of another replica's hash:
// far beyond what one replica can hold, and low enough that the sum of
// every replica's cannot overflow. A larger value is dropped as corrupt,
// counted in kvgate_cache_shared_state_rejects_total{kind="value"}.
const (
	maxSharedCount = 1 << 24
	maxSharedWork  = 1e6
)

// PodLoads lists the load records of the registered pods and the models
// each serves; *cache.Store implements it.
type PodLoads interface {
	PodLoads() []*inflight.PodLoad
	// PodModels returns the models the registered pod whose load record's
	// ID is id serves.
	PodModels(id string) []string
}

// SharedCountsConfig configures SharedCounts.
type SharedCountsConfig struct {
	// GatewayID names this replica among those sharing counts (default:
	// host name and a random suffix).
	GatewayID string
	// Interval is how often the counts are published and read (default
	// 200 ms).
	Interval time.Duration
	// TTL is how long a replica's counts outlive its last publication, so
	// that a crashed replica's requests stop counting (default 5 s); it
	// must exceed Interval.
	TTL time.Duration
	// Logger receives the component's logs (default klog.Background()).
	Logger klog.Logger
	// MaxReplicas is the most replicas whose state is read, this one
	// included (default DefaultSharedMaxReplicas): a read takes the
	// latest to publish and counts the others it leaves out in
	// kvgate_cache_shared_gateways_skipped_total{reason="limit"}.
	MaxReplicas int
	// MaxHashFields and MaxHashBytes bound the hash of another replica a
	// read takes: its fields, and its size as Redis measures it (MEMORY
	// USAGE: its fields and values and their overhead). A larger hash is
	// left out whole, counted in
	// kvgate_cache_shared_gateways_skipped_total{reason="fields"} or
	// {reason="bytes"}. Defaults: DefaultSharedMaxHashFields, and 8 bytes
	// per MaxBlocks plus DefaultSharedHashBytes (2.25 MiB).
	MaxHashFields int
	MaxHashBytes  int

	// Prefixes, when set, also shares the prompt blocks that this
	// replica's attempts hold on each pod, at most MaxBlocks keys (default
	// DefaultSharedMaxBlocks; publications that leave some out are counted
	// in kvgate_cache_shared_blocks_truncated_total), and sets the other
	// replicas' on the pods' load records, for kv-aware's credit of
	// prefixes in flight.
	Prefixes  InFlightBlocks
	MaxBlocks int
	// Predictors, when set, also shares the history of the output
	// predictors, so that each replica predicts from the whole fleet's
	// completed requests.
	Predictors OutputHistograms
	// Now is the component's clock (default time.Now); a virtual clock
	// suits only ShareInProcess, since Redis keeps wall-clock times.
	Now func() time.Time
	// SoleReplica, when set, says why this replica must be the only one
	// (a gateway in bind mode: each engine's stream reaches one replica):
	// when other live replicas share state, the component logs an error
	// with it, once each time they appear.
	SoleReplica string
}

// SharedCounts shares the requests of gateway replicas through Redis: it
// publishes this replica's requests running on each pod, their pending
// load and the prefill work they queued there (from the pods' load
// records), and sets on each record what the other replicas have there
// (inflight.PodLoad.SetRemote, SetRemoteWork), so that
// RealtimeNumRequestsRunning and the routing algorithms count the whole
// fleet's requests and the SLO-aware ones do not admit into capacity
// another replica has taken. Routing never waits for Redis: what it reads
// is at most about two intervals old, and when Redis cannot be read for
// longer than the TTL each replica routes on its own requests alone,
// counted in kvgate_cache_shared_counts_local_only_total.
type SharedCounts struct {
	client  *redis.Client
	pods    PodLoads
	metrics *Metrics
	cfg     SharedCountsConfig
	log     klog.Logger
	key     string
	// others tells whether other live replicas were seen at the last read.
	others bool
}

// remoteCounts sums the other replicas' counts (integer fields) and work
// (float fields) by hash field.
type remoteCounts struct {
	counts map[string]int64
	work   map[string]float64
	// blocks are the prompt block keys per pod, hists the output
	// histories per model (see shared_routing.go).
	blocks map[string][]uint64
	hists  map[string][]int32
}

// Suffixes of the fields of a pod's work in a replica's hash.
const (
	fieldPending = "#pending"
	fieldPrefill = "#prefill"
)

// NewSharedCounts returns the component sharing the counts of pods through
// client, which may be nil for a component used only with ShareInProcess.
// It fails when the TTL does not exceed the interval.
func NewSharedCounts(client *redis.Client, pods PodLoads, m *Metrics, cfg SharedCountsConfig) (*SharedCounts, error) {
	cfg.Interval = cmp.Or(cfg.Interval, DefaultSharedCountsInterval)
	cfg.TTL = cmp.Or(cfg.TTL, DefaultSharedCountsTTL)
	cfg.MaxBlocks = cmp.Or(cfg.MaxBlocks, DefaultSharedMaxBlocks)
	cfg.MaxReplicas = cmp.Or(cfg.MaxReplicas, DefaultSharedMaxReplicas)
	cfg.MaxHashFields = cmp.Or(cfg.MaxHashFields, DefaultSharedMaxHashFields)
	cfg.MaxHashBytes = cmp.Or(cfg.MaxHashBytes, 8*cfg.MaxBlocks+DefaultSharedHashBytes)
	if cfg.MaxBlocks < 0 {
		return nil, fmt.Errorf("shared counts: MaxBlocks %d is negative", cfg.MaxBlocks)
	}
	if cfg.MaxHashFields < 0 || cfg.MaxHashBytes < 0 {
		return nil, fmt.Errorf("shared counts: MaxHashFields %d or MaxHashBytes %d is negative", cfg.MaxHashFields, cfg.MaxHashBytes)
	}
	if cfg.MaxReplicas < 2 {
		return nil, fmt.Errorf("shared counts: MaxReplicas %d leaves no other replica to share with", cfg.MaxReplicas)
	}
	if cfg.Interval < 0 || cfg.TTL <= cfg.Interval {
		return nil, fmt.Errorf("shared counts: TTL %v must exceed the interval %v", cfg.TTL, cfg.Interval)
	}
	if cfg.GatewayID == "" {
		cfg.GatewayID = defaultGatewayID()
	}
	if cfg.Logger.GetSink() == nil {
		cfg.Logger = klog.Background()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &SharedCounts{client: client, pods: pods, metrics: m, cfg: cfg, log: cfg.Logger.WithName("shared-counts"),
		key: SharedCountsKeyPrefix + cfg.GatewayID}, nil
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

// Run publishes and reads every interval until ctx ends; it then withdraws
// this replica's counts, so that the others stop counting them at once,
// and returns nil. Failures are counted each time and logged when they
// start and end. When reads keep failing for longer than the TTL, the
// other replicas' counts are dropped rather than trusted.
func (c *SharedCounts) Run(ctx context.Context) error {
	defer c.withdraw()
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	lastRead := time.Now()
	var failing, remote bool
	for {
		err := c.publish(ctx)
		if err != nil {
			c.metrics.redisErrors.WithLabelValues(opSharedPublish).Inc()
		}
		if readErr := c.read(ctx); readErr == nil {
			lastRead, remote = time.Now(), true
		} else {
			c.metrics.redisErrors.WithLabelValues(opSharedRead).Inc()
			err = errors.Join(err, readErr)
			if time.Since(lastRead) > c.cfg.TTL && remote {
				c.apply(remoteCounts{}, c.cfg.Now())
				remote = false
				c.metrics.localOnly.Inc()
				c.log.Info("Dropped other gateways' running-request counts: Redis unreadable", "gateway", c.cfg.GatewayID, "for", time.Since(lastRead))
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		switch {
		case err != nil && !failing:
			c.log.Error(err, "Sharing running-request counts through Redis failed", "gateway", c.cfg.GatewayID)
		case err == nil && failing:
			c.log.Info("Sharing running-request counts through Redis recovered", "gateway", c.cfg.GatewayID)
		}
		failing = err != nil
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// publish replaces this replica's hash with its current state.
func (c *SharedCounts) publish(ctx context.Context) error {
	now := c.cfg.Now()
	fields := c.state(now)
	ctx, cancel := context.WithTimeout(ctx, sharedRedisTimeout)
	defer cancel()
	prune := max(10*c.cfg.TTL, time.Minute)
	var listed *redis.Cmd
	_, err := c.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, c.key)
		if len(fields) > 0 {
			p.HSet(ctx, c.key, fields)
			p.PExpire(ctx, c.key, c.cfg.TTL)
		}
		// EVAL, not EVALSHA: a script missing from the server's cache
		// would fail inside the transaction, past retrying.
		listed = listSelf.Eval(ctx, p, []string{SharedGatewaysKey}, c.cfg.GatewayID, prune.Milliseconds())
		return nil
	})
	if err != nil {
		return fmt.Errorf("publish %s: %w", c.key, err)
	}
	if replaced, _ := listed.Int64(); replaced != 0 {
		c.log.Error(nil, "Replaced a key that held no sorted set with the list of gateway replicas", "gateway", c.cfg.GatewayID,
			"key", SharedGatewaysKey)
	}
	return nil
}

// serverMillis is a Lua statement setting now to the Redis server's clock
// in Unix milliseconds. A script that writes after reading the clock must
// have its effects replicated rather than itself, which Redis 7 always
// does and earlier versions from 3.2 do when asked.
const serverMillis = `
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function score(x) return string.format('%.0f', x) end
`

// listSelf lists the replica ARGV[1] in the sorted set KEYS[1] at the
// server's clock and removes the entries more than ARGV[2] milliseconds
// from it. A key of another type, which no replica could use, is replaced;
// the script then returns 1, else 0.
var listSelf = redis.NewScript(serverMillis + `
local replaced = 0
local kind = redis.call('TYPE', KEYS[1]).ok
if kind ~= 'zset' and kind ~= 'none' then
	redis.call('DEL', KEYS[1])
	replaced = 1
end
redis.call('ZADD', KEYS[1], score(now), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. score(now - ARGV[2]))
redis.call('ZREMRANGEBYSCORE', KEYS[1], '(' .. score(now + ARGV[2]), '+inf')
return replaced
`)

// listLive returns, of the sorted set KEYS[1], the replicas whose last
// publication lies within ARGV[1] milliseconds of the server's clock, as
// {live, ahead, self, ids}: how many there are, how many lie further ahead,
// 1 when replica ARGV[3] is among the live, and the ids of the latest
// ARGV[2] to publish, the latest first.
var listLive = redis.NewScript(serverMillis + `
local lo, hi = score(now - ARGV[1]), score(now + ARGV[1])
local ids = redis.call('ZREVRANGEBYSCORE', KEYS[1], hi, lo, 'LIMIT', 0, ARGV[2])
local live = redis.call('ZCOUNT', KEYS[1], lo, hi)
local ahead = redis.call('ZCOUNT', KEYS[1], '(' .. hi, '+inf')
local at = redis.call('ZSCORE', KEYS[1], ARGV[3])
local self = 0
if at and tonumber(at) >= tonumber(lo) and tonumber(at) <= tonumber(hi) then self = 1 end
return {live, ahead, self, ids}
`)

// state returns this replica's state at now, the fields of its hash.
func (c *SharedCounts) state(now time.Time) map[string]string {
	fields := map[string]string{}
	for _, p := range c.pods.PodLoads() {
		var total int64
		for model, n := range p.Local() {
			fields[p.ID()+"|"+model] = strconv.FormatInt(n, 10)
			total += n
		}
		if total > 0 {
			fields[p.ID()] = strconv.FormatInt(total, 10)
		}
		pending, prefill := p.LocalWork(now)
		if pending > 0 {
			fields[p.ID()+fieldPending] = strconv.FormatFloat(pending, 'g', 6, 64)
		}
		if prefill > 0 {
			fields[p.ID()+fieldPrefill] = strconv.FormatFloat(prefill.Seconds(), 'g', 6, 64)
		}
	}
	c.publishRouting(fields)
	return fields
}

// read reads the hashes of the other replicas and adopts them.
func (c *SharedCounts) read(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, sharedRedisTimeout)
	defer cancel()
	ids, err := c.listReplicas(ctx)
	if err != nil {
		return err
	}
	hashes, err := c.readHashes(ctx, ids)
	if err != nil {
		return err
	}
	c.adopt(hashes, c.cfg.Now())
	return nil
}

// readHash returns, of the hash KEYS[1], a 0 followed by its fields and
// values; or, leaving them out, 1 and its number of fields when it has more
// than ARGV[1], 2 and its size when MEMORY USAGE exceeds ARGV[2] bytes, 3
// when the key holds no hash. A missing key gives a lone 0. Checked and read
// in one script, the hash cannot grow in between.
var readHash = redis.NewScript(`
local t = redis.call('TYPE', KEYS[1]).ok
if t == 'none' then return {0} end
if t ~= 'hash' then return {3} end
local n = redis.call('HLEN', KEYS[1])
if n > tonumber(ARGV[1]) then return {1, n} end
local size = redis.call('MEMORY', 'USAGE', KEYS[1], 'SAMPLES', '0')
if size > tonumber(ARGV[2]) then return {2, size} end
local h = redis.call('HGETALL', KEYS[1])
table.insert(h, 1, 0)
return h
`)

// readHashes returns the hashes of the replicas ids that fit the bounds,
// counting those left out.
func (c *SharedCounts) readHashes(ctx context.Context, ids []string) ([]map[string]string, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	exec := func() ([]*redis.Cmd, error) {
		pipe := c.client.Pipeline()
		cmds := make([]*redis.Cmd, len(ids))
		for i, id := range ids {
			cmds[i] = readHash.EvalSha(ctx, pipe, []string{SharedCountsKeyPrefix + id}, c.cfg.MaxHashFields, c.cfg.MaxHashBytes)
		}
		_, err := pipe.Exec(ctx)
		return cmds, err
	}
	cmds, err := exec()
	if redis.HasErrorPrefix(err, "NOSCRIPT") {
		if err = readHash.Load(ctx, c.client).Err(); err == nil {
			cmds, err = exec()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("read %d gateways' counts: %w", len(ids), err)
	}
	hashes := make([]map[string]string, 0, len(cmds))
	for i, cmd := range cmds {
		h, skip, err := hashReply(cmd.Val())
		switch {
		case err != nil:
			return nil, fmt.Errorf("read gateway %s's counts: %w", ids[i], err)
		case skip != "":
			c.metrics.gatewaysSkipped.WithLabelValues(skip).Inc()
			c.log.V(2).Info("Left out another gateway's shared state", "gateway", ids[i], "reason", skip, "reply", cmd.Val())
		case len(h) > 0:
			hashes = append(hashes, h)
		}
	}
	return hashes, nil
}

// hashReply decodes a reply of readHash: the hash, or the reason it was left
// out.
func hashReply(v any) (hash map[string]string, skip string, err error) {
	reply, _ := v.([]any)
	if len(reply) == 0 {
		return nil, "", fmt.Errorf("unexpected reply %v", v)
	}
	switch reply[0] {
	case int64(0):
		if len(reply)%2 != 1 {
			return nil, "", fmt.Errorf("hash reply of %d elements", len(reply))
		}
		hash = make(map[string]string, len(reply)/2)
		for i := 1; i < len(reply); i += 2 {
			field, fok := reply[i].(string)
			value, vok := reply[i+1].(string)
			if !fok || !vok {
				return nil, "", errors.New("hash reply holds a field or value that is not a string")
			}
			hash[field] = value
		}
		return hash, "", nil
	case int64(1):
		return nil, skipFields, nil
	case int64(2):
		return nil, skipBytes, nil
	case int64(3):
		return nil, skipNotHash, nil
	}
	return nil, "", fmt.Errorf("unexpected reply %v", v)
}

// listReplicas returns the ids of the other replicas whose hashes a read
// takes: those whose last publication lies within the TTL of the Redis
// server's clock, the latest first, at most MaxReplicas-1. It counts the
// live replicas it leaves out, and those whose publications lie further
// ahead.
func (c *SharedCounts) listReplicas(ctx context.Context) ([]string, error) {
	reply, err := listLive.Run(ctx, c.client, []string{SharedGatewaysKey}, c.cfg.TTL.Milliseconds(), c.cfg.MaxReplicas,
		c.cfg.GatewayID).Slice()
	if err != nil {
		return nil, fmt.Errorf("list gateways in %s: %w", SharedGatewaysKey, err)
	}
	live, ahead, self, ids, err := liveReply(reply)
	if err != nil {
		return nil, fmt.Errorf("list gateways in %s: %w", SharedGatewaysKey, err)
	}
	others := live - self
	ids = slices.DeleteFunc(ids, func(id string) bool { return id == c.cfg.GatewayID })
	ids = ids[:min(len(ids), c.cfg.MaxReplicas-1)]
	c.metrics.gatewaysSkipped.WithLabelValues(skipLimit).Add(float64(max(others-int64(len(ids)), 0)))
	c.metrics.gatewaysSkipped.WithLabelValues(skipClockAhead).Add(float64(ahead))
	c.noteReplicas(int(others) + 1)
	return ids, nil
}

// liveReply decodes a reply of listLive.
func liveReply(reply []any) (live, ahead, self int64, ids []string, err error) {
	if len(reply) != 4 {
		return 0, 0, 0, nil, fmt.Errorf("unexpected reply %v", reply)
	}
	var ok [4]bool
	live, ok[0] = reply[0].(int64)
	ahead, ok[1] = reply[1].(int64)
	self, ok[2] = reply[2].(int64)
	list, ok3 := reply[3].([]any)
	ok[3] = ok3
	for _, v := range list {
		id, isString := v.(string)
		ok[3] = ok[3] && isString
		ids = append(ids, id)
	}
	if ok != [4]bool{true, true, true, true} {
		return 0, 0, 0, nil, fmt.Errorf("unexpected reply %v", reply)
	}
	return live, ahead, self, ids, nil
}

// adopt sums the states of the other replicas, their hashes, and sets the
// sum on the pods and predictors at now. Fields about pods this replica
// has not registered, or models they do not serve, are ignored and
// counted: the registry bounds what the sum keeps, and a pod or model
// registered later counts from the next read on.
func (c *SharedCounts) adopt(hashes []map[string]string, now time.Time) {
	known := c.knownPods()
	var unknownPods, unknownModels, outOfRange int
	sum := remoteCounts{counts: map[string]int64{}, work: map[string]float64{}}
	for _, h := range hashes {
		for field, v := range h {
			switch known.of(field) {
			case ignoreUnknownPod:
				unknownPods++
				continue
			case ignoreUnknownModel:
				unknownModels++
				continue
			}
			if c.readRouting(field, v, &sum) {
				continue
			}
			if strings.HasSuffix(field, fieldPending) || strings.HasSuffix(field, fieldPrefill) {
				x, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
				switch {
				case err != nil || !(x > 0):
				case x > maxSharedWork:
					outOfRange++
				default:
					sum.work[field] += x
				}
				continue
			}
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			switch {
			case err != nil || n <= 0:
			case n > maxSharedCount:
				outOfRange++
			default:
				sum.counts[field] += n
			}
		}
	}
	c.metrics.fieldsIgnored.WithLabelValues(ignoreUnknownPod).Add(float64(unknownPods))
	c.metrics.fieldsIgnored.WithLabelValues(ignoreUnknownModel).Add(float64(unknownModels))
	c.metrics.sharedRejects.WithLabelValues(rejectValue).Add(float64(outOfRange))
	c.apply(sum, now)
}

// knownPods are the pods registered with a replica, by load record ID, and
// the models they serve; models is every model served.
type knownPods struct {
	pods   map[string][]string
	models map[string]bool
}

func (c *SharedCounts) knownPods() knownPods {
	k := knownPods{pods: map[string][]string{}, models: map[string]bool{}}
	for _, p := range c.pods.PodLoads() {
		served := c.pods.PodModels(p.ID())
		k.pods[p.ID()] = served
		for _, m := range served {
			k.models[m] = true
		}
	}
	return k
}

// of returns why field of another replica's hash is to be ignored (see
// ignoreUnknownPod), "" when it is about a known pod and model.
func (k knownPods) of(field string) string {
	if model, ok := strings.CutPrefix(field, fieldOutputPrefix); ok {
		if !k.models[model] {
			return ignoreUnknownModel
		}
		return ""
	}
	pod, model, perModel := strings.Cut(field, "|")
	for _, suffix := range []string{fieldPending, fieldPrefill, fieldBlocks} {
		if p, ok := strings.CutSuffix(field, suffix); ok {
			pod, perModel = p, false
			break
		}
	}
	served, ok := k.pods[pod]
	switch {
	case !ok:
		return ignoreUnknownPod
	case perModel && !slices.Contains(served, model):
		return ignoreUnknownModel
	}
	return ""
}

// ShareInProcess has each of replicas adopt the state of the others as a
// read through Redis would give it at the moment each one's clock
// (SharedCountsConfig.Now) reads: for simulations of several gateway
// replicas in one process, which call it every interval of their virtual
// time. Their Redis clients, which may be nil, are not used.
func ShareInProcess(replicas ...*SharedCounts) {
	states := make([]map[string]string, len(replicas))
	for i, c := range replicas {
		states[i] = c.state(c.cfg.Now())
	}
	others := make([]map[string]string, 0, len(replicas))
	for i, c := range replicas {
		others = append(append(others[:0], states[:i]...), states[i+1:]...)
		c.adopt(others, c.cfg.Now())
	}
}

// noteReplicas records the number of live replicas, this one included, and
// logs an error when other replicas appear beside one that must be the only
// one.
func (c *SharedCounts) noteReplicas(n int) {
	c.metrics.gateways.Set(float64(n))
	others := n > 1
	if others && !c.others && c.cfg.SoleReplica != "" {
		c.log.Error(nil, "Other gateway replicas run beside one that must be the only one", "gateway", c.cfg.GatewayID,
			"replicas", n, "why", c.cfg.SoleReplica)
	}
	c.others = others
}

// apply sets on every registered pod what the other replicas have there;
// their prefill work is taken to drain from now.
func (c *SharedCounts) apply(sum remoteCounts, now time.Time) {
	type podCounts struct {
		total  int64
		models map[string]int64
	}
	byPod := map[string]*podCounts{}
	get := func(id string) *podCounts {
		pc := byPod[id]
		if pc == nil {
			pc = &podCounts{}
			byPod[id] = pc
		}
		return pc
	}
	for field, n := range sum.counts {
		id, model, perModel := strings.Cut(field, "|")
		pc := get(id)
		if !perModel {
			pc.total = n
			continue
		}
		if pc.models == nil {
			pc.models = map[string]int64{}
		}
		pc.models[model] = n
	}
	for _, p := range c.pods.PodLoads() {
		if pc := byPod[p.ID()]; pc != nil {
			p.SetRemote(pc.total, pc.models)
		} else {
			p.SetRemote(0, nil)
		}
		w := inflight.RemoteWork{PendingLoad: sum.work[p.ID()+fieldPending]}
		if s := sum.work[p.ID()+fieldPrefill]; s > 0 {
			w.PrefillDone = now.Add(time.Duration(s * float64(time.Second)))
		}
		p.SetRemoteWork(w)
	}
	c.applyRouting(sum)
}

// withdraw removes this replica's counts so the others stop counting them
// at once.
func (c *SharedCounts) withdraw() {
	ctx, cancel := context.WithTimeout(context.Background(), sharedRedisTimeout)
	defer cancel()
	_, err := c.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, c.key)
		p.ZRem(ctx, SharedGatewaysKey, c.cfg.GatewayID)
		return nil
	})
	if err != nil {
		c.log.Info("Running-request counts not withdrawn; they expire on their own", "gateway", c.cfg.GatewayID, "ttl", c.cfg.TTL, "err", err)
	}
}
