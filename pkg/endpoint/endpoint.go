// Package endpoint parses an inference pod once into what the gateway needs
// to know of it: its identity, the address of its engine, the model and
// LoRA adapters it serves, and whether requests may be sent to it.
//
// The pod labels and annotations kvgate reads are declared here, once, and
// every value read from them is trimmed of surrounding white space, so that
// a pod labelled "llama " serves the model "llama" wherever it is looked up:
// in the Store's model index, in the KV event streams and in the prefix
// index. The package depends on nothing but the Kubernetes API types, so
// that the Store, the KV event manager and any embedder can share it.
package endpoint

import (
	"cmp"
	"net"
	"slices"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
)

// Pod labels and annotations kvgate reads. Each is looked up as a label
// first, then as an annotation (see Value), so that values a label cannot
// hold go in annotations.
const (
	// ModelNameLabel names the base model a pod's engine serves (AIBrix's
	// label).
	ModelNameLabel = "model.aibrix.ai/name"
	// ModelPortLabel is the engine's HTTP port (OpenAI API and, unless
	// MetricPortLabel says otherwise, /metrics).
	ModelPortLabel = "model.aibrix.ai/port"
	// MetricPortLabel is the port serving /metrics when the engine's HTTP
	// proxy is separate from the engine, so that the two ports differ.
	MetricPortLabel = "model.aibrix.ai/metric-port"
	// LoraIDLabel is AIBrix's LoRA adapter id of the pod.
	LoraIDLabel = "model.aibrix.ai/lora-id"
	// KVEventsEnabledLabel is "true" on pods whose engine publishes KV
	// events that the gateway should follow (AIBrix's label).
	KVEventsEnabledLabel = "model.aibrix.ai/kv-events-enabled"
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
	// DPStartRankAnnotation is the data-parallel rank of the first of the
	// pod's ranks, as vLLM's --data-parallel-start-rank (default 0): the
	// pod's ranks are start..start+size-1, each publishing on the ports of
	// its rank and, in bind mode, dialling the bound socket of its rank.
	// Start plus size must not exceed MaxDPSize.
	DPStartRankAnnotation = "kvgate.io/dp-start-rank"
	// MaxDPSize bounds the data-parallel size a pod may declare, and the
	// ranks it may have.
	MaxDPSize = 256
	// LoraAdaptersAnnotation lists the LoRA adapters the pod's engine
	// serves besides its base model, separated by commas, e.g.
	// "sql-lora,chat-lora". The Store also learns the adapters an engine
	// lists on its /v1/models, those loaded at runtime included, so the
	// annotation is needed only for adapters that must be routable before
	// the first listing, or for engines without one.
	LoraAdaptersAnnotation = "kvgate.io/lora-adapters"
	// DefaultDeploymentLabel names the label that holds a pod's deployment
	// name, which keys its GPU profiles (AIBRIX_POD_DEPLOYMENT_LABEL
	// overrides it).
	DefaultDeploymentLabel = "app.kubernetes.io/name"
	// DefaultRayClusterFleetLabel names the label that AIBrix's
	// RayClusterFleet controller sets on every pod of a fleet to the
	// fleet's name (AIBRIX_POD_RAYCLUSTERFLEET_LABEL overrides it). It
	// names the deployment of the fleet's pods.
	DefaultRayClusterFleetLabel = "orchestration.aibrix.ai/raycluster-fleet-name"
	// RayNodeTypeLabel is KubeRay's label of a Ray node's role: "head" or
	// "worker". The engine of a multi-node vLLM runs on the head; pods
	// whose value is "worker" serve no requests.
	RayNodeTypeLabel = "ray.io/node-type"
	// RayIsNodeLabel is KubeRay's label on every Ray node's pod.
	RayIsNodeLabel = "ray.io/is-ray-node"
	// DefaultEnginePort is vLLM's default HTTP port.
	DefaultEnginePort = 8000
)

// Key names a pod: its namespace and name. It is comparable and serves as
// a map key; String gives the "namespace/name" form that logs, metrics and
// the prefix index use.
type Key struct {
	Namespace, Name string
}

// KeyOf returns the key of pod.
func KeyOf(pod *v1.Pod) Key { return Key{Namespace: pod.Namespace, Name: pod.Name} }

// String returns "namespace/name".
func (k Key) String() string { return k.Namespace + "/" + k.Name }

