package config

import (
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"
)

// SectionDiscovery is the configuration reference's section on how the
// gateway finds inference pods.
const SectionDiscovery = "Pod discovery"

// KV event streams.
var (
	KVEventsPubPort = Var{
		Name:    "KVGATE_KV_EVENTS_PUB_PORT",
		Default: "5557",
		Section: SectionKVSync,
		Doc: "Port of rank 0's KV-event PUB socket on pods without the kvgate.io/kv-events-pub-port annotation; " +
			"rank r uses port+r.",
	}
	KVEventsReplayPort = Var{
		Name:    "KVGATE_KV_EVENTS_REPLAY_PORT",
		Default: "5558",
		Section: SectionKVSync,
		Doc: "Port of rank 0's replay ROUTER on pods without the kvgate.io/kv-events-replay-port annotation; rank r uses port+r; " +
			"0 disables replay (vLLM's default when replay_endpoint is unset).",
	}
	KVEventsTopic = Var{
		Name:    "KVGATE_KV_EVENTS_TOPIC",
		Default: "",
		Section: SectionKVSync,
		Doc:     "Topic prefix subscribed to on pods without the kvgate.io/kv-events-topic annotation; empty matches every topic (vLLM's default topic is empty).",
	}
	KVEventsBindEndpoint = Var{
		Name:    "KVGATE_KV_EVENTS_BIND_ENDPOINT",
		Default: "",
		Section: SectionKVSync,
		Doc: "When set (e.g. tcp://*:5557), the gateway binds this endpoint for rank 0 (port+r for rank r) and engines dial in, " +
			"publishing with topic kv@<pod-ip>:<port>@<model>, port being the engine's HTTP port (model.aibrix.ai/port); " +
			"when empty, the gateway dials every pod.",
		Flag: "kv-events-bind-endpoint",
	}
	KVEventsBindRanks = Var{
		Name:    "KVGATE_KV_EVENTS_BIND_RANKS",
		Default: "1",
		Section: SectionKVSync,
		Doc:     "In bind mode, how many data-parallel ranks get a bound endpoint: at least the largest kvgate.io/dp-start-rank plus kvgate.io/dp-size of the fleet (the number of target ports of an InferencePool whose members are data-parallel ranks).",
	}
	KVEventsBindAllowAnyPeer = Var{
		Name:    "KVGATE_KV_EVENTS_BIND_ALLOW_ANY_PEER",
		Default: "false",
		Section: SectionKVSync,
		Doc: "In bind mode, accept a message for the engine its topic names from any address. By default only the engine's " +
			"own IP address may speak for it; set this only when engines reach the gateway through address translation, " +
			"which hides their addresses, since anyone who reaches the bound port can then speak for any engine.",
	}
	KVEventsBindLivenessTimeout = Var{
		Name:    "KVGATE_KV_EVENTS_BIND_LIVENESS_TIMEOUT",
		Default: "60",
		Section: SectionKVSync,
		Doc: "In bind mode, how long an engine may go unheard (no batch, and no reply to the replay probes that an idle " +
			"engine answers at least every 30 s) before its stream counts as disconnected, in seconds or with a unit (\"90s\"); " +
			"it must exceed 35 s, the longest a quiet engine goes unheard.",
	}
	KVEventsDeadPodTimeout = Var{
		Name:    "KVGATE_KV_EVENTS_DEAD_POD_TIMEOUT",
		Default: "30",
		Section: SectionKVSync,
		Doc: "How long a followed pod may go with none of its KV event streams connected and no successful metrics scrape " +
			"before it counts as dead, in seconds or with a unit (\"45s\"): its blocks leave the index within this and one " +
			"second, once, and its streams start afresh, so that an engine that comes back is rebuilt from its first batch. " +
			"A stream loses its engine at once when the engine's process ends, within the 15 s heartbeat timeout when the " +
			"engine vanishes from the network, and after KVGATE_KV_EVENTS_BIND_LIVENESS_TIMEOUT in bind mode. Either signal " +
			"alone never purges: a quiet engine still answers its scrapes. It must exceed twice " +
			"AIBRIX_POD_METRIC_REFRESH_INTERVAL_MS plus the 1 s scrape timeout.",
	}
	KVEventsMaxMessageBytes = Var{
		Name:    "KVGATE_KV_EVENTS_MAX_MESSAGE_BYTES",
		Default: "16777216",
		Section: SectionKVSync,
		Doc: "Largest frame (one batch) an engine may send, in bytes; a larger one drops the engine's connection and the batch " +
			"is lost. A vLLM batch for a 128k-token prefill at block size 16 is 0.7 to 1.1 MiB (8192 block hashes and " +
			"131072 token ids), so the default holds a dozen such prefills in one step.",
	}
	KVEventsReceiveBufferBytes = Var{
		Name:    "KVGATE_KV_EVENTS_RECEIVE_BUFFER_BYTES",
		Default: "67108864",
		Section: SectionKVSync,
		Doc: "Per stream, bytes of live batches read and not yet applied to the index, and separately of replayed ones; " +
			"beyond it a live batch is dropped and replayed later, and a replay is cut short and resumed " +
			"(aibrix_kvcache_zmq_limit_hits_total). At least KVGATE_KV_EVENTS_MAX_MESSAGE_BYTES.",
	}
	KVEventsPendingBufferBytes = Var{
		Name:    "KVGATE_KV_EVENTS_PENDING_BUFFER_BYTES",
		Default: "67108864",
		Section: SectionKVSync,
		Doc: "Per stream, bytes of live batches that wait while a gap is replayed (also at most 10000 batches); an overflow " +
			"makes the gap unrecoverable. At least KVGATE_KV_EVENTS_MAX_MESSAGE_BYTES.",
	}
	KVEventsMaxReplayBatches = Var{
		Name:    "KVGATE_KV_EVENTS_MAX_REPLAY_BATCHES",
		Default: "20000",
		Section: SectionKVSync,
		Doc: "Most batches one replay may send, twice vLLM's default buffer_steps; a replay beyond it is cut short and the " +
			"rest replayed again. Raise it with the engines' buffer_steps.",
	}
	KVEventsReadInterval = Var{
		Name:    "KVGATE_KV_EVENTS_READ_INTERVAL",
		Default: "5",
		Section: SectionKVSync,
		Doc: "Least time between two reads of an engine's live batches (a bind mode socket's, in bind mode) while it keeps " +
			"sending, in milliseconds or with a unit (\"2ms\"), at most 1s: a batch that comes sooner after a read waits " +
			"for the rest of the interval and is read with those that came meanwhile, one wake-up of the gateway for " +
			"many; one that comes later is read at once. 0 reads every batch as it comes.",
	}
	KVEventsMaxReplayDuration = Var{
		Name:    "KVGATE_KV_EVENTS_MAX_REPLAY_DURATION",
		Default: "60",
		Section: SectionKVSync,
		Doc: "Longest one replay may run, from its request to its end marker, in seconds or with a unit (\"90s\"); a longer " +
			"one is cut short and what is missing replayed again.",
	}
)

