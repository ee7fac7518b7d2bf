package sim

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kvgate/kvgate/pkg/kvevent"
)

// EngineConfig configures an Engine. A zero numeric field takes the default
// its documentation names.
type EngineConfig struct {
	// BlockSize is the number of tokens per KV-cache block; default 16.
	BlockSize int
	// NumGPUBlocks is the number of KV-cache blocks, vLLM's num_gpu_blocks
	// (one is reserved); default 4096.
	NumGPUBlocks int
	// MaxNumSeqs caps the running requests; default 256.
	MaxNumSeqs int
	// MaxNumBatchedTokens caps the tokens one step computes; longer prompts
	// are prefilled in chunks over several steps. Default 8192.
	MaxNumBatchedTokens int
	// MaxModelLen caps prompt plus output tokens of a request; default the
	// smaller of 8192 and what the KV cache holds. It may not exceed what the
	// KV cache holds, or a long request could never be scheduled.
	MaxModelLen int
	// HashSeed seeds the engine's block hashes (vLLM's NONE_HASH). Engines
	// with different seeds name the same blocks differently.
	HashSeed string
	// DataParallelRank is stamped on every event batch.
	DataParallelRank int
	// DefaultOutputTokens is how many tokens a request without MaxTokens
	// generates, the last one EOS; 0 means it generates until MaxModelLen.
	DefaultOutputTokens int
	// OutputSeed keys the tokens the simulated model generates.
	OutputSeed uint64
	// VocabSize bounds the token ids a prompt may hold; default the
	// simulator tokenizer's VocabSize. An engine fed by a model's own
	// tokenizer takes that tokenizer's vocabulary size.
	VocabSize uint32
	// Events makes the engine produce KV-cache event batches.
	Events bool
	// Latency prices each step.
	Latency LatencyModel
}

// withDefaults returns cfg with its zero fields set to their defaults.
func (cfg EngineConfig) withDefaults() EngineConfig {
	cfg.BlockSize = cmp.Or(cfg.BlockSize, 16)
	cfg.NumGPUBlocks = cmp.Or(cfg.NumGPUBlocks, 4096)
	cfg.MaxNumSeqs = cmp.Or(cfg.MaxNumSeqs, 256)
	cfg.MaxNumBatchedTokens = cmp.Or(cfg.MaxNumBatchedTokens, 8192)
	cfg.MaxModelLen = cmp.Or(cfg.MaxModelLen, min(8192, (cfg.NumGPUBlocks-1)*cfg.BlockSize))
	cfg.VocabSize = cmp.Or(cfg.VocabSize, VocabSize)
	return cfg
}

func (cfg EngineConfig) validate() error {
	switch {
	case cfg.BlockSize < 0 || cfg.NumGPUBlocks < 0 || cfg.MaxNumSeqs < 0 ||
		cfg.MaxNumBatchedTokens < 0 || cfg.MaxModelLen < 0 || cfg.DefaultOutputTokens < 0:
		return errors.New("engine sizes must not be negative")
	case cfg.NumGPUBlocks < 2:
		return fmt.Errorf("engine needs at least 2 KV-cache blocks, got %d", cfg.NumGPUBlocks)
	case cfg.MaxModelLen > (cfg.NumGPUBlocks-1)*cfg.BlockSize:
		return fmt.Errorf("max model len %d exceeds the %d tokens the KV cache holds (%d usable blocks of %d)",
			cfg.MaxModelLen, (cfg.NumGPUBlocks-1)*cfg.BlockSize, cfg.NumGPUBlocks-1, cfg.BlockSize)
	case !cfg.Latency.valid():
		return errors.New("latency model costs and speed must be finite and not negative")
	}
	return nil
}

// Errors returned by Engine.Add for requests an engine cannot take.
var (
	ErrDuplicateRequest = errors.New("duplicate request id")
	ErrInvalidPrompt    = errors.New("invalid prompt")
	ErrTooLong          = errors.New("request exceeds the maximum model length")
)

