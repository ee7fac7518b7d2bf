package routingbench

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Demand is the compute a workload asks of a fleet that reuses no prefix,
// estimated from the engines' latency model with steps as full as the
// engines allow.
type Demand struct {
	// PrefillSeconds is the time to compute every prompt token, attention
	// included; DecodeSeconds the time to decode every output token after
	// the first, each at its context; and OverheadSeconds the steps' fixed
	// costs: as few steps as the token budget allows, and no fewer than it
	// takes to decode the output at the largest batch the KV cache holds.
	PrefillSeconds, DecodeSeconds, OverheadSeconds float64
	// CapacitySeconds is what the fleet computes over the workload's span:
	// the span times the sum of the engines' speeds.
	CapacitySeconds float64
	// Load is the demand over the capacity. 1 is the fleet's capacity: the
	// rate at which it is busy all the time if it reuses no prefix, the
	// most a policy blind to prefixes could sustain. Policies that reuse
	// prefixes have room to spare there, as much as the work their hits
	// save.
	Load float64
}

// EstimateDemand estimates the compute w asks of cfg's fleet at w's own
// arrival rate. It fails when cfg is invalid or w spans no time.
func EstimateDemand(cfg Config, w Workload) (Demand, error) {
	cfg, err := cfg.normalize()
	if err != nil {
		return Demand{}, err
	}
	if err := w.validate(cfg.Engine.VocabSize); err != nil {
		return Demand{}, err
	}
	span := w.Stats().Duration
	if span <= 0 {
		return Demand{}, fmt.Errorf("workload %q spans no time: its load is undefined", w.Name)
	}
	e := cfg.Engine
	lat := e.Latency
	lat.Speed = 1 // the fleet's speeds are counted in its capacity
	var d Demand
	var tokens, decodeTokens, decodeKV float64
	for i := range w.Requests {
		r := &w.Requests[i]
		n, o := len(r.Prompt), r.OutputTokens
		d.PrefillSeconds += lat.PrefillTime(0, n).Seconds()
		// Output token t (from 1) is decoded after n+t-1 tokens of context.
		steps := float64(o - 1)
		ctx := steps*float64(n) + steps*(steps-1)/2
		d.DecodeSeconds += steps*lat.DecodePerToken.Seconds() + ctx*lat.DecodePerContextToken/1e9
		tokens += float64(n) + steps
		decodeTokens += steps
		decodeKV += steps * (float64(n) + steps/2)
	}
	batch := float64(e.MaxNumSeqs)
	if decodeTokens > 0 {
		batch = max(1, min(batch, float64((e.NumGPUBlocks-1)*e.BlockSize)/(decodeKV/decodeTokens)))
	}
	stepCount := max(tokens/float64(e.MaxNumBatchedTokens), decodeTokens/batch)
	d.OverheadSeconds = stepCount * lat.StepOverhead.Seconds()
	speeds := 0.0
	for i := range cfg.Engines {
		speeds += engineSpeed(cfg, i)
	}
	if e.Latency.Speed > 0 {
		speeds *= e.Latency.Speed
	}
	d.CapacitySeconds = span.Seconds() * speeds
	d.Load = (d.PrefillSeconds + d.DecodeSeconds + d.OverheadSeconds) / d.CapacitySeconds
	return d, nil
}

// AtLoad returns w with its arrivals rescaled, from the first one, so that
// it asks load times cfg's fleet's capacity (EstimateDemand): 1 is the
// most the fleet could sustain reusing no prefix, 0.5 half of it. The requests are shared
// with w; the name gains the load ("mooncake@1.5x"). It fails when cfg is
// invalid, w spans no time or load is not positive.
func AtLoad(cfg Config, w Workload, load float64) (Workload, error) {
	if !(load > 0) || math.IsInf(load, 0) {
		return Workload{}, errors.New("load must be a positive number")
	}
	d, err := EstimateDemand(cfg, w)
	if err != nil {
		return Workload{}, err
	}
	stretch := d.Load / load
	out := Workload{Name: fmt.Sprintf("%s@%gx", w.Name, load), Load: load, Tokenization: w.Tokenization,
		Requests: make([]Request, len(w.Requests))}
	first := w.Requests[0].Arrival
	for i, r := range w.Requests {
		r.Arrival = first + time.Duration(math.Round(float64(r.Arrival-first)*stretch))
		out.Requests[i] = r
	}
	return out, nil
}
