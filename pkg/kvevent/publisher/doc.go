// Package publisher publishes KV-event batches exactly as vLLM's
// ZmqEventPublisher does, for tests, simulators and demos: a PUB socket
// sending [topic, seq, payload] and an optional replay ROUTER answering
// from a bounded buffer in either of the layouts vLLM has used
// (ReplayLayout), with the payloads in any layout kvevent encodes.
package publisher
