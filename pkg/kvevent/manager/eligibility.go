package manager

import (
	"fmt"
	"strconv"

	v1 "k8s.io/api/core/v1"

	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/kvevent/transport"
)

// A KVEventManager reads a pod's labels and annotations through package
// endpoint: endpoint.KVEventsEnabledLabel, endpoint.ModelNameLabel,
// endpoint.LoraIDLabel (part of the identity of the pod's streams: changing
// it restarts them), the stream overrides endpoint.PubPortAnnotation,
// endpoint.ReplayPortAnnotation, endpoint.TopicAnnotation,
// endpoint.DPSizeAnnotation and endpoint.DPStartRankAnnotation, and
// endpoint.ModelPortLabel (the engine's HTTP port, which names it in bind
// mode).

// IneligibleReason tells why a KVEventManager does not follow a pod; ""
// means it does.
type IneligibleReason string

// Reasons a pod is not followed. A pod that is not ready is not followed for
// the reason endpoint.Readiness gives, except that a followed pod whose Ready
// condition turns false (ReasonNotReady) stays followed: see TargetForPod.
const (
	ReasonKVEventsDisabled IneligibleReason = "kv_events_disabled"
	ReasonNoModel          IneligibleReason = "no_model"
	ReasonTerminating                       = IneligibleReason(endpoint.Terminating)
	ReasonNotRunning                        = IneligibleReason(endpoint.NotRunning)
	ReasonNoIP                              = IneligibleReason(endpoint.NoIP)
	ReasonNotReady                          = IneligibleReason(endpoint.NotReady)
	ReasonRayWorker                         = IneligibleReason(endpoint.RayWorker)
	ReasonInvalidConfig    IneligibleReason = "invalid_config"
)

// ineligibleReasons lists every IneligibleReason, for metrics.
var ineligibleReasons = []IneligibleReason{ReasonKVEventsDisabled, ReasonNoModel, ReasonTerminating,
	ReasonNotRunning, ReasonNoIP, ReasonNotReady, ReasonRayWorker, ReasonInvalidConfig}

// StreamDefaults are the settings of a pod's KV-event streams that its
// annotations do not override.
type StreamDefaults struct {
	// PubPort is rank 0's PUB port (DefaultPubPort when 0).
	PubPort int
	// ReplayPort is rank 0's replay ROUTER port; 0 disables replay unless a
	// pod's endpoint.ReplayPortAnnotation enables it. DefaultStreamDefaults sets
	// DefaultRouterPort.
	ReplayPort int
	// Topic is the subscription's topic prefix.
	Topic string
	// EnginePort is the HTTP port of engines without
	// endpoint.ModelPortLabel (endpoint.DefaultEnginePort when 0). In bind
	// mode an engine's HTTP port is part of its identity, the port of the
	// topic it publishes with.
	EnginePort int
}

// DefaultStreamDefaults returns vLLM's documented setup: PUB on 5557+rank,
// replay on 5558+rank, every topic, HTTP on 8000.
func DefaultStreamDefaults() StreamDefaults {
	return StreamDefaults{PubPort: transport.DefaultPubPort, ReplayPort: transport.DefaultRouterPort,
		EnginePort: endpoint.DefaultEnginePort}
}

func (d StreamDefaults) validate() error {
	if d.EnginePort < 0 || d.EnginePort > 65535 {
		return fmt.Errorf("default engine port %d is not a port", d.EnginePort)
	}
	if d.PubPort < 1 || d.PubPort > 65535 {
		return fmt.Errorf("default PUB port %d is not a port", d.PubPort)
	}
	if d.ReplayPort < 0 || d.ReplayPort > 65535 {
		return fmt.Errorf("default replay port %d is not a port (0 disables replay)", d.ReplayPort)
	}
	return nil
}

// PodTarget is what a KVEventManager follows for one eligible pod: one
// stream per data-parallel rank, ranks FirstRank to FirstRank+DPSize-1.
// A KVEventManager keeps only the fields its mode reads (EnginePort is 0 in
// connect mode, PubPort and Topic are zero in bind mode); two pods with
// equal kept fields are followed the same way, and a change of any of them
// restarts the pod's streams.
type PodTarget struct {
	PodKey string
	// UID tells a pod from a later pod of the same name, whose engine is
	// a new process.
	UID        string
	IP         string
	Model      string
	LoraID     string
	PubPort    int
	ReplayPort int // 0: replay disabled
	Topic      string
	DPSize     int
	// FirstRank is the pod's first data-parallel rank: rank r publishes
	// on PubPort+r and replays on ReplayPort+r.
	FirstRank int
	// EnginePort is the engine's HTTP port, which names it in bind mode.
	// Connect mode does not use it.
	EnginePort int
}

// streamID returns the identity of rank's stream.
func (t PodTarget) streamID(rank int) kvevent.StreamID {
	return kvevent.StreamID{PodKey: t.PodKey, DPRank: rank, Model: t.Model, LoraID: t.LoraID}
}