// Engine is a simulated vLLM engine core: a KV cache, a scheduler and a
// latency model, advanced by explicit steps. It is not safe for concurrent
// use.
//
// The caller owns time. Add takes the arrival time; a step runs from
// BeginStep(now), which schedules requests, allocates their blocks and
// returns when the step ends according to the latency model, to EndStep,
// which samples one token for every request whose prompt is complete,
// finishes requests and returns the step's outputs and event batch. Between
// the two calls the caller may Add, Abort and query, as vLLM's engine core
// accepts requests while the model runs; new requests wait for the next
// step.
type Engine struct {
	cfg       EngineConfig
	kv        *KVCache
	requests  map[string]*request
	waiting   []*request
	running   []*request
	step      step
	inStep    bool
	scheduled []scheduledRequest
}

// NewEngine returns an idle engine with an empty KV cache.
func NewEngine(cfg EngineConfig) (*Engine, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	kv, err := NewKVCache(KVCacheConfig{
		NumBlocks: cfg.NumGPUBlocks,
		BlockSize: cfg.BlockSize,
		HashSeed:  cfg.HashSeed,
		Events:    cfg.Events,
	})
	if err != nil {
		return nil, err
	}
	return &Engine{cfg: cfg, kv: kv, requests: make(map[string]*request)}, nil
}

// Config returns the engine's configuration with defaults filled in.
func (e *Engine) Config() EngineConfig { return e.cfg }

// Add queues a request that arrived at now. It fails, changing nothing, for
// a duplicate id (ErrDuplicateRequest), an empty prompt or a token outside
// the vocabulary (ErrInvalidPrompt), or a prompt that with MaxTokens does not
// fit in MaxModelLen (ErrTooLong).
func (e *Engine) Add(spec RequestSpec, now time.Time) error {
	if _, dup := e.requests[spec.ID]; dup {
		return fmt.Errorf("add request %q: %w", spec.ID, ErrDuplicateRequest)
	}
	if err := e.checkPrompt(spec); err != nil {
		return fmt.Errorf("add request %q: %w", spec.ID, err)
	}
	r := &request{
		id:        spec.ID,
		seq:       e.kv.NewSequence(spec.Prompt, spec.LoRA),
		maxOutput: spec.MaxTokens,
		genKey:    generationKey(e.cfg.OutputSeed, spec.Prompt, spec.Seed),
	}
	if spec.MaxTokens == 0 {
		r.maxOutput = e.cfg.MaxModelLen - len(spec.Prompt)
		r.eosAt = e.cfg.DefaultOutputTokens
	}
	r.stats.PromptTokens = len(spec.Prompt)
	r.stats.Timings.Arrival = now
	e.requests[spec.ID] = r
	e.waiting = append(e.waiting, r)
	return nil
}

func (e *Engine) checkPrompt(spec RequestSpec) error {
	if len(spec.Prompt) == 0 {
		return fmt.Errorf("%w: the prompt is empty", ErrInvalidPrompt)
	}
	for _, t := range spec.Prompt {
		if t >= e.cfg.VocabSize {
			return fmt.Errorf("%w: token id %d is out of vocabulary (%d ids)", ErrInvalidPrompt, t, e.cfg.VocabSize)
		}
	}
	if spec.MaxTokens < 0 {
		return fmt.Errorf("%w: max tokens %d is negative", ErrInvalidPrompt, spec.MaxTokens)
	}
	// Compared so that no MaxTokens, however large, overflows the sum.
	if out := max(spec.MaxTokens, 1); out > e.cfg.MaxModelLen-len(spec.Prompt) {
		return fmt.Errorf("%w: maximum context length is %d tokens, the request needs %d (%d in the prompt, %d to generate)",
			ErrTooLong, e.cfg.MaxModelLen, uint64(len(spec.Prompt))+uint64(out), len(spec.Prompt), out)
	}
	return nil
}

