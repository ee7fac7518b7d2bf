package manifests

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kvgate/kvgate/pkg/config"
	"github.com/kvgate/kvgate/pkg/discovery"
	"github.com/kvgate/kvgate/pkg/endpoint"
	"github.com/kvgate/kvgate/pkg/kvevent/manager"
)

// engineArgs is what a sample's engine is started with, read from its
// container's arguments (vLLM's --flag=value or vllm-sim's -flag=value).
type engineArgs struct {
	// model is the model name clients ask for: vLLM's --served-model-name,
	// vllm-sim's -model.
	model  string
	port   int
	dpSize int
	events kvEventsConfig
}

// kvEventsConfig is the part of vLLM's --kv-events-config JSON the gateway
// depends on.
type kvEventsConfig struct {
	Enable         bool    `json:"enable_kv_cache_events"`
	Publisher      string  `json:"publisher"`
	Endpoint       string  `json:"endpoint"`
	ReplayEndpoint *string `json:"replay_endpoint"`
	Topic          string  `json:"topic"`
}

// parseEngineArgs reads the engine's settings from args. Flags must be
// written flag=value, so that each argument stands alone.
func parseEngineArgs(args []string) (engineArgs, error) {
	flags := map[string]string{}
	for _, a := range args {
		if !strings.HasPrefix(a, "-") {
			continue // vLLM's positional model path
		}
		name, value, ok := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !ok {
			if name == "enable-prefix-caching" || name == "enable-prompt-tokens-details" {
				continue
			}
			return engineArgs{}, fmt.Errorf("argument %q: write flags as -flag=value", a)
		}
		flags[name] = value
	}
	e := engineArgs{model: flags["served-model-name"], dpSize: 1}
	if e.model == "" {
		e.model = flags["model"]
	}
	var err error
	if e.port, err = strconv.Atoi(flags["port"]); err != nil {
		return e, fmt.Errorf("port: %w", err)
	}
	if v, ok := flags["data-parallel-size"]; ok {
		if e.dpSize, err = strconv.Atoi(v); err != nil {
			return e, fmt.Errorf("data-parallel-size: %w", err)
		}
	}
	dec := json.NewDecoder(strings.NewReader(flags["kv-events-config"]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e.events); err != nil {
		return e, fmt.Errorf("kv-events-config: %w", err)
	}
	return e, nil
}

// endpointPort returns the port of a ZeroMQ endpoint the engine binds
// (tcp://*:port); vLLM connects instead of binding to a named host.
func endpointPort(endpoint string) (int, error) {
	hostPort, ok := strings.CutPrefix(endpoint, "tcp://")
	host, port, err := net.SplitHostPort(hostPort)
	if !ok || err != nil || host != "*" {
		return 0, fmt.Errorf("endpoint %q: want tcp://*:<port>, which the engine binds and the gateway dials", endpoint)
	}
	return strconv.Atoi(port)
}

// TestSamplesRunEnginesTheGatewayFollows checks each engine Deployment of
// config/samples against the gateway that routes to it, the one installed by
// config/default or the sample's own: its pods are selected by the
// gateway's informer (or by the sample's InferencePool, which makes them
// pods of its target ports), eligible for KV event sync, and the ports the
// gateway dials for every data-parallel rank are the ones
// --kv-events-config binds and the container declares; the model the pods
// serve is the model they are labelled with, and their HTTP port is the one
// the gateway routes to, tokenizes on and scrapes.
func TestSamplesRunEnginesTheGatewayFollows(t *testing.T) {
	dirs, err := filepath.Glob("samples/*/kustomization.yaml")
	if err != nil || len(dirs) == 0 {
		t.Fatalf("no samples: %v", err)
	}
	for _, k := range dirs {
		dir := filepath.Dir(k)
		objs := render(t, dir)
		shipped := "default"
		if hasGateway(objs) {
			shipped = dir
		}
		s := loadSettings(t, shipped)
		kv := s.config.KVSync
		defaults := manager.StreamDefaults{PubPort: kv.PubPort, ReplayPort: kv.ReplayPort, Topic: kv.Topic}
		selector, err := labels.Parse(s.config.Discovery.LabelSelector)
		if err != nil {
			t.Fatal(err)
		}
		pools := inferencePools(t, objs)
		for _, u := range only(objs, "Deployment") {
			if isGateway(u) {
				continue // the sample's gateway: TestInferencePoolSampleWiresThePoolToThePicker
			}
			t.Run(dir+"/"+u.GetName(), func(t *testing.T) {
				d := &appsv1.Deployment{}
				fromUnstructured(t, u, d)
				pod := runningPod(d)
				members := []*corev1.Pod{pod}
				if s.config.Discovery.Mode == config.DiscoveryInferencePool {
					pool := poolSelecting(pools, pod)
					if pool == nil {
						t.Fatalf("no InferencePool of the sample selects pods labelled %v", pod.Labels)
					}
					members = pool.Members(pod, kv.PubPort, kv.ReplayPort)
				} else if !selector.Matches(labels.Set(pod.Labels)) {
					t.Errorf("pod labels %v do not match the gateway's selector %q", pod.Labels, selector)
				}
				for _, m := range members {
					target, reason, err := manager.TargetForPod(m, defaults)
					if reason != "" {
						t.Fatalf("the gateway does not follow the pods: %s %v", reason, err)
					}
					for i := range m.Spec.Containers {
						checkEngine(t, &m.Spec.Containers[i], m, target, s.tokenizerPort)
					}
				}
			})
		}
	}
}

// isGateway reports whether u is the gateway's Deployment.
func isGateway(u *unstructured.Unstructured) bool {
	return u.GetKind() == "Deployment" && u.GetLabels()["app.kubernetes.io/component"] == "gateway"
}

// hasGateway reports whether objs install a gateway of their own.
func hasGateway(objs []*unstructured.Unstructured) bool {
	return slices.ContainsFunc(objs, isGateway)
}

// inferencePools returns the InferencePools of objs, as kvgate reads them.
func inferencePools(t *testing.T, objs []*unstructured.Unstructured) []*discovery.InferencePool {
	t.Helper()
	var out []*discovery.InferencePool
	for _, u := range only(objs, "InferencePool") {
		p := &discovery.InferencePool{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, p); err != nil {
			t.Fatalf("InferencePool %s: %v", u.GetName(), err)
		}
		out = append(out, p)
	}
	return out
}

// poolSelecting returns the pool of pools pod is a member of, nil for none.
func poolSelecting(pools []*discovery.InferencePool, pod *corev1.Pod) *discovery.InferencePool {
	for _, p := range pools {
		if p.Selects(pod) {
			return p
		}
	}
	return nil
}

// checkEngine checks the engine container c of pod against the gateway's
// target for the pod and the port of its tokenizer's endpoint template,
// which a pod's model.aibrix.ai/port overrides.
func checkEngine(t *testing.T, c *corev1.Container, pod *corev1.Pod, target manager.PodTarget, tokenizerPort int) {
	t.Helper()
	e, err := parseEngineArgs(c.Args)
	if err != nil {
		t.Fatalf("container %s: %v", c.Name, err)
	}
	if got := endpoint.Parse(pod, endpoint.Options{}).Model; got != e.model {
		t.Errorf("pods are labelled with model %q, the engine serves %q", got, e.model)
	}
	http := int(port(t, c, "http"))
	serving := endpoint.Parse(pod, endpoint.Options{}).Port
	tokenizing := endpoint.Parse(pod, endpoint.Options{DefaultPort: tokenizerPort}).Port
	if http != e.port || serving != e.port || tokenizing != e.port {
		t.Errorf("engine port %d; container port http %d, gateway routes and scrapes on %d, tokenizes on %d",
			e.port, http, serving, tokenizing)
	}
	ev := e.events
	if !ev.Enable || ev.Publisher != "zmq" || ev.ReplayEndpoint == nil {
		t.Fatalf("--kv-events-config %+v: want enable_kv_cache_events, publisher zmq and a replay_endpoint", ev)
	}
	pub, err := endpointPort(ev.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	replay, err := endpointPort(*ev.ReplayEndpoint)
	if err != nil {
		t.Fatal(err)
	}
	if target.DPSize != e.dpSize || target.PubPort != pub || target.ReplayPort != replay {
		t.Errorf("the gateway dials %d ranks on PUB %d and replay %d; the engine runs %d ranks on PUB %d and replay %d",
			target.DPSize, target.PubPort, target.ReplayPort, e.dpSize, pub, replay)
	}
	if !strings.HasPrefix(ev.Topic, target.Topic) {
		t.Errorf("the gateway subscribes to topic prefix %q, the engine publishes %q", target.Topic, ev.Topic)
	}
	declared := map[int32]bool{}
	for _, p := range c.Ports {
		declared[p.ContainerPort] = true
	}
	for r := range e.dpSize {
		for _, p := range []int{pub + r, replay + r} {
			if !declared[int32(p)] {
				t.Errorf("rank %d's port %d is not among the container's ports", r, p)
			}
		}
	}
	if probe := c.ReadinessProbe; probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Path != "/health" {
		t.Errorf("no readiness probe on /health: the gateway follows and routes to Ready pods only")
	}
}

// runningPod returns a pod of d as the API server reports it once the
// kubelet has started it and its readiness probe passes.
func runningPod(d *appsv1.Deployment) *corev1.Pod {
	tmpl := d.Spec.Template.DeepCopy()
	ns := cmp.Or(d.Namespace, "models")
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: d.Name + "-0", UID: "uid-0",
			Labels: tmpl.Labels, Annotations: tmpl.Annotations},
		Spec: tmpl.Spec,
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning, PodIP: "10.0.0.1",
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
		},
	}
}
