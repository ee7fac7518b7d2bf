package indexer

import (
	"cmp"
	"fmt"
	"time"

	"k8s.io/klog/v2"
)

// Defaults applied by NewSyncPrefixHashTable to the zero fields of a Config.
const (
	// DefaultMaxContexts matches AIBrix's default for AIBRIX_SYNC_MAX_CONTEXTS.
	DefaultMaxContexts = 1000
	// DefaultMaxPrefixesPerContext is sized for a fleet of a few dozen pods
	// each holding some 100,000 blocks of one model. AIBrix's default for
	// AIBRIX_SYNC_MAX_PREFIXES_PER_CONTEXT (10,000) holds less than one
	// pod's GPU cache and would keep the index evicting.
	DefaultMaxPrefixesPerContext = 4 << 20
	// DefaultMaxPrefixes bounds the blocks of all contexts together: some
	// 530 to 740 MB of index with one or two holders per block, reached only
	// when the fleet's caches hold that many distinct blocks.
	DefaultMaxPrefixes = 8 << 20
	// DefaultEvictionInterval matches AIBrix's default for
	// AIBRIX_SYNC_EVICTION_INTERVAL_SECONDS.
	DefaultEvictionInterval = 60 * time.Second
	// DefaultEvictionDuration matches AIBrix's default for
	// AIBRIX_SYNC_EVICTION_DURATION_MINUTES.
	DefaultEvictionDuration = 20 * time.Minute
)

// Config sizes a SyncPrefixHashTable. The zero value of each field selects
// its default; negative values are rejected. Environment variables are parsed
// by the gateway's configuration, never by this package.
type Config struct {
	// MaxContexts bounds the number of models (contexts) indexed at once.
	// When a batch for a new model would exceed it, the least recently
	// stored-or-matched model is dropped whole. A LoRA adapter shares the
	// context of its base model: one engine's cache holds both.
	// Env: AIBRIX_SYNC_MAX_CONTEXTS. Default DefaultMaxContexts.
	MaxContexts int
	// MaxPrefixesPerContext bounds the distinct blocks (prefix keys) indexed
	// for one model, whatever the number of pods holding each. Storing past
	// it evicts the least recently stored-or-matched blocks of the model's
	// streams that hold the most (see the package documentation).
	// Env: AIBRIX_SYNC_MAX_PREFIXES_PER_CONTEXT. Default
	// DefaultMaxPrefixesPerContext.
	MaxPrefixesPerContext int
	// MaxPrefixes bounds the distinct blocks of all models together. Storing
	// past it evicts blocks of the least recently used model, as its own
	// bound does. It has no AIBrix counterpart. Default DefaultMaxPrefixes.
	MaxPrefixes int
	// EvictionInterval is the period of the sweep that Run performs.
	// Env: AIBRIX_SYNC_EVICTION_INTERVAL_SECONDS. Default
	// DefaultEvictionInterval.
	EvictionInterval time.Duration
	// EvictionDuration is how long a pod may go without sending an event
	// and without being credited by a match before the sweep purges it.
	// Env: AIBRIX_SYNC_EVICTION_DURATION_MINUTES. Default
	// DefaultEvictionDuration.
	EvictionDuration time.Duration
	// Logger receives the index's logs: a model dropped whole and a
	// model's engines using more block sizes than before at verbosity 0;
	// pods purged, streams reset and an engine's block size changing at 2;
	// evictions at 3; stored blocks skipped for an unknown parent at 4.
	// The zero value logs through klog's global logger.
	Logger klog.Logger
}

// withDefaults returns c with every zero field set to its default, or an
// error naming the first negative field.
func (c Config) withDefaults() (Config, error) {
	err := cmp.Or(
		defaulted("MaxContexts", &c.MaxContexts, DefaultMaxContexts),
		defaulted("MaxPrefixesPerContext", &c.MaxPrefixesPerContext, DefaultMaxPrefixesPerContext),
		defaulted("MaxPrefixes", &c.MaxPrefixes, DefaultMaxPrefixes),
		defaulted("EvictionInterval", &c.EvictionInterval, DefaultEvictionInterval),
		defaulted("EvictionDuration", &c.EvictionDuration, DefaultEvictionDuration),
	)
	if c.Logger.GetSink() == nil {
		c.Logger = klog.Background()
	}
	return c, err
}

// defaulted sets *v to def when it is zero and rejects a negative *v.
func defaulted[T int | time.Duration](name string, v *T, def T) error {
	if *v < 0 {
		return fmt.Errorf("indexer config: %s is %v, want >= 0", name, *v)
	}
	if *v == 0 {
		*v = def
	}
	return nil
}
