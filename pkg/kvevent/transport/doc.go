// Package transport follows vLLM engines' KV-event streams over ZeroMQ and
// hands each stream's batches to a kvevent handler exactly once each, in
// seq order, or tells the handler why it cannot.
//
// A stream can be followed two ways, which share everything but the socket
// the live messages arrive on:
//
//   - ZMQClient dials one engine: a SUB socket on its PUB endpoint, a
//     DEALER on its replay ROUTER and a socket monitor for the connection
//     state, owned by one goroutine per client, which reads a busy
//     engine's batches a few at a time (ZMQClientConfig.ReadInterval).
//   - BindReceiver binds one SUB socket per data-parallel rank that engines
//     dial into, publishing with topic kv@<ip>:<port>@<model> (their own
//     address, HTTP port and model: the whole identity names a stream, and
//     by default only a message from that address may speak for it), and
//     follows every stream registered with Follow from one goroutine, which
//     owns the bound sockets and every stream's replay DEALERs, and which
//     reads a busy fleet's batches a group at a time
//     (BindConfig.ReadInterval). A bound stream counts as connected from
//     its engine's first message until it has not heard from its engine,
//     live or through replay, for BindConfig.LivenessTimeout.
//     ClientStats.DisconnectedSince says, for either kind, since when a
//     stream has been without its engine.
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
//   - A stream begins with the first batch it delivers. On first contact,
//     and after its engine restarted, a replay that starts later than
//     asked, or no replay at all, only moves that start: an engine that
//     counts from 1, or whose buffer no longer reaches back to 0 when the
//     gateway starts, is joined where it is (logged, and recorded in
//     ClientStats.JoinedAtSeq), since nothing was delivered that the
//     missing batches could make inexact.
//   - Once a batch was delivered, a replay that starts later than asked
//     (the engine's buffer no longer reaches back), a replay that is
//     unavailable (vLLM's replay endpoint is off by default) or times out,
//     and a full pending buffer end in a kvevent.StreamReset with reason
//     kvevent.ResetUnrecoverableGap naming the lost seqs; the stream goes
//     on from the first batch still available. After a failed replay,
//     further gap replays back off (1 s doubling to 30 s by default).
//   - Each replay has a DEALER socket of its own, opened for the request and
//     closed at its end marker: vLLM's ROUTER carries no request id, so
//     this is what ties replies to their request. Whatever an engine sends
//     after an end marker (a second marker, a batch numbered like one) or
//     for an abandoned replay is dropped with the socket and never taken
//     for the answer to a later request.
//   - A replay that answers but stops before its end marker, runs past
//     MaxReplayDuration or sends more than MaxReplayBatches replies is cut
//     short: what it delivered stands and the rest is replayed again. A
//     replay whose replies leave a hole is followed up; three follow-ups in
//     a row that deliver nothing declare the hole lost.
//   - Replays are anchored: they start at the last delivered batch, whose
//     payload must come back unchanged. A live seq that does not increase, a
//     changed anchor, or an engine whose replay holds neither the anchor nor
//     anything after it means the engine restarted: the handler gets a
//     kvevent.StreamReset with reason kvevent.ResetPublisherRestart and the
//     stream is rebuilt from seq 0. A replay that begins past the anchor is
//     taken for the same engine, whose buffer no longer holds the anchor: it
//     continues the stream when it begins with the next seq, and declares
//     the seqs in between lost otherwise. An engine that restarted while
//     the stream was away, and published past the anchor's seq before the
//     replay, is then taken for the same one. (Without replay, only a seq
//     going back reveals a restart.)
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
// with a backoff of 1 s doubling to 30 s by default. ZeroMQ does not redial
// a connection it dropped for a protocol error (a frame above
// MaxMessageBytes); the client rebuilds its sockets when no redial starts
// within ReconnectDelay + ConnectTimeout + 1 s.
//
// # Bounds
//
// Whatever an engine sends, a stream holds a bounded amount of it, and
// counts every bound it hits (ClientStats, and
// aibrix_kvcache_zmq_limit_hits_total by limit):
//
//   - One frame is at most MaxMessageBytes (16 MiB by default, sized from a
//     128k-token prefill, see DefaultMaxMessageBytes): ZeroMQ drops the
//     connection of an engine that sends a larger one, and the batch is
//     lost.
//   - A message keeps at most the frames vLLM sends (3 live, 4 in a
//     replay reply) once read: the frames of a longer one beyond those are
//     read and dropped one by one, and the message is dropped as malformed.
//   - A batch decodes to at most 16 bytes per payload byte, plus 64 KiB
//     (256 MiB for a frame of 16 MiB; see kvevent.DecodeEventBatchStats).
//     vLLM's batches need 2 to 15; one that would need more is dropped as
//     a decode error (decoded_batch), and the stream goes on with the next.
//   - A stream reads its sockets as soon as they are readable and applies
//     what it read in slices of a few milliseconds, so that ZeroMQ's
//     queues stay short; what it has read and not applied is bounded by
//     ReceiveBufferBytes (64 MiB), for live messages and for replay replies
//     each. A live message beyond it is dropped and replayed later (limit
//     receive_buffer); a replay beyond it is cut short (replay_buffer). A
//     dialled engine that sends a second buffer's worth while the first is
//     full is disconnected, and redialled after ReconnectDelay, doubling up
//     to MaxReconnectDelay while it keeps flooding (flood). A bound socket
//     cannot drop one engine, so it queues at most ReceiveBufferBytes per
//     connected engine in ZeroMQ instead (BindConfig.ReceiveBufferBytes).
//   - The live batches that wait for a gap's replay are bounded by
//     MaxPendingBatches (10000) and MaxPendingBytes (64 MiB); an overflow
//     makes the gap unrecoverable (pending_buffer).
//   - A replay is bounded by MaxReplayDuration (60 s) and MaxReplayBatches
//     (20000) and cut short beyond them (replay_duration, replay_batches).
//   - A stream that resets more than MaxResets times (5) within ResetWindow
//     (1 min) is suspended: it ignores its engine for ReconnectDelay,
//     doubling up to MaxReconnectDelay while it keeps resetting, then
//     resynchronises through replay (reset_rate, ClientStats.Suspended,
//     aibrix_kvcache_zmq_suspended).
//   - Error logs are rate-limited per stream and kind: the first 10 of a
//     minute, then one line that sums up the rest.
//
// A stream thus holds at most about 2 x ReceiveBufferBytes +
// MaxPendingBytes of its engine's data (some 200 MiB by default), and,
// while it decodes a batch, 16 x MaxMessageBytes (256 MiB by default) of
// decoded batch, plus what ZeroMQ queues between two reads. ZeroMQ's queues
// count messages, not bytes (ReceiveHWM, and MaxReplayBatches + 1 for a
// replay, which vLLM's ROUTER sends in one go); a driver reads its sockets
// after every round of work, a slice of 2 ms plus one batch per stream, so
// they hold what arrives meanwhile. One limit is beyond any subscriber of
// libzmq 4.3: it buffers a multipart message until its last frame, with no
// bound on the number of frames, so an engine that never ends a message
// grows the gateway until its connection is cut. Follow only engines on a
// network you control (in bind mode, see BindConfig).
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
