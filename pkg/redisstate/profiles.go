package redisstate

import (
	"cmp"
	"context"
	"fmt"
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

// profileRefreshTimeout bounds one refresh of the profiles from Redis.
const profileRefreshTimeout = 30 * time.Second

// ProfileLoaderConfig configures a ProfileLoader.
type ProfileLoaderConfig struct {
	// RefreshInterval is how often profiles are reloaded (default 10 s).
	RefreshInterval time.Duration
	// Logger receives the loader's logs (default klog.Background()).
	Logger klog.Logger
}

// ProfileLoader keeps cache.Profiles equal to the GPU profiles AIBrix's
// GPU optimizer writes to Redis (the keys of cache.ModelGPUNameTemplate):
// it loads them at start and then every refresh interval. A profile that
// fails to decode is skipped and counted, keeping the version loaded
// before; profiles whose keys vanished are forgotten once a scan completes;
// profiles set by hand (UpdateModelProfile) are kept unless Redis has a
// newer one.
type ProfileLoader struct {
	client   *redis.Client
	profiles *cache.Profiles
	metrics  *Metrics
	interval time.Duration
	log      klog.Logger
}

// NewProfileLoader returns a loader reading from client into profiles.
func NewProfileLoader(client *redis.Client, profiles *cache.Profiles, m *Metrics, cfg ProfileLoaderConfig) (*ProfileLoader, error) {
	cfg.RefreshInterval = cmp.Or(cfg.RefreshInterval, DefaultProfileRefreshInterval)
	if cfg.RefreshInterval < 0 {
		return nil, fmt.Errorf("GPU profiles: refresh interval %v is negative", cfg.RefreshInterval)
	}
	if cfg.Logger.GetSink() == nil {
		cfg.Logger = klog.Background()
	}
	return &ProfileLoader{client: client, profiles: profiles, metrics: m, interval: cfg.RefreshInterval,
		log: cfg.Logger.WithName("gpu-profiles")}, nil
}

// Run loads the profiles from Redis now and then every refresh interval
// until ctx ends; it then returns nil.
func (p *ProfileLoader) Run(ctx context.Context) error {
	t := time.NewTicker(p.interval)
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

// refresh reads every key matching cache.ModelGPUNameTemplate from Redis.
func (p *ProfileLoader) refresh(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, profileRefreshTimeout)
	defer cancel()
	prefix, _, _ := strings.Cut(cache.ModelGPUNameTemplate, "%s")
	pattern := prefix + "*"
	seen := map[string]bool{}
	var cursor uint64
	for {
		keys, next, err := p.client.Scan(ctx, cursor, pattern, profileScanCount).Result()
		if err != nil {
			return fmt.Errorf("scan %s: %w", pattern, err)
		}
		if len(keys) > 0 {
			values, err := p.client.MGet(ctx, keys...).Result()
			if err != nil {
				return fmt.Errorf("read %d GPU profiles: %w", len(keys), err)
			}
			for i, v := range values {
				if str, ok := v.(string); ok {
					seen[keys[i]] = true
					p.load(keys[i], str)
				}
			}
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	p.profiles.ForgetLoadedExcept(seen)
	return nil
}

// load decodes and stores one profile read from Redis.
func (p *ProfileLoader) load(key, data string) {
	var prof cache.ModelGPUProfile
	if err := prof.Unmarshal([]byte(data)); err != nil {
		p.metrics.profileRejects.Inc()
		p.log.V(2).Info("Skipping undecodable GPU profile", "key", key, "err", err)
		return
	}
	p.profiles.LoadProfile(key, &prof)
}
