package discovery

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	"github.com/kvgate/kvgate/pkg/cache"
	"github.com/kvgate/kvgate/pkg/endpoint"
)

// StaticNamespace is the namespace of the pods StaticSource synthesizes.
const StaticNamespace = "static"

// DefaultStaticPollInterval is how often StaticSource checks its file.
const DefaultStaticPollInterval = time.Second

// StaticFile is the format of the endpoints file:
//
//	endpoints:
//	- name: vllm-0            # pod name in namespace "static"; required, unique
//	  address: 10.0.0.5       # IP or host name of the engine; required
//	  model: llama-3-8b       # base model; required
//	  port: 8000              # HTTP port (OpenAI API, /metrics); default 8000
//	  kvEvents: true          # follow its KV events; default true
//	  pubPort: 5557           # rank 0's PUB port; default: the gateway's
//	  replayPort: 5558        # rank 0's replay port, 0 = no replay; default: the gateway's
//	  topic: ""               # topic prefix; default: the gateway's
//	  dpSize: 1               # data-parallel ranks; default 1
//	  loraID: ""              # model.aibrix.ai/lora-id; default none
//	  loraAdapters: []        # LoRA adapters served besides the model; default none
//
// The fields map to the labels and annotations of a Kubernetes pod (see
// packages kvevent and cache), so that a static endpoint and a pod are
// configured alike. loraAdapters need list only the adapters that must be
// routable before the gateway first reads the engine's /v1/models: the
// adapters the engine lists there, runtime-loaded ones included, are
// served too.
type StaticFile struct {
	Endpoints []StaticEndpoint `json:"endpoints"`
}

// StaticEndpoint is one engine of a StaticFile. Optional fields left out
// take the gateway's defaults, as an annotation left off a pod does.
type StaticEndpoint struct {
	Name       string  `json:"name"`
	Address    string  `json:"address"`
	Model      string  `json:"model"`
	Port       int     `json:"port,omitempty"`
	KVEvents   *bool   `json:"kvEvents,omitempty"`
	PubPort    *int    `json:"pubPort,omitempty"`
	ReplayPort *int    `json:"replayPort,omitempty"`
	Topic      *string `json:"topic,omitempty"`
	DPSize     int     `json:"dpSize,omitempty"`
	LoraID     string  `json:"loraID,omitempty"`
	// LoraAdapters names the LoRA adapters the engine serves on top of
	// Model, as requests name them.
	LoraAdapters []string `json:"loraAdapters,omitempty"`
}

// ParseStaticFile decodes and validates an endpoints file. Unknown fields,
// missing or duplicate names, missing addresses or models, out-of-range
// ports or DP sizes, and adapter names that are empty, repeated, hold a
// comma or name the base model are errors naming the endpoint.
func ParseStaticFile(data []byte) (*StaticFile, error) {
	var f StaticFile
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return nil, fmt.Errorf("parse endpoints: %w", err)
	}
	seen := map[string]bool{}
	var errs []error
	for i, e := range f.Endpoints {
		if err := e.validate(); err != nil {
			errs = append(errs, fmt.Errorf("endpoint %d (%q): %w", i, e.Name, err))
		}
		if seen[e.Name] {
			errs = append(errs, fmt.Errorf("endpoint %d: name %q is used twice", i, e.Name))
		}
		seen[e.Name] = true
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &f, nil
}

func (e *StaticEndpoint) validate() error {
	var errs []error
	if msgs := validation.IsDNS1123Subdomain(e.Name); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("name %q: %v", e.Name, msgs))
	}
	if net.ParseIP(e.Address) == nil && len(validation.IsDNS1123Subdomain(e.Address)) > 0 {
		errs = append(errs, fmt.Errorf("address %q is neither an IP address nor a host name", e.Address))
	}
	if e.Model == "" {
		errs = append(errs, errors.New("model is empty"))
	}
	port := func(name string, p *int, lo int) {
		if p != nil && (*p < lo || *p > 65535) {
			errs = append(errs, fmt.Errorf("%s %d is not a port", name, *p))
		}
	}
	port("port", &e.Port, 0)
	port("pubPort", e.PubPort, 1)
	port("replayPort", e.ReplayPort, 0)
	if e.DPSize < 0 || e.DPSize > endpoint.MaxDPSize {
		errs = append(errs, fmt.Errorf("dpSize %d must be from 1 to %d", e.DPSize, endpoint.MaxDPSize))
	}
	for i, a := range e.LoraAdapters {
		switch {
		case strings.TrimSpace(a) == "" || strings.Contains(a, ","):
			errs = append(errs, fmt.Errorf("loraAdapters[%d] %q: an adapter name must be non-empty and hold no comma", i, a))
		case a == e.Model:
			errs = append(errs, fmt.Errorf("loraAdapters[%d] %q is the base model", i, a))
		case slices.Contains(e.LoraAdapters[:i], a):
			errs = append(errs, fmt.Errorf("loraAdapters[%d] %q is listed twice", i, a))
		}
	}
	return errors.Join(errs...)
}

