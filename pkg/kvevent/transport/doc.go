// Package transport follows vLLM engines' KV-event streams over ZeroMQ and
// hands each stream's batches to a kvevent handler exactly once each, in
// seq order, or tells the handler why it cannot.
//
// A stream can be followed two ways, which share everything but the socket
// the live messages arrive on:
//
//   - ZMQClient dials one engine: a SUB socket on its PUB endpoint, a
//     DEALER on its replay ROUTER and a socket monitor for the connection
//     state, owned by one goroutine per client.
//   - BindReceiver binds one SUB socket per data-parallel rank that engines
//     dial into, publishing with topic kv@<ip>:<port>@<model>, and follows
//     every stream registered with Follow from one goroutine, which owns
//     the bound sockets and every stream's replay DEALER.
//
// Either way one goroutine owns a stream and the sockets it is fed from: a
// client hands its stream to its goroutine on Start and takes it back on
// Stop, and a receiver's streams live in its goroutine alone. Everything
// else reaches a stream through commands (Reconnect, ReplayFrom, Follow,
// Unfollow) or reads what its observer recorded (Stats, GetStats,
// WaitForConnection).
//
// # How a stream is kept exact
//
//   - After every connection and reconnection the stream is replayed from
//     the last delivered seq (from 0 the first time), because the PUB dropped
//     what it sent before the subscription arrived and an idle engine would
//     not reveal the gap. Live batches received meanwhile wait in a bounded
//     buffer and are applied after the replay, without duplicates. A bound
//     stream counts as connected when its engine's first message arrives.
//   - A gap shows only when a later batch arrives, so the stream is also
//     replayed whenever it has been quiet for a while (1 s doubling to 30 s
//     while it stays quiet, by default). This recovers batches lost just
//     before the engine went idle: dropped at a high-water mark, or sent
//     before the subscription reached the engine.
//   - A live seq above the expected one is a gap: the live batches wait while
//     the missing range is replayed, then everything is applied in order. A
//     replay whose replies leave a hole is followed up a few times.
//   - A replay that starts later than asked (the engine's buffer no longer
//     reaches back), a replay that is unavailable (vLLM's replay endpoint is
//     off by default) or times out, and a full pending buffer end in a
//     kvevent.StreamReset with reason kvevent.ResetUnrecoverableGap naming
//     the lost seqs; the stream goes on from the first batch still
//     available. After a failed replay, further gap replays back off (1 s
//     doubling to 30 s by default), and the replay socket is replaced so a
//     late reply cannot be taken for the answer to a new request.
//   - Replays are anchored: they start at the last delivered batch, whose
//     payload must come back unchanged. A live seq that does not increase, a
//     changed anchor, or an engine that no longer has the anchor at all means
//     the engine restarted: the handler gets a kvevent.StreamReset with
//     reason kvevent.ResetPublisherRestart and the stream is rebuilt from seq
//     0. (Without replay, only a seq going back reveals a restart.)
//   - A batch that does not decode is counted, logged with its seq, and
//     dropped; its seq still counts as delivered and the stream goes on.
//   - The replay ROUTER ignores topics, so a subscription whose topic is not
//     a prefix of the engine's loses every live message and still receives
//     every batch, through the quiet-stream replays, seconds late. When three
//     replays in a row deliver batches without one live message in between,
//     and the topic frame of the replies (vLLM v0.26 and later) does not
//     start with the subscribed topic or is absent, the stream logs an error
//     once with both topics and sets ClientStats.TopicMismatch and
//     aibrix_kvcache_zmq_topic_mismatch until a live message arrives.
//
// ZMTP heartbeats reveal an engine that died or became unreachable while
// silent, a socket monitor keeps a dialled stream's connection state
// (GetStats, Stats, WaitForConnection, metrics) true, and libzmq redials
// with a backoff of 1 s doubling to 30 s by default.
//
// # Statistics, metrics and logs
//
// Every event of a stream (a connection, a replay, a batch, a reset, an
// error) is recorded once, by the stream's observer, into its Prometheus
// metrics (aibrix_kvcache_zmq_*, labelled pod_key and dp_rank, when
// ZMQClientConfig.Metrics is set) and then its statistics (ClientStats),
// and logged through the logr logger of ZMQClientConfig.Logger with the
// stream's pod, model and rank: errors always, connection changes, resets
// and topic mismatches at verbosity 0, dialling, redials and replay
// requests at 4, every delivered batch at 5. Nothing is formatted for a
// verbosity that is off.
//
// # vLLM versions
//
// Replay replies are understood in both layouts vLLM has used: since v0.26
// ["", topic, seq, payload] ending with ["", "", 0xffffffffffffffff, ""],
// and before ["", seq, payload] ending with ["", 0xffffffffffffffff, ""]; an
// empty payload also ends a replay. Payloads are decoded by
// kvevent.DecodeEventBatch, which accepts every envelope and event layout
// from v0.9 on.
package transport