// UnreadyReason says why requests may not be sent to a pod; "" means they
// may.
type UnreadyReason string

// Reasons a pod is not ready for requests, in the order Readiness checks
// them.
const (
	// Terminating: the pod is being deleted.
	Terminating UnreadyReason = "terminating"
	// NotRunning: the pod's phase is not Running.
	NotRunning UnreadyReason = "not_running"
	// NoIP: the pod has no IP yet.
	NoIP UnreadyReason = "no_ip"
	// NotReady: the pod's Ready condition is not True.
	NotReady UnreadyReason = "not_ready"
	// RayWorker: the pod is a worker of a multi-node engine (KubeRay's
	// RayNodeTypeLabel is "worker"); its head serves the requests.
	RayWorker UnreadyReason = "ray_worker"
)

// Readiness returns why requests may not be sent to pod, "" when they may:
// the pod is not being deleted, is Running, has an IP, its Ready condition
// is True, and it is not the worker of a multi-node engine. It is the one readiness check of kvgate: the Store
// routes only to ready pods, and a KV event manager starts following only them.
func Readiness(pod *v1.Pod) UnreadyReason {
	switch {
	case pod.DeletionTimestamp != nil:
		return Terminating
	case pod.Status.Phase != v1.PodRunning:
		return NotRunning
	case pod.Status.PodIP == "":
		return NoIP
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == v1.PodReady {
			if c.Status != v1.ConditionTrue {
				break
			}
			if pod.Labels[RayNodeTypeLabel] == "worker" {
				return RayWorker
			}
			return ""
		}
	}
	return NotReady
}

// Value returns the pod's label key, else its annotation key, trimmed of
// surrounding white space, and whether either is set.
func Value(pod *v1.Pod, key string) (string, bool) {
	v, ok := pod.Labels[key]
	if !ok {
		v, ok = pod.Annotations[key]
	}
	return strings.TrimSpace(v), ok
}

// Endpoint is a pod parsed once: what the gateway routes to. Endpoints are
// immutable; a change of the pod is a new Endpoint.
type Endpoint struct {
	// Key names the pod; ID is Key.String(), computed once.
	Key Key
	ID  string
	// UID tells the pod from a later pod of the same name.
	UID k8stypes.UID
	// IP is the pod's IP, "" before it has one.
	IP string
	// Port is the engine's HTTP port: the ModelPortLabel value, else the
	// default port of the parse. DeclaredPort is the ModelPortLabel value
	// alone, 0 when the pod declares no valid port.
	Port         int
	DeclaredPort int
	// MetricsPort serves the engine's /metrics: the MetricPortLabel value,
	// else Port.
	MetricsPort int
	// Address is IP:Port, "" without an IP.
	Address string
	// Model is the base model the pod serves (ModelNameLabel), "" when it
	// names none.
	Model string
	// Adapters are the LoRA adapters the pod declares
	// (LoraAdaptersAnnotation): trimmed, without empty names and
	// duplicates, in their order.
	Adapters []string
	// LoraID is the LoraIDLabel value.
	LoraID string
	// KVEvents reports KVEventsEnabledLabel set to "true".
	KVEvents bool
	// DPSize is the number of data-parallel ranks the pod's engine serves
	// behind Port (DPSizeAnnotation), 1 when it declares none or no valid
	// one; DPStartRank is the first of them (DPStartRankAnnotation), 0
	// when it declares none or no valid one.
	DPSize, DPStartRank int
	// Unready is why requests may not be sent to the pod, "" when they may
	// (see Readiness).
	Unready UnreadyReason
	// Deployment is the name of the deployment the pod belongs to, which
	// keys its GPU profiles (see DeploymentName), "" when unknown.
	Deployment string
	// Pod is the pod parsed. It is shared: treat it as read-only.
	Pod *v1.Pod
}

// Ready reports whether requests may be sent to the pod.
func (e *Endpoint) Ready() bool { return e.Unready == "" }

// Options tune Parse.
type Options struct {
	// DefaultPort is the engine port of pods that declare none
	// (DefaultEnginePort when 0).
	DefaultPort int
	// DeploymentLabel is the label holding the deployment name
	// (DefaultDeploymentLabel when "").
	DeploymentLabel string
	// RayClusterFleetLabel is the label holding the name of the
	// RayClusterFleet a pod belongs to (DefaultRayClusterFleetLabel when
	// "").
	RayClusterFleetLabel string
}