// TargetForPod decides whether a KVEventManager follows pod and how: it
// returns the pod's target, or the reason it is not followed and, for
// ReasonInvalidConfig, an error naming the bad label or annotation.
//
// A pod is followed when endpoint.KVEventsEnabledLabel is "true", it names a
// model (endpoint.ModelNameLabel), it is ready (endpoint.Readiness), and its
// port, topic and data-parallel overrides are valid: ports in range, ranks
// below endpoint.MaxDPSize, and with several ranks the PUB and replay port
// ranges must not overlap (vLLM could not bind them).
//
// A pod that would be followed but for its Ready condition gets its target
// together with ReasonNotReady: a KVEventManager does not start following
// it, and keeps following it when it already follows that target. A failed
// readiness probe takes the pod out of routing (the Store routes only to
// ready pods) but leaves its engine's KV cache as it is; stopping the
// streams would lose the blocks the engine stores meanwhile, and those its
// replay buffer no longer holds when the pod is ready again.
func TargetForPod(pod *v1.Pod, d StreamDefaults) (PodTarget, IneligibleReason, error) {
	if v, _ := endpoint.Value(pod, endpoint.KVEventsEnabledLabel); v != "true" {
		return PodTarget{}, ReasonKVEventsDisabled, nil
	}
	model, _ := endpoint.Value(pod, endpoint.ModelNameLabel)
	if model == "" {
		return PodTarget{}, ReasonNoModel, nil
	}
	readiness := IneligibleReason(endpoint.Readiness(pod))
	if readiness != "" && readiness != ReasonNotReady {
		return PodTarget{}, readiness, nil
	}
	lora, _ := endpoint.Value(pod, endpoint.LoraIDLabel)
	t := PodTarget{
		PodKey: endpoint.KeyOf(pod).String(), UID: string(pod.UID), IP: pod.Status.PodIP, Model: model, LoraID: lora,
		PubPort: d.PubPort, ReplayPort: d.ReplayPort, Topic: d.Topic, DPSize: 1,
		EnginePort: endpoint.Parse(pod, endpoint.Options{DefaultPort: d.EnginePort}).Port,
	}
	if v, ok := endpoint.Value(pod, endpoint.TopicAnnotation); ok {
		t.Topic = v
	}
	var err error
	if t.PubPort, err = intValue(pod, endpoint.PubPortAnnotation, t.PubPort, 1, 65535); err == nil {
		if t.ReplayPort, err = intValue(pod, endpoint.ReplayPortAnnotation, t.ReplayPort, 0, 65535); err == nil {
			t.DPSize, err = intValue(pod, endpoint.DPSizeAnnotation, 1, 1, endpoint.MaxDPSize)
		}
	}
	if err == nil {
		t.FirstRank, err = intValue(pod, endpoint.DPStartRankAnnotation, 0, 0, endpoint.MaxDPSize-t.DPSize)
	}
	if err == nil {
		err = t.checkPorts()
	}
	if err != nil {
		return PodTarget{}, ReasonInvalidConfig, fmt.Errorf("pod %s: %w", t.PodKey, err)
	}
	return t, readiness, nil
}

// lastRank returns the pod's last data-parallel rank.
func (t PodTarget) lastRank() int { return t.FirstRank + t.DPSize - 1 }

// checkPorts verifies that every rank's ports exist and do not collide.
func (t PodTarget) checkPorts() error {
	last := t.lastRank()
	if t.PubPort+last > 65535 {
		return fmt.Errorf("%s %d with %s %d: rank %d's port is beyond 65535", endpoint.PubPortAnnotation, t.PubPort, endpoint.DPSizeAnnotation, t.DPSize, last)
	}
	if t.ReplayPort == 0 {
		return nil
	}
	if t.ReplayPort+last > 65535 {
		return fmt.Errorf("%s %d with %s %d: rank %d's port is beyond 65535", endpoint.ReplayPortAnnotation, t.ReplayPort, endpoint.DPSizeAnnotation, t.DPSize, last)
	}
	first := t.FirstRank
	if t.PubPort+first <= t.ReplayPort+last && t.ReplayPort+first <= t.PubPort+last {
		return fmt.Errorf("PUB ports %d-%d and replay ports %d-%d of %d ranks overlap: rank 0's ports must be at least %d apart",
			t.PubPort+first, t.PubPort+last, t.ReplayPort+first, t.ReplayPort+last, t.DPSize, t.DPSize)
	}
	return nil
}

// intValue returns the integer value of key, def when the pod does not set
// it, or an error when it is not an integer in [lo, hi].
func intValue(pod *v1.Pod, key string, def, lo, hi int) (int, error) {
	v, ok := endpoint.Value(pod, key)
	if !ok {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("%s=%q: want an integer from %d to %d", key, v, lo, hi)
	}
	return n, nil
}
