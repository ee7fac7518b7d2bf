package main

import (
	"bytes"
	"encoding/json"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/kvevent/publisher"
)

// kvEventsConfig mirrors vLLM's KVEventsConfig, the JSON value of
// --kv-events-config.
type kvEventsConfig struct {
	EnableKVCacheEvents bool    `json:"enable_kv_cache_events"`
	Publisher           *string `json:"publisher"`
	Endpoint            string  `json:"endpoint"`
	ReplayEndpoint      *string `json:"replay_endpoint"`
	BufferSteps         int     `json:"buffer_steps"`
	HWM                 int     `json:"hwm"`
	MaxQueueSize        int     `json:"max_queue_size"`
	Topic               string  `json:"topic"`
}

// parseKVEventsConfig parses the JSON of --kv-events-config, filling in
// vLLM's defaults, and reports whether events are to be published: vLLM
// publishes with ZeroMQ when enable_kv_cache_events is set and the
// publisher is "zmq" or unset, and publishes nothing with "null". An empty
// text disables events.
func parseKVEventsConfig(text string) (kvEventsConfig, bool, error) {
	cfg := kvEventsConfig{Endpoint: "tcp://*:5557", BufferSteps: 10000, HWM: 100000, MaxQueueSize: 100000}
	if text == "" {
		return cfg, false, nil
	}
	dec := json.NewDecoder(bytes.NewReader([]byte(text)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		return cfg, false, fmt.Errorf("-kv-events-config: %w", err)
	}
	if dec.More() {
		return cfg, false, fmt.Errorf("-kv-events-config: text after the JSON object")
	}
	publisher := "null"
	if cfg.EnableKVCacheEvents {
		publisher = "zmq"
	}
	if cfg.Publisher != nil {
		publisher = *cfg.Publisher
	}
	switch publisher {
	case "null":
		return cfg, false, nil
	case "zmq":
		return cfg, cfg.EnableKVCacheEvents, nil
	default:
		return cfg, false, fmt.Errorf("-kv-events-config: unknown publisher %q (want zmq or null)", publisher)
	}
}

// wireFormat is what one range of vLLM releases sends.
type wireFormat struct {
	layout kvevent.Layout
	replay publisher.ReplayLayout
}

// wireFormats maps the values of -kv-events-wire to the formats of the vLLM
// releases they name.
var wireFormats = map[string]wireFormat{
	"v0.26": {kvevent.LayoutCurrent, publisher.ReplayWithTopic},       // v0.26 and later
	"v0.24": {kvevent.LayoutCurrent, publisher.ReplayWithoutTopic},    // v0.24 and v0.25
	"v0.10": {kvevent.LayoutPositional, publisher.ReplayWithoutTopic}, // v0.10 to v0.23
}

// publisher starts the publisher of data-parallel rank rank, whose
// endpoints are cfg's offset by the rank, sending in wire format w.
func (cfg kvEventsConfig) publisher(rank int, w wireFormat, log klog.Logger) (*publisher.Publisher, error) {
	pc := publisher.DefaultPublisherConfig()
	pc.Endpoint = cfg.Endpoint
	if cfg.ReplayEndpoint != nil {
		pc.ReplayEndpoint = *cfg.ReplayEndpoint
	}
	pc.DataParallelRank = rank
	pc.Topic = cfg.Topic
	pc.BufferSteps = cfg.BufferSteps
	pc.HWM = cfg.HWM
	pc.MaxQueueSize = cfg.MaxQueueSize
	pc.Layout = w.layout
	pc.ReplayLayout = w.replay
	pc.Logger = log
	return publisher.NewPublisher(pc)
}
