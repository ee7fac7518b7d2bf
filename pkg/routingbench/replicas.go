package routingbench

import (
	"fmt"

	"github.com/go-logr/logr"

	"github.com/kvgate/kvgate/pkg/inflight"
	"github.com/kvgate/kvgate/pkg/redisstate"
)

// replicated runs a policy as several gateway replicas (Config.Replicas)
// over one fleet: request i arrives at replica i mod n, each replica routes
// with a Router, request ledger and load records of its own, and every
// Config.ShareInterval of virtual time the replicas share their state as
// the gateway's redisstate.SharedCounts shares it through Redis, unless
// Config.Unshared.
type replicated struct {
	replicas []policy
	// shared are the replicas' sharing components, none when unshared.
	shared []*redisstate.SharedCounts
	// owner is the replica of each request routed and not ended.
	owner map[int]int
}

// loadList serves a replica's load records to its sharing component.
type loadList []*inflight.PodLoad

func (l loadList) PodLoads() []*inflight.PodLoad { return l }

// PodModels returns the one model every engine of the fleet serves.
func (l loadList) PodModels(string) []string { return []string{benchModel} }

// sharedTTLIntervals is the replicas' state TTL, in intervals: far beyond any
// staleness, since the simulation loses no publication.
const sharedTTLIntervals = 25

func newReplicated(name string, s *simulation) (*replicated, error) {
	m, err := redisstate.NewMetrics(nil)
	if err != nil {
		return nil, err
	}
	r := &replicated{owner: map[int]int{}}
	for k := range s.cfg.Replicas {
		loads := make(loadList, len(s.engines))
		for i, e := range s.engines {
			loads[i] = inflight.NewPodLoad(e.key)
		}
		replica := ""
		if k > 0 {
			replica = fmt.Sprint("#replica-", k)
		}
		p, rp, err := newGatewayPolicy(name, s, replica, loads)
		if err != nil {
			return nil, err
		}
		r.replicas = append(r.replicas, p)
		if s.cfg.Unshared {
			continue
		}
		sc, err := redisstate.NewSharedCounts(nil, loads, m, redisstate.SharedCountsConfig{
			GatewayID: fmt.Sprint("replica-", k), Interval: s.cfg.ShareInterval, TTL: sharedTTLIntervals * s.cfg.ShareInterval,
			Logger: logr.Discard(), Prefixes: rp.router, Now: s.clock,
		})
		if err != nil {
			return nil, fmt.Errorf("policy %s replica %d: %w", name, k, err)
		}
		r.shared = append(r.shared, sc)
	}
	return r, nil
}

// share has every replica adopt the others' state as of now.
func (r *replicated) share() { redisstate.ShareInProcess(r.shared...) }

func (r *replicated) route(i int, req *Request) (int, error) {
	k := i % len(r.replicas)
	r.owner[i] = k
	return r.replicas[k].route(i, req)
}

func (r *replicated) firstToken(i int) error { return r.replicas[r.owner[i]].firstToken(i) }

func (r *replicated) ended(i int, usage inflight.Usage) error {
	k := r.owner[i]
	delete(r.owner, i)
	return r.replicas[k].ended(i, usage)
}

func (r *replicated) changed() error {
	for _, p := range r.replicas {
		if err := p.changed(); err != nil {
			return err
		}
	}
	return nil
}

func (r *replicated) holding() bool {
	for _, p := range r.replicas {
		if p.holding() {
			return true
		}
	}
	return false
}
