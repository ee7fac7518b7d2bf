// Package manager follows the KV-event streams of every eligible vLLM pod
// of a fleet into a kvevent.KVIndex.
//
// KVEventManager follows each eligible pod with one stream per
// data-parallel rank (a transport.ZMQClient dialling the pod, or in bind
// mode a stream of one transport.BindReceiver) and delivers to a kvevent.KVIndex.
// It is told about pods (OnPodAdd, OnPodUpdate, OnPodDelete) and reconciles
// them like a Kubernetes controller. A pod is followed when it is Running,
// not terminating, Ready, has an IP, and carries (as a label, or else an
// annotation):
//
//	model.aibrix.ai/kv-events-enabled: "true"   required
//	model.aibrix.ai/name: <model>                required
//	model.aibrix.ai/lora-id: <id>                optional, part of the stream identity
//	kvgate.io/kv-events-pub-port: "5557"         rank 0's PUB port, rank r uses +r
//	kvgate.io/kv-events-replay-port: "5558"      rank 0's replay port, "0" = no replay
//	kvgate.io/kv-events-topic: ""                SUB topic prefix
//	kvgate.io/dp-size: "1"                       data-parallel ranks, one stream each
//	kvgate.io/dp-start-rank: "0"                 the first of them (vLLM's --data-parallel-start-rank)
//
// Ports and topic default to the manager's StreamDefaults. With several
// ranks the PUB and replay port ranges must not overlap, which rules out
// 5557/5558. A followed pod whose Ready condition turns false stays followed:
// a failed readiness probe takes it out of routing, not its engine's KV
// cache out of the index. Pods that are not followed are counted by reason in
// kvgate_kv_event_ineligible_pods. In bind mode (ManagerConfig.Bind)
// engines dial into the gateway instead.
//
// A followed pod none of whose streams has been connected, and whose
// metrics scrapes (ManagerConfig.LastScraped) have all failed, for
// ManagerConfig.DeadPodTimeout is dead: it is purged from the index once,
// counted in kvgate_kv_event_pod_purges_total{reason="dead"}, and followed
// by fresh streams that rebuild it from its engine's first batch when the
// engine comes back. Either signal alone keeps its blocks.
package manager