// Pod discovery.
var (
	PodDiscovery = Var{
		Name:    "KVGATE_POD_DISCOVERY",
		Default: "kubernetes",
		Section: SectionDiscovery,
		Doc: "Where inference pods come from: kubernetes (a pod informer), inferencepool (the pods of the Gateway API " +
			"Inference Extension's InferencePools, KVGATE_INFERENCE_POOLS) or static (the endpoints file " +
			"KVGATE_STATIC_ENDPOINTS_FILE, for running without Kubernetes).",
		Flag: "discovery",
	}
	StaticEndpointsFile = Var{
		Name:    "KVGATE_STATIC_ENDPOINTS_FILE",
		Default: "",
		Section: SectionDiscovery,
		Doc:     "YAML file listing the endpoints of static discovery; it is watched and reloaded, and an invalid version keeps the last valid one.",
		Flag:    "static-endpoints-file",
	}
	PodNamespace = Var{
		Name:    "KVGATE_POD_NAMESPACE",
		Default: "",
		Section: SectionDiscovery,
		Doc:     "Namespace whose pods the informer watches; empty watches every namespace.",
		Flag:    "namespace",
	}
	PodLabelSelector = Var{
		Name:    "KVGATE_POD_LABEL_SELECTOR",
		Default: "model.aibrix.ai/name",
		Section: SectionDiscovery,
		Doc:     "Label selector of the pods the informer watches (Kubernetes syntax); the default selects every pod that names its model.",
		Flag:    "label-selector",
	}
	InferencePools = Var{
		Name:    "KVGATE_INFERENCE_POOLS",
		Default: "",
		Section: SectionDiscovery,
		Doc: "inferencepool discovery: the InferencePools (inference.networking.k8s.io/v1) whose pods are the " +
			"candidates, by name, separated by commas, in KVGATE_POD_NAMESPACE; empty follows every pool there. A pool " +
			"may carry the pod labels and annotations kvgate reads (model.aibrix.ai/name, " +
			"model.aibrix.ai/kv-events-enabled, kvgate.io/...) as defaults for its pods. KVGATE_POD_LABEL_SELECTOR " +
			"does not apply.",
		Flag: "inference-pools",
	}
	AdapterRefreshInterval = Var{
		Name:    "KVGATE_ADAPTER_REFRESH_INTERVAL",
		Default: "10",
		Section: SectionDiscovery,
		Doc: "How often each ready pod's GET /v1/models is read to learn the LoRA adapters its engine serves, runtime-loaded " +
			"ones included (vLLM lists them with the base model as parent), in seconds or with a unit (\"500ms\"). " +
			"They add to the adapters a pod declares in its kvgate.io/lora-adapters annotation (loraAdapters in the " +
			"endpoints file). The same listing gives the model cards (root, parent, max_model_len) the gateway's own " +
			"GET /v1/models shows. 0 turns the listing off: the gateway then lists each model with its name as root " +
			"and no max_model_len.",
	}
	MaxAdaptersPerPod = Var{
		Name:    "KVGATE_MAX_ADAPTERS_PER_POD",
		Default: "256",
		Section: SectionDiscovery,
		Doc: "Most LoRA adapters taken from one pod's GET /v1/models, each a model routed to with state of its own in " +
			"the gateway. vLLM lists every adapter it was started with (--lora-modules) or loaded at runtime, whatever " +
			"--max-loras and --max-cpu-loras; those beyond this are not routed to the pod, and are counted in " +
			"kvgate_cache_pod_adapters_dropped_total and logged. Adapters a pod declares do not count.",
	}
)

