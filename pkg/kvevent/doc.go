// Package kvevent turns vLLM's KV-cache event stream into typed events.
package kvevent
