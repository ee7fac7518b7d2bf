package cache

import (
	"cmp"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"

	"github.com/kvgate/kvgate/pkg/endpoint"
)

// Profiles holds GPU profiles by key (see ModelGPUProfileKey): those set
// with UpdateModelProfile, and those a source such as Redis (see
// redisstate.ProfileLoader) loads with LoadProfile. All its methods are
// safe for concurrent use.
type Profiles struct {
	labels endpoint.Options

	mu       sync.RWMutex
	profiles map[string]*cachedProfile
}

type cachedProfile struct {
	profile *ModelGPUProfile
	// loaded marks a profile from the source, which ForgetLoadedExcept
	// may drop; profiles set by hand stay until replaced.
	loaded bool
}

// NewProfiles returns an empty set of profiles whose pods' deployments are
// named by the labels of o (see endpoint.DeploymentName), and registers its
// kvgate_cache_gpu_profiles gauge on reg (none when nil).
func NewProfiles(o endpoint.Options, reg prometheus.Registerer) (*Profiles, error) {
	p := &Profiles{labels: o, profiles: map[string]*cachedProfile{}}
	if reg != nil {
		g := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "kvgate", Subsystem: "cache", Name: "gpu_profiles",
			Help: "GPU profiles held in memory."}, func() float64 { return float64(p.Len()) })
		if err := reg.Register(g); err != nil {
			return nil, fmt.Errorf("register GPU profile metrics: %w", err)
		}
	}
	return p, nil
}

// UpdateModelProfile stores profile under key (see ModelGPUProfileKey),
// replacing the stored one when force is set or when profile was created
// later. A nil profile deletes the key. Profiles set here are kept until
// replaced or deleted; a load from a source replaces them only with a newer
// profile. The Profiles keep profile: do not modify it afterwards.
func (p *Profiles) UpdateModelProfile(key string, profile *ModelGPUProfile, force bool) {
	p.update(key, profile, force, false)
}

// LoadProfile stores a profile read from a source under key, when it was
// created later than the one stored.
func (p *Profiles) LoadProfile(key string, profile *ModelGPUProfile) {
	p.update(key, profile, false, true)
}

func (p *Profiles) update(key string, profile *ModelGPUProfile, force, loaded bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	old, ok := p.profiles[key]
	switch {
	case profile == nil:
		delete(p.profiles, key)
	case force || !ok || old.profile.Created < profile.Created:
		p.profiles[key] = &cachedProfile{profile: profile, loaded: loaded}
	}
}

// ForgetLoadedExcept drops the profiles loaded from the source whose keys
// are not in seen: the source no longer has them.
func (p *Profiles) ForgetLoadedExcept(seen map[string]bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for key, c := range p.profiles {
		if c.loaded && !seen[key] {
			delete(p.profiles, key)
		}
	}
}

// Len returns the number of profiles held.
func (p *Profiles) Len() int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return len(p.profiles)
}

// Lookup returns the profile of model on deployment, nil when none is
// stored. It costs no error value, for callers on the request path.
func (p *Profiles) Lookup(model, deployment string) *ModelGPUProfile {
	key := ModelGPUProfileKey(model, deployment)
	p.mu.RLock()
	defer p.mu.RUnlock()
	if c, ok := p.profiles[key]; ok {
		return c.profile
	}
	return nil
}

// GetModelProfileByPod returns the profile of modelName on the deployment
// pod belongs to (see endpoint.DeploymentName). It fails with an error
// wrapping ErrMissingProfile when the pod has no deployment name or no
// profile is stored. The profile is shared: treat it as read-only.
func (p *Profiles) GetModelProfileByPod(pod *v1.Pod, modelName string) (*ModelGPUProfile, error) {
	dep := endpoint.DeploymentName(pod, p.labels)
	if dep == "" {
		return nil, fmt.Errorf("pod %s/%s has no deployment name (label %q or %q, or a ReplicaSet or RayCluster owner): %w",
			pod.Namespace, pod.Name, cmp.Or(p.labels.RayClusterFleetLabel, endpoint.DefaultRayClusterFleetLabel),
			cmp.Or(p.labels.DeploymentLabel, endpoint.DefaultDeploymentLabel), ErrMissingProfile)
	}
	return p.GetModelProfileByDeploymentName(dep, modelName)
}

// GetModelProfileByDeploymentName returns the profile of modelName on
// deploymentName, or a *MissingProfileError. The profile is shared: treat it
// as read-only.
func (p *Profiles) GetModelProfileByDeploymentName(deploymentName, modelName string) (*ModelGPUProfile, error) {
	if prof := p.Lookup(modelName, deploymentName); prof != nil {
		return prof, nil
	}
	return nil, &MissingProfileError{ProfileKey: ModelGPUProfileKey(modelName, deploymentName)}
}