// Discovery modes of PodDiscovery.
const (
	DiscoveryKubernetes    = "kubernetes"
	DiscoveryInferencePool = "inferencepool"
	DiscoveryStatic        = "static"
)

// KVSync is the configuration of KV event sync and of the prefix index it
// feeds.
type KVSync struct {
	// Enabled turns KV event sync on (KVEventSyncEnabled).
	Enabled bool
	// PubPort, ReplayPort and Topic are the stream settings of pods that
	// do not override them.
	PubPort    int
	ReplayPort int
	Topic      string
	// BindEndpoint, when set, selects bind mode with BindRanks ranks;
	// BindAllowAnyPeer and BindLivenessTimeout configure it.
	BindEndpoint        string
	BindRanks           int
	BindAllowAnyPeer    bool
	BindLivenessTimeout time.Duration
	// DeadPodTimeout is how long a pod's streams and scrapes must both
	// have stopped before it counts as dead.
	DeadPodTimeout time.Duration
	// MaxMessageBytes, ReceiveBufferBytes, PendingBufferBytes,
	// MaxReplayBatches and MaxReplayDuration bound what a stream takes
	// from its engine.
	MaxMessageBytes    int
	ReceiveBufferBytes int
	PendingBufferBytes int
	MaxReplayBatches   int
	MaxReplayDuration  time.Duration
	// ReadInterval spaces the reads of a busy engine's batches (0: the
	// transport's default; negative: each as it comes).
	ReadInterval time.Duration
	// Index settings (AIBRIX_SYNC_*, KVGATE_SYNC_MAX_PREFIXES).
	MaxContexts           int
	MaxPrefixesPerContext int
	MaxPrefixes           int
	EvictionInterval      time.Duration
	EvictionDuration      time.Duration
}

// maxReadInterval is the longest KVEventsReadInterval: the transport's
// bound.
const maxReadInterval = time.Second