// Pod returns the pod that stands for the endpoint: namespace
// StaticNamespace, Running and Ready at the endpoint's address, labelled and
// annotated with its model, ports, topic, DP size, LoRA id and adapters. Its
// UID is derived from the name, so that a pod keeps its identity across
// reloads.
func (e *StaticEndpoint) Pod() *v1.Pod {
	port := e.Port
	if port == 0 {
		port = endpoint.DefaultEnginePort
	}
	labels := map[string]string{endpoint.ModelNameLabel: e.Model, endpoint.ModelPortLabel: strconv.Itoa(port)}
	if e.KVEvents == nil || *e.KVEvents {
		labels[endpoint.KVEventsEnabledLabel] = "true"
	}
	if e.LoraID != "" {
		labels[endpoint.LoraIDLabel] = e.LoraID
	}
	ann := map[string]string{}
	if e.PubPort != nil {
		ann[endpoint.PubPortAnnotation] = strconv.Itoa(*e.PubPort)
	}
	if e.ReplayPort != nil {
		ann[endpoint.ReplayPortAnnotation] = strconv.Itoa(*e.ReplayPort)
	}
	if e.Topic != nil {
		ann[endpoint.TopicAnnotation] = *e.Topic
	}
	if e.DPSize > 0 {
		ann[endpoint.DPSizeAnnotation] = strconv.Itoa(e.DPSize)
	}
	if len(e.LoraAdapters) > 0 {
		ann[endpoint.LoraAdaptersAnnotation] = strings.Join(e.LoraAdapters, ",")
	}
	uid := sha256.Sum256([]byte(StaticNamespace + "/" + e.Name))
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: StaticNamespace, Name: e.Name,
			UID: types.UID(hex.EncodeToString(uid[:16])), Labels: labels, Annotations: ann},
		Status: v1.PodStatus{Phase: v1.PodRunning, PodIP: e.Address, PodIPs: []v1.PodIP{{IP: e.Address}},
			Conditions: []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue}}},
	}
}

// StaticSource discovers the endpoints of a StaticFile.
type StaticSource struct {
	// Path is the endpoints file.
	Path string
	// PollInterval is how often the file is read to notice changes
	// (DefaultStaticPollInterval when 0). Reading and comparing the whole
	// file, rather than watching for events, also catches ConfigMap
	// volumes (which swap a symlink) and editors that replace the file.
	PollInterval time.Duration
	// Logger receives the source's logs (klog's global logger when zero).
	Logger klog.Logger
}

var _ cache.PodSource = (*StaticSource)(nil)

// Run delivers the file's endpoints to sink as pods, calls synced, then
// rereads the file every PollInterval until ctx is cancelled: endpoints
// added or changed are added or updated, endpoints removed are deleted. A
// version of the file that cannot be read or is invalid is logged as an
// error and ignored, keeping the last valid set. Run fails only when the
// first read fails; config is not used.
func (s *StaticSource) Run(ctx context.Context, _ *rest.Config, sink cache.PodSink, synced func()) error {
	log := s.Logger
	if log.GetSink() == nil {
		log = klog.Background()
	}
	log = log.WithName("static-endpoints").WithValues("file", s.Path)
	interval := s.PollInterval
	if interval <= 0 {
		interval = DefaultStaticPollInterval
	}
	data, err := os.ReadFile(s.Path)
	if err != nil {
		return fmt.Errorf("static endpoints: %w", err)
	}
	f, err := ParseStaticFile(data)
	if err != nil {
		return fmt.Errorf("static endpoints %s: %w", s.Path, err)
	}
	current := map[string]StaticEndpoint{}
	apply(f, current, sink)
	log.Info("Loaded static endpoints", "endpoints", len(current))
	synced()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		next, err := os.ReadFile(s.Path)
		if err != nil {
			if data != nil {
				log.Error(err, "Cannot read the endpoints file; the previous endpoints stay in use")
			}
			data = nil
			continue
		}
		if bytes.Equal(next, data) {
			continue
		}
		data = next
		f, err := ParseStaticFile(next)
		if err != nil {
			log.Error(err, "Ignoring the new version of the endpoints file; the previous endpoints stay in use")
			continue
		}
		added, changed, removed := apply(f, current, sink)
		log.Info("Reloaded static endpoints", "endpoints", len(current), "added", added, "changed", changed, "removed", removed)
	}
}

// apply makes sink's static pods those of f, updating current.
func apply(f *StaticFile, current map[string]StaticEndpoint, sink cache.PodSink) (added, changed, removed int) {
	next := make(map[string]bool, len(f.Endpoints))
	for _, e := range f.Endpoints {
		next[e.Name] = true
		old, ok := current[e.Name]
		switch {
		case !ok:
			added++
		case !sameEndpoint(old, e):
			changed++
		default:
			continue
		}
		current[e.Name] = e
		sink.AddOrUpdatePod(e.Pod())
	}
	for name := range current {
		if !next[name] {
			delete(current, name)
			sink.DeletePod(endpoint.Key{Namespace: StaticNamespace, Name: name})
			removed++
		}
	}
	return added, changed, removed
}

func sameEndpoint(a, b StaticEndpoint) bool {
	pa, pb := a.Pod(), b.Pod()
	return pa.Status.PodIP == pb.Status.PodIP && maps.Equal(pa.Labels, pb.Labels) && maps.Equal(pa.Annotations, pb.Annotations)
}
