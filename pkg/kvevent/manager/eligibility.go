package manager

import (
	"fmt"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/kvevent/transport"
)

// Pod labels and annotations a KVEventManager reads. Each is looked up as a
// label first, then as an annotation, so that values a label cannot hold (a
// topic with '@' or '/') go in annotations.
const (
	// KVEventsEnabledLabel must be "true" for the manager to follow a pod's
	// KV events (AIBrix's label).
	KVEventsEnabledLabel = "model.aibrix.ai/kv-events-enabled"
	// ModelNameLabel names the base model the pod's engine serves (AIBrix's
	// label); a pod without it is not followed.
	ModelNameLabel = "model.aibrix.ai/name"
	// LoraIDLabel is AIBrix's LoRA adapter id of the pod. It is part of the
	// identity of the pod's streams (changing it restarts them) and is handed
	// to the index with every batch; the blocks' own adapter comes from the
	// events.
	LoraIDLabel = "model.aibrix.ai/lora-id"
	// PubPortAnnotation overrides the port of rank 0's PUB socket; rank r
	// publishes on port+r, as vLLM offsets its endpoint.
	PubPortAnnotation = "kvgate.io/kv-events-pub-port"
	// ReplayPortAnnotation overrides the port of rank 0's replay ROUTER;
	// rank r uses port+r. "0" disables replay, as vLLM's default
	// replay_endpoint=None does.
	ReplayPortAnnotation = "kvgate.io/kv-events-replay-port"
	// TopicAnnotation overrides the topic prefix the subscription filters
	// on (vLLM's default topic is "").
	TopicAnnotation = "kvgate.io/kv-events-topic"
	// DPSizeAnnotation is the number of data-parallel ranks of the pod's
	// engine, one KV-event stream each (default 1).
	DPSizeAnnotation = "kvgate.io/dp-size"
)

// MaxDPSize bounds the data-parallel size a pod may declare.
const MaxDPSize = 256

// IneligibleReason tells why a KVEventManager does not follow a pod; ""
// means it does.
type IneligibleReason string

// Reasons a pod is not followed.
const (
	ReasonKVEventsDisabled IneligibleReason = "kv_events_disabled"
	ReasonNoModel          IneligibleReason = "no_model"
	ReasonTerminating      IneligibleReason = "terminating"
	ReasonNotRunning       IneligibleReason = "not_running"
	ReasonNoIP             IneligibleReason = "no_ip"
	ReasonNotReady         IneligibleReason = "not_ready"
	ReasonInvalidConfig    IneligibleReason = "invalid_config"
)

// ineligibleReasons lists every IneligibleReason, for metrics.
var ineligibleReasons = []IneligibleReason{ReasonKVEventsDisabled, ReasonNoModel, ReasonTerminating,
	ReasonNotRunning, ReasonNoIP, ReasonNotReady, ReasonInvalidConfig}

// StreamDefaults are the settings of a pod's KV-event streams that its
// annotations do not override.
type StreamDefaults struct {
	// PubPort is rank 0's PUB port (DefaultPubPort when 0).
	PubPort int
	// ReplayPort is rank 0's replay ROUTER port; 0 disables replay unless a
	// pod's ReplayPortAnnotation enables it. DefaultStreamDefaults sets
	// DefaultRouterPort.
	ReplayPort int
	// Topic is the subscription's topic prefix.
	Topic string
}

// DefaultStreamDefaults returns vLLM's documented setup: PUB on 5557+rank,
// replay on 5558+rank, every topic.
func DefaultStreamDefaults() StreamDefaults {
	return StreamDefaults{PubPort: transport.DefaultPubPort, ReplayPort: transport.DefaultRouterPort}
}

func (d StreamDefaults) validate() error {
	if d.PubPort < 1 || d.PubPort > 65535 {
		return fmt.Errorf("default PUB port %d is not a port", d.PubPort)
	}
	if d.ReplayPort < 0 || d.ReplayPort > 65535 {
		return fmt.Errorf("default replay port %d is not a port (0 disables replay)", d.ReplayPort)
	}
	return nil
}

// PodTarget is what a KVEventManager follows for one eligible pod: one
// stream per data-parallel rank. Two pods with equal targets are followed
// the same way; any change restarts the pod's streams.
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
}

// streamID returns the identity of rank's stream.
func (t PodTarget) streamID(rank int) kvevent.StreamID {
	return kvevent.StreamID{PodKey: t.PodKey, DPRank: rank, Model: t.Model, LoraID: t.LoraID}
}