// LoadKVSync reads the KV event sync settings from e, recording malformed
// values and impossible combinations in e: KV sync without the remote
// tokenizer (the index is keyed by the engine's tokens, so routing could
// never match it), a bind endpoint that is not a ZeroMQ tcp endpoint, or a
// buffer smaller than the largest batch it must hold.
func LoadKVSync(e *Env) KVSync {
	k := KVSync{
		Enabled:               e.Bool(KVEventSyncEnabled),
		PubPort:               e.Int(KVEventsPubPort, 1),
		ReplayPort:            e.Int(KVEventsReplayPort, 0),
		Topic:                 e.String(KVEventsTopic),
		BindEndpoint:          e.String(KVEventsBindEndpoint),
		BindRanks:             e.Int(KVEventsBindRanks, 1),
		BindAllowAnyPeer:      e.Bool(KVEventsBindAllowAnyPeer),
		BindLivenessTimeout:   e.Duration(KVEventsBindLivenessTimeout, time.Second),
		DeadPodTimeout:        e.Duration(KVEventsDeadPodTimeout, time.Second),
		MaxMessageBytes:       e.Int(KVEventsMaxMessageBytes, 1),
		ReceiveBufferBytes:    e.Int(KVEventsReceiveBufferBytes, 1),
		PendingBufferBytes:    e.Int(KVEventsPendingBufferBytes, 1),
		MaxReplayBatches:      e.Int(KVEventsMaxReplayBatches, 1),
		MaxReplayDuration:     e.Duration(KVEventsMaxReplayDuration, time.Second),
		ReadInterval:          e.DurationOrZero(KVEventsReadInterval, time.Millisecond),
		MaxContexts:           e.Int(SyncMaxContexts, 1),
		MaxPrefixesPerContext: e.Int(SyncMaxPrefixesPerContext, 1),
		MaxPrefixes:           e.Int(SyncMaxPrefixes, 1),
		EvictionInterval:      e.Duration(SyncEvictionInterval, time.Second),
		EvictionDuration:      e.Duration(SyncEvictionDuration, time.Minute),
	}
	remote := e.Bool(UseRemoteTokenizer)
	if k.Enabled && !remote {
		e.Errorf("%s is true but %s is false: the prefix index holds the engines' token ids, so KV event sync "+
			"needs the engines' own tokenizer; enable the remote tokenizer or disable KV event sync",
			KVEventSyncEnabled.Name, UseRemoteTokenizer.Name)
	}
	for _, p := range []struct {
		v    Var
		port int
	}{{KVEventsPubPort, k.PubPort}, {KVEventsReplayPort, k.ReplayPort}} {
		if p.port > 65535 {
			e.Errorf("%s=%d: want a port up to 65535", p.v.Name, p.port)
		}
	}
	for _, b := range []struct {
		v     Var
		bytes int
	}{{KVEventsReceiveBufferBytes, k.ReceiveBufferBytes}, {KVEventsPendingBufferBytes, k.PendingBufferBytes}} {
		if b.bytes < k.MaxMessageBytes {
			e.Errorf("%s=%d is below %s=%d: the buffer must hold the largest batch", b.v.Name, b.bytes,
				KVEventsMaxMessageBytes.Name, k.MaxMessageBytes)
		}
	}
	if k.ReadInterval == 0 {
		k.ReadInterval = -1
	}
	if k.ReadInterval > maxReadInterval {
		e.Errorf("%s=%v: want at most %v, or the index would lag that far behind the engines", KVEventsReadInterval.Name,
			k.ReadInterval, maxReadInterval)
	}
	if k.BindEndpoint != "" && !strings.HasPrefix(k.BindEndpoint, "tcp://") {
		e.Errorf("%s=%q: want a tcp:// endpoint such as tcp://*:5557", KVEventsBindEndpoint.Name, k.BindEndpoint)
	}
	return k
}

// Discovery is where the gateway finds inference pods.
type Discovery struct {
	// Mode is DiscoveryKubernetes or DiscoveryStatic.
	Mode string
	// StaticFile is the endpoints file of static discovery.
	StaticFile string
	// Namespace and LabelSelector scope the Kubernetes informer.
	Namespace     string
	LabelSelector string
	// Pools names the InferencePools of inferencepool discovery, every
	// pool of Namespace when empty.
	Pools []string
}

// LoadDiscovery reads the discovery settings from e, recording an unknown
// mode, or static discovery without a file, in e.
func LoadDiscovery(e *Env) Discovery {
	d := Discovery{
		Mode:          strings.ToLower(e.String(PodDiscovery)),
		StaticFile:    e.String(StaticEndpointsFile),
		Namespace:     e.String(PodNamespace),
		LabelSelector: e.String(PodLabelSelector),
	}
	pools := e.String(InferencePools)
	switch d.Mode {
	case DiscoveryKubernetes:
		if _, err := labels.Parse(d.LabelSelector); err != nil {
			e.Errorf("%s=%q: %v", PodLabelSelector.Name, d.LabelSelector, err)
		}
	case DiscoveryInferencePool:
		for name := range strings.SplitSeq(pools, ",") {
			if name = strings.TrimSpace(name); name != "" {
				d.Pools = append(d.Pools, name)
			}
		}
	case DiscoveryStatic:
		if d.StaticFile == "" {
			e.Errorf("%s=%s needs %s", PodDiscovery.Name, DiscoveryStatic, StaticEndpointsFile.Name)
		}
	default:
		e.Errorf("%s=%q: want %s, %s or %s", PodDiscovery.Name, d.Mode, DiscoveryKubernetes, DiscoveryInferencePool, DiscoveryStatic)
	}
	return d
}

// String describes the discovery for logs.
func (d Discovery) String() string {
	if d.Mode == DiscoveryStatic {
		return fmt.Sprintf("static endpoints file %s", d.StaticFile)
	}
	ns := d.Namespace
	if ns == "" {
		ns = "all namespaces"
	}
	if d.Mode == DiscoveryInferencePool {
		if len(d.Pools) == 0 {
			return fmt.Sprintf("the pods of every InferencePool in %s", ns)
		}
		return fmt.Sprintf("the pods of the InferencePools %s in %s", strings.Join(d.Pools, ", "), ns)
	}
	return fmt.Sprintf("kubernetes pods in %s matching %q", ns, d.LabelSelector)
}
