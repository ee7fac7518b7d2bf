package redisstate

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/cache"
)

// DefaultProfileRefreshInterval is how often ProfileLoader reloads the
// profiles by default.
const DefaultProfileRefreshInterval = 10 * time.Second

// profileScanCount is the COUNT hint of each SCAN for profile keys.
const profileScanCount = 100

// Defaults of ProfileLoaderConfig's bounds: the optimizer writes one
// profile per model and deployment, of a few kilobytes.
const (
	DefaultMaxProfiles     = 256
	DefaultMaxProfileBytes = 256 << 10
)

// profileFetchBatch is how many profiles one round trip reads: with
// DefaultMaxProfileBytes, at most 4 MiB.
const profileFetchBatch = 16

// profileRefreshTimeout bounds one refresh of the profiles from Redis.
const profileRefreshTimeout = 30 * time.Second

// ProfileLoaderConfig configures a ProfileLoader.
type ProfileLoaderConfig struct {
	// RefreshInterval is how often profiles are reloaded (default 10 s).
	RefreshInterval time.Duration
	// MaxProfiles is the most profiles a refresh loads (default
	// DefaultMaxProfiles): first those of the keys Served returns, then
	// those the scan finds first; the keys beyond are skipped, and their
	// profiles forgotten.
	MaxProfiles int
	// Served, when set, returns the keys (see cache.ModelGPUProfileKey)
	// of the profiles the fleet reads: those of the models its pods serve
	// on their deployments. A refresh loads them before any other, so that
	// profiles of models or deployments not served, however many Redis
	// holds, do not take their place under MaxProfiles.
	Served func() []string
	// MaxProfileBytes is the longest value read as a profile (default
	// DefaultMaxProfileBytes): no more is read of a longer one, which is
	// skipped, keeping the version loaded before.
	MaxProfileBytes int
	// Logger receives the loader's logs (default klog.Background()).
	Logger klog.Logger
}

// ProfileLoader keeps cache.Profiles equal to the GPU profiles AIBrix's
// GPU optimizer writes to Redis (the keys of cache.ModelGPUNameTemplate):
// it loads them at start and then every refresh interval, at most
// MaxProfiles of at most MaxProfileBytes each, the served ones (see
// ProfileLoaderConfig.Served) first. A profile that fails to
// decode (see cache.ModelGPUProfile.Unmarshal), or is longer, is skipped and
// counted in kvgate_cache_gpu_profile_rejects_total{reason}, keeping the
// version loaded before; profiles whose keys vanished, or lie beyond
// MaxProfiles, are forgotten once a scan completes; profiles set by hand
// (UpdateModelProfile) are kept unless Redis has a newer one.
type ProfileLoader struct {
	client   *redis.Client
	profiles *cache.Profiles
	metrics  *Metrics
	cfg      ProfileLoaderConfig
	log      klog.Logger
}

// NewProfileLoader returns a loader reading from client into profiles.
func NewProfileLoader(client *redis.Client, profiles *cache.Profiles, m *Metrics, cfg ProfileLoaderConfig) (*ProfileLoader, error) {
	cfg.RefreshInterval = cmp.Or(cfg.RefreshInterval, DefaultProfileRefreshInterval)
	cfg.MaxProfiles = cmp.Or(cfg.MaxProfiles, DefaultMaxProfiles)
	cfg.MaxProfileBytes = cmp.Or(cfg.MaxProfileBytes, DefaultMaxProfileBytes)
	if cfg.RefreshInterval < 0 {
		return nil, fmt.Errorf("GPU profiles: refresh interval %v is negative", cfg.RefreshInterval)
	}
	if cfg.MaxProfiles < 0 || cfg.MaxProfileBytes < 0 {
		return nil, fmt.Errorf("GPU profiles: MaxProfiles %d or MaxProfileBytes %d is negative", cfg.MaxProfiles, cfg.MaxProfileBytes)
	}
	if cfg.Logger.GetSink() == nil {
		cfg.Logger = klog.Background()
	}
	return &ProfileLoader{client: client, profiles: profiles, metrics: m, cfg: cfg, log: cfg.Logger.WithName("gpu-profiles")}, nil
}

