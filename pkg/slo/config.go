package slo

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/pkg/routing"
	"github.com/kvgate/kvgate/pkg/types"
)

// Defaults of Config's zero fields.
const (
	DefaultMaxQueueLength = 1024
	DefaultMaxWait        = 60 * time.Second
)

// Config sets the models' objectives and bounds their queues.
type Config struct {
	// Default is the objective of a model that neither Models nor a GPU
	// profile sets one for (KVGATE_SLO_TTFT, KVGATE_SLO_TTFT_PER_PROMPT_TOKEN,
	// KVGATE_SLO_TPOT, KVGATE_SLO_E2E).
	Default types.SLO
	// Models replaces Default for the models it names (KVGATE_SLO_MODELS,
	// see ParseModels).
	Models map[string]types.SLO
	// MaxQueueLength bounds the requests one model's queue holds
	// (KVGATE_SLO_QUEUE_MAX_LENGTH, default 1024).
	MaxQueueLength int
	// MaxWait bounds how long a request waits in a queue, and the
	// Retry-After the queue answers (KVGATE_SLO_QUEUE_MAX_WAIT, default
	// 60 s).
	MaxWait time.Duration
	// Fairness orders the requests of one priority that belong to
	// different flows (KVGATE_SLO_QUEUE_FAIRNESS): FairnessDeadline (the
	// default, for "") or FairnessRoundRobin.
	Fairness string
	// Capacity, when set, is what frees capacity holds for writing until
	// it has called Trigger (the gateway's request ledger, through
	// inflight.Config.Frees); the queues hold it for reading while they
	// check for a Trigger and try a request, so that a later request never
	// takes capacity an earlier one could have. Entry.Try runs under it,
	// so it must not free capacity itself (close an attempt). It is set by
	// the gateway, not read from the environment.
	Capacity *sync.RWMutex
}

// withDefaults returns c with its zero bounds defaulted.
func (c Config) withDefaults() Config {
	c.MaxQueueLength = cmp.Or(c.MaxQueueLength, DefaultMaxQueueLength)
	c.MaxWait = cmp.Or(c.MaxWait, DefaultMaxWait)
	return c
}

// Validate reports negative objectives and bounds.
func (c Config) Validate() error {
	var errs []error
	if err := c.Default.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("default SLO: %w", err))
	}
	for m, s := range c.Models {
		if err := s.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("SLO of model %q: %w", m, err))
		}
	}
	if c.MaxQueueLength < 0 {
		errs = append(errs, fmt.Errorf("queue length bound %d is negative", c.MaxQueueLength))
	}
	if c.MaxWait < 0 {
		errs = append(errs, fmt.Errorf("queue wait bound %v is negative", c.MaxWait))
	}
	if c.Fairness != "" && !slices.Contains(FairnessPolicies, c.Fairness) {
		errs = append(errs, fmt.Errorf("queue fairness %q is none of %s", c.Fairness, strings.Join(FairnessPolicies, ", ")))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("invalid SLO config: %w", err)
	}
	return nil
}

// ParseModels reads per-model objectives written as
// model=objective;model=objective..., each objective as types.ParseSLO
// reads it, e.g. "llama=ttft:2s,tpot:50ms;qwen=e2e:30s". It fails on a
// malformed entry or a model named twice.
func ParseModels(text string) (map[string]types.SLO, error) {
	out := map[string]types.SLO{}
	for _, entry := range strings.Split(text, ";") {
		if strings.TrimSpace(entry) == "" {
			continue
		}
		model, objective, ok := strings.Cut(entry, "=")
		model = strings.TrimSpace(model)
		if !ok || model == "" {
			return nil, fmt.Errorf("%q is not model=objective", strings.TrimSpace(entry))
		}
		if _, dup := out[model]; dup {
			return nil, fmt.Errorf("model %q named twice", model)
		}
		s, err := types.ParseSLO(objective)
		if err != nil {
			return nil, fmt.Errorf("model %q: %w", model, err)
		}
		out[model] = s
	}
	return out, nil
}

// Source says where a model's objective comes from.
type Source string

// Sources of an objective.
const (
	SourceProfile Source = "profile"
	SourceModel   Source = "model"
	SourceDefault Source = "default"
	SourceNone    Source = "none"
)

// Objectives resolves the objective of each model: the SLO fields of the
// GPU profiles of the deployments serving it where they set one (the
// strictest, when the deployments' profiles differ), the configuration
// otherwise, target by target. Its methods are safe for concurrent use.
type Objectives struct {
	cfg      Config
	profiles routing.ProfileSource
}

// NewObjectives returns the objectives cfg and profiles (nil for none) set.
func NewObjectives(cfg Config, profiles routing.ProfileSource) *Objectives {
	cfg.Models = maps.Clone(cfg.Models)
	return &Objectives{cfg: cfg, profiles: profiles}
}

// For returns the objective of model, served by pods of the given
// deployments, and where its targets come from: the profiles when any
// target does.
func (o *Objectives) For(model string, deployments []string) (types.SLO, Source) {
	base, src := o.cfg.Default, SourceDefault
	if s, ok := o.cfg.Models[model]; ok {
		base, src = s, SourceModel
	}
	if fromProfiles := o.fromProfiles(model, deployments); !fromProfiles.IsZero() {
		if fromProfiles.TTFT != 0 {
			base.TTFT, base.TTFTPerPromptToken = fromProfiles.TTFT, 0
		}
		if fromProfiles.TPOT != 0 {
			base.TPOT = fromProfiles.TPOT
		}
		if fromProfiles.E2E != 0 {
			base.E2E = fromProfiles.E2E
		}
		src = SourceProfile
	}
	if base.IsZero() {
		src = SourceNone
	}
	return base, src
}

// fromProfiles returns the strictest of each target the profiles of model
// on deployments set.
func (o *Objectives) fromProfiles(model string, deployments []string) types.SLO {
	var s types.SLO
	if o.profiles == nil {
		return s
	}
	stricter := func(cur time.Duration, seconds float64) time.Duration {
		if !(seconds > 0) || seconds > 1e6 {
			return cur
		}
		d := time.Duration(seconds * float64(time.Second))
		if cur == 0 || d < cur {
			return d
		}
		return cur
	}
	for _, dep := range deployments {
		p := o.profiles.Lookup(model, dep)
		if p == nil {
			continue
		}
		s.TTFT = stricter(s.TTFT, p.SLOs.TTFT)
		s.TPOT = stricter(s.TPOT, p.SLOs.TPOT)
		s.E2E = stricter(s.E2E, p.SLOs.E2E)
	}
	return s
}