// Abort removes an unfinished request, releasing its blocks at once, and
// reports whether it existed. If the request is part of the step in flight,
// the step's outputs leave it out.
func (e *Engine) Abort(id string) (RequestStats, bool) {
	r, ok := e.requests[id]
	if !ok {
		return RequestStats{}, false
	}
	switch r.status {
	case statusWaiting:
		e.waiting = slices.DeleteFunc(e.waiting, func(w *request) bool { return w == r })
	case statusRunning:
		e.running = slices.DeleteFunc(e.running, func(w *request) bool { return w == r })
		e.kv.Free(r.seq)
	}
	r.status = statusFinished
	delete(e.requests, id)
	return r.stats, true
}

// ResetPrefixCache drops every cached block, like vLLM's reset_prefix_cache,
// and returns the event batch announcing it, stamped now (nil when the
// engine produces no events). It fails, wrapping ErrBlocksInUse, while any
// request holds blocks.
//
// vLLM leaves the AllBlocksCleared event queued until its next scheduler
// step, so an idle engine announces a reset only when the next request
// runs; the simulator publishes it at once.
func (e *Engine) ResetPrefixCache(now time.Time) (*kvevent.EventBatch, error) {
	if err := e.kv.ResetPrefixCache(); err != nil {
		return nil, err
	}
	return e.batch(now), nil
}

// CachedPrefixBlocks returns how many leading full blocks of tokens, run
// with adapter lora (nil for the base model), the engine's KV cache holds
// right now. It changes nothing.
func (e *Engine) CachedPrefixBlocks(tokens []uint32, lora *LoRA) int {
	return e.kv.CachedPrefixBlocks(tokens, lora)
}

// QueueState is a snapshot of an engine's load.
type QueueState struct {
	// Running and Waiting count the requests in each queue. Waiting includes
	// preempted requests.
	Running, Waiting int
	// WaitingTokens counts the tokens of waiting requests, all of which
	// still need computing unless found in the prefix cache.
	WaitingTokens int
	// RunningPrefillTokens counts the tokens running requests still have to
	// prefill before their first (or next, after a preemption) token.
	RunningPrefillTokens int
	// FreeBlocks counts the KV-cache blocks no request holds.
	FreeBlocks int
	// KVCacheUsage is the fraction of usable blocks requests hold.
	KVCacheUsage float64
	// InStep reports a step in flight.
	InStep bool
}

// QueueState returns the engine's current load.
func (e *Engine) QueueState() QueueState {
	q := QueueState{
		Running:      len(e.running),
		Waiting:      len(e.waiting),
		FreeBlocks:   e.kv.NumFreeBlocks(),
		KVCacheUsage: e.kv.Usage(),
		InStep:       e.inStep,
	}
	for _, r := range e.waiting {
		q.WaitingTokens += r.seq.Len()
	}
	for _, r := range e.running {
		if r.computed < r.seq.Len()-1 {
			q.RunningPrefillTokens += r.seq.Len() - r.computed
		}
	}
	return q
}

// HasWork reports whether a step would schedule anything: whether any
// request is running or waiting.
func (e *Engine) HasWork() bool { return len(e.running)+len(e.waiting) > 0 }

// batch wraps the KV-cache events recorded so far in a batch stamped now,
// or returns nil when there are none.
func (e *Engine) batch(now time.Time) *kvevent.EventBatch {
	events := e.kv.TakeEvents()
	if len(events) == 0 {
		return nil
	}
	ts := float64(now.UnixNano()) / 1e9
	stamp := kvevent.TimeFromTS(ts)
	for _, ev := range events {
		switch ev := ev.(type) {
		case *kvevent.BlockStoredEvent:
			ev.Timestamp = stamp
		case *kvevent.BlockRemovedEvent:
			ev.Timestamp = stamp
		case *kvevent.AllBlocksClearedEvent:
			ev.Timestamp = stamp
		}
	}
	return &kvevent.EventBatch{TS: ts, Events: events, DataParallelRank: e.cfg.DataParallelRank}
}
