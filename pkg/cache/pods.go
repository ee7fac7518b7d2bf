package cache

import (
	"slices"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// Pod labels and annotations the Store reads. Each is looked up as a label
// first, then as an annotation.
const (
	// ModelNameLabel names the base model a pod serves.
	ModelNameLabel = "model.aibrix.ai/name"
	// ModelPortLabel is the engine's HTTP port (OpenAI API and, unless
	// MetricPortLabel says otherwise, /metrics).
	ModelPortLabel = "model.aibrix.ai/port"
	// MetricPortLabel is the port serving /metrics when the engine's HTTP
	// proxy is separate from the engine, so that the two ports differ.
	MetricPortLabel = "model.aibrix.ai/metric-port"
	// LoraAdaptersAnnotation lists the LoRA adapters the pod's engine
	// serves besides its base model, separated by commas, e.g.
	// "sql-lora,chat-lora" (see PodAdapters). The Store also learns the
	// adapters an engine lists on its /v1/models, those loaded at runtime
	// included, so the annotation is needed only for adapters that must be
	// routable before the first listing, or for engines without one.
	LoraAdaptersAnnotation = "kvgate.io/lora-adapters"
	// DefaultDeploymentLabel names the label that holds a pod's deployment
	// name for GPU profile lookups (AIBRIX_POD_DEPLOYMENT_LABEL overrides it).
	DefaultDeploymentLabel = "app.kubernetes.io/name"
	// DefaultEnginePort is vLLM's default HTTP port.
	DefaultEnginePort = 8000
)

// podKey is the registry key of a pod: namespace/name.
func podKey(namespace, name string) string {
	return namespace + "/" + name
}

// metadataValue returns the pod's label key, else its annotation key.
func metadataValue(pod *v1.Pod, key string) (string, bool) {
	if v, ok := pod.Labels[key]; ok {
		return v, true
	}
	v, ok := pod.Annotations[key]
	return v, ok
}

// ModelName returns the base model the pod serves, from the ModelNameLabel
// label or annotation; "" when the pod names none.
func ModelName(pod *v1.Pod) string {
	v, _ := metadataValue(pod, ModelNameLabel)
	return v
}

// PodAdapters returns the LoRA adapters pod declares in
// LoraAdaptersAnnotation (a label or annotation): the comma-separated names,
// trimmed, without empty names and duplicates, in their order.
func PodAdapters(pod *v1.Pod) []string {
	v, ok := metadataValue(pod, LoraAdaptersAnnotation)
	if !ok {
		return nil
	}
	var out []string
	for _, name := range strings.Split(v, ",") {
		if name = strings.TrimSpace(name); name != "" && !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out
}

// ServingPort returns the engine's HTTP port for pod: the ModelPortLabel
// label or annotation when it holds a valid port, else defaultPort.
func ServingPort(pod *v1.Pod, defaultPort int) int {
	return portFrom(pod, defaultPort, ModelPortLabel)
}

// MetricsPort returns the port serving the engine's Prometheus /metrics:
// MetricPortLabel, else ModelPortLabel (label or annotation, the first that
// holds a valid port), else defaultPort.
func MetricsPort(pod *v1.Pod, defaultPort int) int {
	return portFrom(pod, defaultPort, MetricPortLabel, ModelPortLabel)
}

func portFrom(pod *v1.Pod, defaultPort int, keys ...string) int {
	for _, k := range keys {
		if v, ok := metadataValue(pod, k); ok {
			if p, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && p > 0 && p < 1<<16 {
				return p
			}
		}
	}
	return defaultPort
}

// IsPodRoutable reports whether requests may be sent to pod: it is Running,
// not being deleted, has an IP and its Ready condition is True.
func IsPodRoutable(pod *v1.Pod) bool {
	if pod.Status.Phase != v1.PodRunning || pod.Status.PodIP == "" || pod.DeletionTimestamp != nil {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == v1.PodReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}

// DeploymentName returns the name of the deployment pod belongs to, which
// keys its GPU profiles: the value of label deploymentLabel when set, else
// the name of the controlling ReplicaSet without its pod-template-hash
// suffix. It returns "" when neither is available.
func DeploymentName(pod *v1.Pod, deploymentLabel string) string {
	if v := pod.Labels[deploymentLabel]; v != "" {
		return v
	}
	for _, ref := range pod.OwnerReferences {
		if ref.Kind != "ReplicaSet" || ref.Controller == nil || !*ref.Controller {
			continue
		}
		if hash := pod.Labels["pod-template-hash"]; hash != "" {
			if name, ok := strings.CutSuffix(ref.Name, "-"+hash); ok && name != "" {
				return name
			}
		}
		if i := strings.LastIndexByte(ref.Name, '-'); i > 0 {
			return ref.Name[:i]
		}
	}
	return ""
}