// Run loads the profiles from Redis now and then every refresh interval
// until ctx ends; it then returns nil.
func (p *ProfileLoader) Run(ctx context.Context) error {
	t := time.NewTicker(p.cfg.RefreshInterval)
	defer t.Stop()
	for {
		if err := p.refresh(ctx); err != nil && ctx.Err() == nil {
			p.metrics.redisErrors.WithLabelValues(opProfileLoad).Inc()
			p.log.Error(err, "GPU profiles not refreshed from Redis; keeping the ones loaded before")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// refresh reads the keys matching cache.ModelGPUNameTemplate from Redis,
// at most MaxProfiles: the served ones, then the first the scan finds.
func (p *ProfileLoader) refresh(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, profileRefreshTimeout)
	defer cancel()
	prefix, _, _ := strings.Cut(cache.ModelGPUNameTemplate, "%s")
	pattern := prefix + "*"
	seen := map[string]bool{}
	// Profiles are stored once the refresh knows which to forget, so that
	// the Store never holds more than MaxProfiles, not even mid-refresh.
	read := map[string]*cache.ModelGPUProfile{}
	var taken, beyond int
	served := p.served(prefix)
	if len(served) > 0 {
		take := min(len(served), p.cfg.MaxProfiles)
		for batch := range slices.Chunk(served[:take], profileFetchBatch) {
			if err := p.fetch(ctx, batch, seen, read); err != nil {
				return err
			}
		}
		// Served keys Redis holds no profile for take no room; those
		// beyond the bound are met, and counted, by the scan.
		taken = len(seen)
	}
	var cursor uint64
	for {
		keys, next, err := p.client.Scan(ctx, cursor, pattern, profileScanCount).Result()
		if err != nil {
			return fmt.Errorf("scan %s: %w", pattern, err)
		}
		keys = slices.DeleteFunc(keys, func(k string) bool { return seen[k] })
		take := min(len(keys), p.cfg.MaxProfiles-taken)
		taken, beyond = taken+take, beyond+len(keys)-take
		for batch := range slices.Chunk(keys[:take], profileFetchBatch) {
			if err := p.fetch(ctx, batch, seen, read); err != nil {
				return err
			}
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	if beyond > 0 {
		p.metrics.profileRejects.WithLabelValues(profileRejectLimit).Add(float64(beyond))
		p.log.V(2).Info("Skipping GPU profiles beyond the most loaded", "skipped", beyond, "max", p.cfg.MaxProfiles)
	}
	p.profiles.ForgetLoadedExcept(seen)
	for key, prof := range read {
		p.profiles.LoadProfile(key, prof)
	}
	return nil
}

// served returns the keys Served gives that match the profiles' prefix,
// sorted and each once.
func (p *ProfileLoader) served(prefix string) []string {
	if p.cfg.Served == nil {
		return nil
	}
	keys := slices.DeleteFunc(p.cfg.Served(), func(k string) bool { return !strings.HasPrefix(k, prefix) })
	slices.Sort(keys)
	return slices.Compact(keys)
}

// fetch reads the profiles of keys, at most MaxProfileBytes of each, puts
// those that decode in read, and marks in seen the keys that still hold a
// value.
func (p *ProfileLoader) fetch(ctx context.Context, keys []string, seen map[string]bool, read map[string]*cache.ModelGPUProfile) error {
	pipe := p.client.Pipeline()
	cmds := make([]*redis.StringCmd, len(keys))
	for i, key := range keys {
		cmds[i] = pipe.GetRange(ctx, key, 0, int64(p.cfg.MaxProfileBytes))
	}
	var reply redis.Error
	if _, err := pipe.Exec(ctx); err != nil && !errors.As(err, &reply) {
		return fmt.Errorf("read %d GPU profiles: %w", len(keys), err)
	}
	for i, cmd := range cmds {
		key := keys[i]
		data, err := cmd.Result()
		switch {
		case err != nil:
			seen[key] = true
			p.reject(key, profileRejectDecode, err)
		case data == "":
			// Deleted since the scan, or empty: no profile.
		case len(data) > p.cfg.MaxProfileBytes:
			seen[key] = true
			p.reject(key, profileRejectSize, fmt.Errorf("value longer than %d bytes", p.cfg.MaxProfileBytes))
		default:
			seen[key] = true
			if prof, ok := p.decode(key, data); ok {
				read[key] = prof
			}
		}
	}
	return nil
}

// decode decodes one profile read from Redis, counting it rejected when it
// does not decode.
func (p *ProfileLoader) decode(key, data string) (*cache.ModelGPUProfile, bool) {
	var prof cache.ModelGPUProfile
	if err := prof.Unmarshal([]byte(data)); err != nil {
		p.reject(key, profileRejectDecode, err)
		return nil, false
	}
	return &prof, true
}

// reject counts the profile of key skipped for reason.
func (p *ProfileLoader) reject(key, reason string, err error) {
	p.metrics.profileRejects.WithLabelValues(reason).Inc()
	p.log.V(2).Info("Skipping GPU profile", "key", key, "reason", reason, "err", err)
}
