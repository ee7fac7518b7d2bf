package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/kvevent"
	"github.com/kvgate/kvgate/pkg/kvevent/publisher"
	"github.com/kvgate/kvgate/pkg/sim"
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

// publisherConfig configures the publisher of data-parallel rank rank,
// whose endpoints are cfg's offset by the rank, sending in wire format w.
func (cfg kvEventsConfig) publisherConfig(rank int, w wireFormat, log klog.Logger) publisher.PublisherConfig {
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
	return pc
}

// delayedPublisher publishes one rank's KV-event batches as its
// sim.EventLink says they arrive: each after the link's delay, in order,
// and a lost one withheld from the live stream (PublisherConfig.DropLive),
// so that subscribers see a gap and, with a replay endpoint, replay it late,
// or without one miss it. A goroutine of its own waits out the delays, so
// that Publish, called from the engine's loop, only queues the batch; the
// queue holds at most the publisher's MaxQueueSize batches, and Publish
// blocks while it is full, as the publisher's own queue does.
type delayedPublisher struct {
	pub   *publisher.Publisher
	link  *sim.EventLink
	now   func() time.Time
	queue chan timedBatch
	done  chan struct{}

	mu      sync.Mutex
	lost    map[uint64]bool // seqs to withhold
	nextSeq uint64          // the seq the publisher gives the next batch
}

// timedBatch is a batch and when it arrives, or that it is lost.
type timedBatch struct {
	batch *kvevent.EventBatch
	at    time.Time
	lost  bool
}

// newDelayedPublisher starts the publisher of rank, whose batches follow
// delivery, their fates drawn from seed.
func newDelayedPublisher(cfg kvEventsConfig, rank int, w wireFormat, delivery sim.EventDelivery, seed uint64, log klog.Logger) (*delayedPublisher, error) {
	link, err := sim.NewEventLink(delivery, seed)
	if err != nil {
		return nil, err
	}
	d := &delayedPublisher{link: link, now: time.Now, lost: map[uint64]bool{}, done: make(chan struct{})}
	pc := cfg.publisherConfig(rank, w, log)
	pc.DropLive = d.dropLive
	if d.pub, err = publisher.NewPublisher(pc); err != nil {
		return nil, err
	}
	d.queue = make(chan timedBatch, pc.MaxQueueSize)
	go d.run()
	return d, nil
}

// Publish queues batch for publication when the link delivers it.
func (d *delayedPublisher) Publish(batch *kvevent.EventBatch) error {
	d.mu.Lock()
	at, ok := d.link.Deliver(d.now())
	d.mu.Unlock()
	d.queue <- timedBatch{batch: batch, at: at, lost: !ok}
	return nil
}

// run publishes the queued batches, each at its time, until Close.
func (d *delayedPublisher) run() {
	defer close(d.done)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for tb := range d.queue {
		if !tb.lost {
			if wait := time.Until(tb.at); wait > 0 {
				timer.Reset(wait)
				<-timer.C
			}
		}
		d.mu.Lock()
		if tb.lost {
			d.lost[d.nextSeq] = true
		}
		d.nextSeq++
		d.mu.Unlock()
		if err := d.pub.Publish(tb.batch); err != nil {
			klog.ErrorS(err, "Publishing KV events failed")
		}
	}
}

// dropLive reports, for the publisher, whether the batch of seq was lost.
func (d *delayedPublisher) dropLive(seq uint64) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	lost := d.lost[seq]
	delete(d.lost, seq)
	return lost
}

// Close publishes what is queued, its delays waited out, then closes the
// publisher.
func (d *delayedPublisher) Close() error {
	close(d.queue)
	<-d.done
	return d.pub.Close()
}
