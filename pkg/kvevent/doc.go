// Package kvevent turns vLLM's KV-cache event stream into typed events.
//
// # The stream
//
// A vLLM engine (one per data-parallel rank) publishes its KV-cache events on
// a ZeroMQ PUB socket, port 5557+rank by convention, as messages of three
// frames: a topic, an 8-byte big-endian seq that counts batches from 0, and
// a msgpack EventBatch. It keeps its latest batches (buffer_steps, 10000 by
// default) for a replay ROUTER, port 5558+rank, which a DEALER asks with
// ["", start seq] and which answers every buffered batch from that seq on,
// then an end marker. The PUB drops whatever it sends while nobody is
// subscribed or while a subscriber's queue is full, an idle engine sends
// nothing, and a restarted engine counts from 0 again without any epoch.
//
// ZMQClient follows one such stream and Publisher produces one exactly as
// vLLM does (for tests, simulators and demos).
//
// # How a ZMQClient keeps a stream exact
//
// The client delivers every batch exactly once and in seq order, or tells
// the handler why it cannot:
//
//   - After every connection and reconnection it replays from the last
//     delivered seq (from 0 the first time), because the PUB dropped what it
//     sent before the subscription arrived and an idle engine would not
//     reveal the gap. Live batches received meanwhile wait in a bounded
//     buffer and are applied after the replay, without duplicates.
//   - A gap shows only when a later batch arrives, so the client also
//     replays whenever the live stream has been quiet for a while (1 s
//     doubling to 30 s while it stays quiet, by default). This recovers
//     batches lost just before the engine went idle: dropped at a
//     high-water mark, or sent before the subscription reached the engine.
//   - A live seq above the expected one is a gap: the live batches wait while
//     the missing range is replayed, then everything is applied in order. A
//     replay whose replies leave a hole is followed up a few times.
//   - A replay that starts later than asked (the engine's buffer no longer
//     reaches back), a replay that is unavailable (vLLM's replay endpoint is
//     off by default) or times out, and a full pending buffer end in a
//     StreamReset with reason ResetUnrecoverableGap naming the lost seqs; the
//     stream goes on from the first batch still available. After a failed
//     replay, further gap replays back off (1 s doubling to 30 s by
//     default), and the replay socket is replaced so a late reply cannot be
//     taken for the answer to a new request.
//   - Replays are anchored: they start at the last delivered batch, whose
//     payload must come back unchanged. A live seq that does not increase, a
//     changed anchor, or an engine that no longer has the anchor at all means
//     the engine restarted: the handler gets a StreamReset with reason
//     ResetPublisherRestart and the stream is rebuilt from seq 0. (Without
//     replay, only a seq going back reveals a restart.)
//   - A batch that does not decode is counted, logged with its seq, and
//     dropped; its seq still counts as delivered and the stream goes on.
//   - The replay ROUTER ignores topics, so a subscription whose topic is not
//     a prefix of the engine's loses every live message and still receives
//     every batch, through the quiet-stream replays, seconds late. When three
//     replays in a row deliver batches without one live message in between,
//     and the topic frame of the replies (vLLM v0.26 and later) does not
//     start with the subscribed topic or is absent, the client logs an error
//     once with both topics and sets ClientStats.TopicMismatch and
//     aibrix_kvcache_zmq_topic_mismatch until a live message arrives.
//
// ZMTP heartbeats reveal an engine that died or became unreachable while
// silent, a socket monitor keeps the connection state (GetStats, Stats,
// WaitForConnection, metrics) true, and libzmq redials with a backoff of
// 1 s doubling to 30 s by default.
//
// # What a handler sees
//
// A handler implements EventHandler and receives each event in order; one
// that also implements BatchHandler receives each batch in one call
// instead, with its seq. One that implements ResetHandler is told, before
// the next batch, when its view of the stream stops being exact: publisher
// restart (drop everything known about the stream), unrecoverable gap
// (state is incomplete), or a rewind requested with ZMQClient.ReplayFrom.
// The client calls the handler from one goroutine, never concurrently.
// Handler errors are counted and logged and never stop the stream.
//
// # Following a fleet
//
// KVEventManager follows every eligible pod with one ZMQClient per
// data-parallel rank and delivers to a KVIndex. It is told about pods by
// the cache Store (OnPodAdd, OnPodUpdate, OnPodDelete) and reconciles them
// like a Kubernetes controller. A pod is followed when it is Running, not
// terminating, Ready, has an IP, and carries (as a label, or else an
// annotation):
//
//	model.aibrix.ai/kv-events-enabled: "true"   required
//	model.aibrix.ai/name: <model>                required
//	model.aibrix.ai/lora-id: <id>                optional, part of the stream identity
//	kvgate.io/kv-events-pub-port: "5557"         rank 0's PUB port, rank r uses +r
//	kvgate.io/kv-events-replay-port: "5558"      rank 0's replay port, "0" = no replay
//	kvgate.io/kv-events-topic: ""                SUB topic prefix
//	kvgate.io/dp-size: "1"                       data-parallel ranks, one stream each
//
// Ports and topic default to the manager's StreamDefaults. With several
// ranks the PUB and replay port ranges must not overlap, which rules out
// 5557/5558. Pods that are not followed are counted by reason in
// kvgate_kv_event_ineligible_pods. In bind mode (BindConfig) engines dial
// into the gateway instead.
//
// # vLLM versions
//
// Replay replies are understood in both layouts vLLM has used: since v0.26
// ["", topic, seq, payload] ending with ["", "", 0xffffffffffffffff, ""],
// and before ["", seq, payload] ending with ["", 0xffffffffffffffff, ""]; an
// empty payload also ends a replay. Publisher answers in either layout
// (ReplayLayout). Payloads are decoded by DecodeEventBatch, which accepts
// every envelope and event layout from v0.9 on.
package kvevent
