package cache

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kvgate/kvgate/pkg/endpoint"
)

// profileScanCount is the COUNT hint of each SCAN for profile keys.
const profileScanCount = 100

// profileRefreshTimeout bounds one refresh of the profiles from Redis.
const profileRefreshTimeout = 30 * time.Second

// profileCache holds GPU profiles by key.
type profileCache struct {
	mu       sync.RWMutex
	profiles map[string]*cachedProfile
}

type cachedProfile struct {
	profile   *ModelGPUProfile
	fromRedis bool
}

// UpdateModelProfile stores profile under key (see ModelGPUProfileKey),
// replacing the stored one when force is set or when profile was created
// later. A nil profile deletes the key. Profiles set here are kept until
// replaced or deleted; a refresh from Redis replaces them only with a newer
// profile. The Store keeps profile: do not modify it afterwards.
func (s *Store) UpdateModelProfile(key string, profile *ModelGPUProfile, force bool) {
	s.profiles.update(key, profile, force, false)
}

func (c *profileCache) update(key string, profile *ModelGPUProfile, force, fromRedis bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	old, ok := c.profiles[key]
	switch {
	case profile == nil:
		delete(c.profiles, key)
	case force || !ok || old.profile.Created < profile.Created:
		c.profiles[key] = &cachedProfile{profile: profile, fromRedis: fromRedis}
	}
}

func (c *profileCache) get(key string) (*ModelGPUProfile, error) {
	if p := c.lookup(key); p != nil {
		return p, nil
	}
	return nil, &MissingProfileError{ProfileKey: key}
}

func (c *profileCache) lookup(key string) *ModelGPUProfile {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if p, ok := c.profiles[key]; ok {
		return p.profile
	}
	return nil
}

func (c *profileCache) size() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.profiles)
}

// forgetRedisExcept deletes the profiles loaded from Redis whose keys are
// not in seen: they were deleted from Redis.
func (c *profileCache) forgetRedisExcept(seen map[string]bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for key, p := range c.profiles {
		if p.fromRedis && !seen[key] {
			delete(c.profiles, key)
		}
	}
}

// GetModelProfileByPod returns the profile of modelName on the deployment
// pod belongs to (see endpoint.DeploymentName). It fails with an error wrapping
// ErrMissingProfile when the pod has no deployment name or no profile is
// stored. The profile is shared: treat it as read-only.
func (s *Store) GetModelProfileByPod(pod *v1.Pod, modelName string) (*ModelGPUProfile, error) {
	dep := endpoint.DeploymentName(pod, s.cfg.DeploymentLabel)
	if dep == "" {
		return nil, fmt.Errorf("pod %s/%s has no deployment name (label %q or a ReplicaSet owner): %w",
			pod.Namespace, pod.Name, s.cfg.DeploymentLabel, ErrMissingProfile)
	}
	return s.profiles.get(ModelGPUProfileKey(modelName, dep))
}

// GetModelProfileByDeploymentName returns the profile of modelName on
// deploymentName, or a *MissingProfileError. The profile is shared: treat it
// as read-only.
func (s *Store) GetModelProfileByDeploymentName(deploymentName, modelName string) (*ModelGPUProfile, error) {
	return s.profiles.get(ModelGPUProfileKey(modelName, deploymentName))
}

// runProfileRefresher loads the profiles from Redis now and then every
// profile refresh interval until ctx is cancelled.
func (s *Store) runProfileRefresher(ctx context.Context) {
	t := time.NewTicker(s.cfg.ProfileRefreshInterval)
	defer t.Stop()
	for {
		if err := s.refreshProfiles(ctx); err != nil && ctx.Err() == nil {
			s.metrics.redisErrors.WithLabelValues(redisOpProfileLoad).Inc()
			s.log.Error(err, "GPU profiles not refreshed from Redis; keeping the ones loaded before")
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// refreshProfiles reads every key matching ModelGPUNameTemplate from Redis.
// A profile that fails to decode is skipped and counted, keeping the version
// loaded before; profiles whose keys vanished are forgotten once a scan
// completes.
func (s *Store) refreshProfiles(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, profileRefreshTimeout)
	defer cancel()
	prefix, _, _ := strings.Cut(ModelGPUNameTemplate, "%s")
	pattern := prefix + "*"
	seen := map[string]bool{}
	var cursor uint64
	for {
		keys, next, err := s.redis.Scan(ctx, cursor, pattern, profileScanCount).Result()
		if err != nil {
			return fmt.Errorf("scan %s: %w", pattern, err)
		}
		if len(keys) > 0 {
			values, err := s.redis.MGet(ctx, keys...).Result()
			if err != nil {
				return fmt.Errorf("read %d GPU profiles: %w", len(keys), err)
			}
			for i, v := range values {
				if str, ok := v.(string); ok {
					seen[keys[i]] = true
					s.loadProfile(keys[i], str)
				}
			}
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	s.profiles.forgetRedisExcept(seen)
	return nil
}

// loadProfile decodes and stores one profile read from Redis.
func (s *Store) loadProfile(key, data string) {
	var p ModelGPUProfile
	if err := p.Unmarshal([]byte(data)); err != nil {
		s.metrics.profileLoadRejects.Inc()
		s.log.V(2).Info("Skipping undecodable GPU profile", "key", key, "err", err)
		return
	}
	s.profiles.update(key, &p, false, true)
}
