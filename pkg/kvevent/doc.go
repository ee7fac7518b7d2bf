// Package kvevent holds the KV-cache events of vLLM engines as Go values:
// the event types, vLLM's msgpack codec, and the interfaces through which
// a stream of events is delivered. It is pure Go (it builds with
// CGO_ENABLED=0) and is what the prefix index (pkg/indexer), the engine
// simulator (pkg/sim) and any embedder import.
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
// The packages beside this one work that stream: transport follows one
// (ZMQClient, dialling the engine) or many (BindReceiver, for engines that
// dial in) and keeps each exact; manager follows every eligible pod of a
// fleet into a KVIndex; publisher produces a stream exactly as vLLM does,
// for tests, simulators and demos.
//
// # Events and the codec
//
// An EventBatch holds the engine's timestamp, its data-parallel rank and
// its events in order: *BlockStoredEvent, *BlockRemovedEvent and
// *AllBlocksClearedEvent. DecodeEventBatch accepts every envelope and event
// layout vLLM has sent since v0.9 (the envelope as a positional array or as
// a map of its fields, events as tagged maps or positional arrays, block
// hashes as integers of any width or as raw digests, see BlockHash),
// never allocates from a length it has not checked against the bytes that
// remain, and refuses a batch that would decode to more than 16 bytes per
// payload byte (ErrBatchTooLarge; every batch vLLM sends needs less);
// DecodeEventBatchStats also counts what it skipped as unknown.
// EncodeEventBatch and AppendEventBatch write a batch in the layout of a
// chosen vLLM version (Layout).
//
// # What a handler sees
//
// A handler implements EventHandler and receives each event in order; one
// that also implements BatchHandler receives each batch in one call
// instead, with its seq. One that implements ResetHandler is told, before
// the next batch, when its view of the stream stops being exact: publisher
// restart (drop everything known about the stream), unrecoverable gap
// (state is incomplete), or a rewind its transport was asked for. A
// transport calls the handler from one goroutine, never concurrently.
// Handler errors are counted and logged and never stop the stream.
//
// KVIndex is the same contract for an index that holds many streams, each
// named by a StreamID.
package kvevent