// podKey returns the key a KVEventManager and the index name a pod by:
// "namespace/name".
func podKey(namespace, name string) string { return namespace + "/" + name }

// TargetForPod decides whether a KVEventManager follows pod and how: it
// returns the pod's target, or the reason it is not followed and, for
// ReasonInvalidConfig, an error naming the bad label or annotation.
//
// A pod is followed when KVEventsEnabledLabel is "true", it names a model
// (ModelNameLabel), is Running, not terminating, has an IP, its Ready
// condition is True, and its port, topic and DP-size overrides are valid:
// ports in range, and with several ranks the PUB and replay port ranges
// must not overlap (vLLM could not bind them).
func TargetForPod(pod *v1.Pod, d StreamDefaults) (PodTarget, IneligibleReason, error) {
	if v, _ := podValue(pod, KVEventsEnabledLabel); v != "true" {
		return PodTarget{}, ReasonKVEventsDisabled, nil
	}
	model, _ := podValue(pod, ModelNameLabel)
	if model == "" {
		return PodTarget{}, ReasonNoModel, nil
	}
	switch {
	case pod.DeletionTimestamp != nil:
		return PodTarget{}, ReasonTerminating, nil
	case pod.Status.Phase != v1.PodRunning:
		return PodTarget{}, ReasonNotRunning, nil
	case pod.Status.PodIP == "":
		return PodTarget{}, ReasonNoIP, nil
	case !podReady(pod):
		return PodTarget{}, ReasonNotReady, nil
	}
	lora, _ := podValue(pod, LoraIDLabel)
	t := PodTarget{
		PodKey: podKey(pod.Namespace, pod.Name), UID: string(pod.UID), IP: pod.Status.PodIP, Model: model, LoraID: lora,
		PubPort: d.PubPort, ReplayPort: d.ReplayPort, Topic: d.Topic, DPSize: 1,
	}
	if v, ok := podValue(pod, TopicAnnotation); ok {
		t.Topic = v
	}
	var err error
	if t.PubPort, err = intValue(pod, PubPortAnnotation, t.PubPort, 1, 65535); err == nil {
		if t.ReplayPort, err = intValue(pod, ReplayPortAnnotation, t.ReplayPort, 0, 65535); err == nil {
			t.DPSize, err = intValue(pod, DPSizeAnnotation, 1, 1, MaxDPSize)
		}
	}
	if err == nil {
		err = t.checkPorts()
	}
	if err != nil {
		return PodTarget{}, ReasonInvalidConfig, fmt.Errorf("pod %s: %w", t.PodKey, err)
	}
	return t, "", nil
}

// checkPorts verifies that every rank's ports exist and do not collide.
func (t PodTarget) checkPorts() error {
	last := t.DPSize - 1
	if t.PubPort+last > 65535 {
		return fmt.Errorf("%s %d with %s %d: rank %d's port is beyond 65535", PubPortAnnotation, t.PubPort, DPSizeAnnotation, t.DPSize, last)
	}
	if t.ReplayPort == 0 {
		return nil
	}
	if t.ReplayPort+last > 65535 {
		return fmt.Errorf("%s %d with %s %d: rank %d's port is beyond 65535", ReplayPortAnnotation, t.ReplayPort, DPSizeAnnotation, t.DPSize, last)
	}
	if t.PubPort <= t.ReplayPort+last && t.ReplayPort <= t.PubPort+last {
		return fmt.Errorf("PUB ports %d-%d and replay ports %d-%d of %d ranks overlap: rank 0's ports must be at least %d apart",
			t.PubPort, t.PubPort+last, t.ReplayPort, t.ReplayPort+last, t.DPSize, t.DPSize)
	}
	return nil
}

// podValue returns the pod's label key, else its annotation key, trimmed.
func podValue(pod *v1.Pod, key string) (string, bool) {
	if v, ok := pod.Labels[key]; ok {
		return strings.TrimSpace(v), true
	}
	v, ok := pod.Annotations[key]
	return strings.TrimSpace(v), ok
}

// intValue returns the integer value of key, def when the pod does not set
// it, or an error when it is not an integer in [lo, hi].
func intValue(pod *v1.Pod, key string, def, lo, hi int) (int, error) {
	v, ok := podValue(pod, key)
	if !ok {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("%s=%q: want an integer from %d to %d", key, v, lo, hi)
	}
	return n, nil
}

// podReady reports whether the pod's Ready condition is True.
func podReady(pod *v1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == v1.PodReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}