// Parse returns the Endpoint of pod. It never fails: a label or annotation
// holding no valid value reads as unset (a port that is not a number from 1
// to 65535, for one), and a pod without a model or an IP is parsed as such.
// The Endpoint keeps pod: do not modify it afterwards.
func Parse(pod *v1.Pod, o Options) *Endpoint {
	defaultPort := cmp.Or(o.DefaultPort, DefaultEnginePort)
	e := &Endpoint{
		Key: KeyOf(pod), UID: pod.UID, IP: pod.Status.PodIP, Pod: pod,
		DeclaredPort: port(pod, ModelPortLabel),
		Adapters:     Adapters(pod),
		Unready:      Readiness(pod),
		Deployment:   DeploymentName(pod, o),
	}
	e.ID = e.Key.String()
	e.Port = cmp.Or(e.DeclaredPort, defaultPort)
	e.MetricsPort = cmp.Or(port(pod, MetricPortLabel), e.Port)
	if e.IP != "" {
		e.Address = net.JoinHostPort(e.IP, strconv.Itoa(e.Port))
	}
	e.Model, _ = Value(pod, ModelNameLabel)
	e.LoraID, _ = Value(pod, LoraIDLabel)
	kv, _ := Value(pod, KVEventsEnabledLabel)
	e.KVEvents = kv == "true"
	e.DPSize = intIn(pod, DPSizeAnnotation, 1, 1, MaxDPSize)
	e.DPStartRank = intIn(pod, DPStartRankAnnotation, 0, 0, MaxDPSize-e.DPSize)
	return e
}

// intIn returns the integer pod's key holds when it is one from lo to hi,
// else def.
func intIn(pod *v1.Pod, key string, def, lo, hi int) int {
	v, ok := Value(pod, key)
	if !ok {
		return def
	}
	if n, err := strconv.Atoi(v); err == nil && n >= lo && n <= hi {
		return n
	}
	return def
}

// port returns the port the pod's key holds, 0 when it holds none.
func port(pod *v1.Pod, key string) int {
	v, ok := Value(pod, key)
	if !ok {
		return 0
	}
	if p, err := strconv.Atoi(v); err == nil && p > 0 && p < 1<<16 {
		return p
	}
	return 0
}

// Adapters returns the LoRA adapters pod declares in LoraAdaptersAnnotation
// (a label or annotation): the comma-separated names, trimmed, without
// empty names and duplicates, in their order.
func Adapters(pod *v1.Pod) []string {
	v, ok := Value(pod, LoraAdaptersAnnotation)
	if !ok {
		return nil
	}
	var out []string
	for name := range strings.SplitSeq(v, ",") {
		if name = strings.TrimSpace(name); name != "" && !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out
}

// DeploymentName returns the name of the deployment pod belongs to, which
// keys its GPU profiles, with o's labels:
//   - the RayClusterFleetLabel value, for the pods of a RayClusterFleet;
//   - else the DeploymentLabel value, unless the pod is a Ray node
//     (RayIsNodeLabel), whose DeploymentLabel KubeRay sets to its own name;
//   - else the name of the controlling ReplicaSet without its
//     pod-template-hash suffix, or the name of the controlling RayCluster.
//
// It returns "" when none is available.
func DeploymentName(pod *v1.Pod, o Options) string {
	if v := strings.TrimSpace(pod.Labels[cmp.Or(o.RayClusterFleetLabel, DefaultRayClusterFleetLabel)]); v != "" {
		return v
	}
	_, rayNode := pod.Labels[RayIsNodeLabel]
	if v := strings.TrimSpace(pod.Labels[cmp.Or(o.DeploymentLabel, DefaultDeploymentLabel)]); v != "" && !rayNode {
		return v
	}
	for _, ref := range pod.OwnerReferences {
		if ref.Controller == nil || !*ref.Controller {
			continue
		}
		switch ref.Kind {
		case "RayCluster":
			return ref.Name
		case "ReplicaSet":
			if hash := pod.Labels["pod-template-hash"]; hash != "" {
				if name, ok := strings.CutSuffix(ref.Name, "-"+hash); ok && name != "" {
					return name
				}
			}
			if i := strings.LastIndexByte(ref.Name, '-'); i > 0 {
				return ref.Name[:i]
			}
		}
	}
	return ""
}
