package cache

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"
	"k8s.io/client-go/rest"
)

// InitOptions configures InitWithOptions.
type InitOptions struct {
	// Config configures the Store.
	Config Config
	// RedisClient is needed by the Config features that say so; may be
	// nil otherwise.
	RedisClient *redis.Client
	// PodSource feeds the pod registry. Nil leaves the registry to be fed
	// through the Store's PodSink methods.
	PodSource PodSource
	// EnableKVSync starts KVEventManager and tells it about every pod.
	EnableKVSync bool
	// KVEventManager keeps the KV-cache event subscriptions; required when
	// EnableKVSync is set.
	KVEventManager KVEventManager
}

// InitWithOptions returns a running Store wired to its pod source and KV
// event manager: it creates the Store as New does, starts the KV event
// manager (when EnableKVSync is set) and subscribes it to pod changes, then
// runs the pod source and waits until it has delivered the pods that exist.
// config is handed to the pod source. Closing stopCh stops the Store as
// Close does; call Close to wait for it.
//
// InitWithOptions fails, leaving nothing running, when New fails, when
// EnableKVSync is set without a KVEventManager or the manager fails to start,
// when the pod source fails before syncing, or when stopCh closes first.
func InitWithOptions(config *rest.Config, stopCh <-chan struct{}, opts InitOptions) (*Store, error) {
	if opts.EnableKVSync && opts.KVEventManager == nil {
		return nil, errors.New("init cache: EnableKVSync needs a KVEventManager")
	}
	s, err := New(opts.RedisClient, opts.Config)
	if err != nil {
		return nil, fmt.Errorf("init cache: %w", err)
	}
	if stopCh != nil {
		s.goRun(func(ctx context.Context) {
			select {
			case <-stopCh:
				s.cancel()
			case <-ctx.Done():
			}
		})
	}
	if opts.EnableKVSync {
		if err := opts.KVEventManager.Start(); err != nil {
			s.Close()
			return nil, fmt.Errorf("init cache: start KV event manager: %w", err)
		}
		s.kvManager = opts.KVEventManager
		s.AddPodListener(opts.KVEventManager)
	}
	if opts.PodSource != nil {
		if err := s.runPodSource(config, opts.PodSource); err != nil {
			s.Close()
			return nil, fmt.Errorf("init cache: %w", err)
		}
	}
	return s, nil
}

// runPodSource starts source and waits until it has synced.
func (s *Store) runPodSource(config *rest.Config, source PodSource) error {
	synced := make(chan struct{})
	var once sync.Once
	markSynced := func() { once.Do(func() { close(synced) }) }
	failed := make(chan error, 1)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		err := source.Run(s.ctx, config, s, markSynced)
		if err != nil && s.ctx.Err() == nil {
			s.log.Error(err, "Pod source stopped")
		}
		failed <- err
	}()
	select {
	case <-synced:
		return nil
	case err := <-failed:
		select {
		case <-synced: // synced, then stopped: the pods were delivered
			return nil
		default:
		}
		if err == nil {
			err = errors.New("stopped before syncing")
		}
		return fmt.Errorf("pod source: %w", err)
	case <-s.ctx.Done():
		return errors.New("pod source: stopped before syncing")
	}
}
