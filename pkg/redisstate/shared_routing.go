package redisstate

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
)

// InFlightBlocks gives the keys of the prompt blocks this replica's
// attempts hold on each pod, at most max; *routing.Router implements it.
type InFlightBlocks interface {
	InFlightBlocks(max int) (blocks map[string][]uint64, truncated bool)
}

// OutputHistograms are the output predictors' histories per model, each
// of HistogramSize counts; *cache.OutputPredictors implements it.
type OutputHistograms interface {
	Histograms() map[string][]int32
	SetRemoteHistograms(map[string][]int32) error
	HistogramSize() int
}

// DefaultSharedMaxBlocks is SharedCountsConfig.MaxBlocks' default: 32Ki keys
// of 8 bytes, 256 KiB per replica and publication at most.
const DefaultSharedMaxBlocks = 1 << 15

// Fields of a replica's hash beside its counts: field
// "<namespace>/<pod>#blocks" holds the keys of the prompt blocks its
// attempts hold on the pod, 8 bytes each, little-endian; field
// "@output|<model>" the history of its output predictor for model, 4 bytes
// per count, little-endian. Neither can be taken for a pod's count: pod
// names hold no '#', namespaces no '@'.
const (
	fieldBlocks       = "#blocks"
	fieldOutputPrefix = "@output|"
)

// Kind label values of kvgate_cache_shared_state_rejects_total.
const (
	rejectBlocks    = "blocks"
	rejectHistogram = "output_histogram"
	rejectValue     = "value"
)

// publishRouting adds to fields the prompt blocks in flight and the output
// histories, those the configuration shares.
func (c *SharedCounts) publishRouting(fields map[string]string) {
	if c.cfg.Prefixes != nil {
		blocks, truncated := c.cfg.Prefixes.InFlightBlocks(c.cfg.MaxBlocks)
		if truncated {
			c.metrics.blocksTruncated.Inc()
		}
		for pod, keys := range blocks {
			b := make([]byte, 0, 8*len(keys))
			for _, k := range keys {
				b = binary.LittleEndian.AppendUint64(b, k)
			}
			fields[pod+fieldBlocks] = string(b)
		}
	}
	if c.cfg.Predictors != nil {
		for model, hist := range c.cfg.Predictors.Histograms() {
			empty := true
			b := make([]byte, 0, 4*len(hist))
			for _, n := range hist {
				empty = empty && n == 0
				b = binary.LittleEndian.AppendUint32(b, uint32(n))
			}
			if !empty {
				fields[fieldOutputPrefix+model] = string(b)
			}
		}
	}
}

// readRouting adds field of another replica's hash to sum if it is one of
// prompt blocks or an output history, and reports whether it was. A value
// that cannot be decoded is dropped and counted.
func (c *SharedCounts) readRouting(field, v string, sum *remoteCounts) bool {
	switch {
	case strings.HasSuffix(field, fieldBlocks):
		if len(v)%8 != 0 || len(v) > 8*c.cfg.MaxBlocks {
			c.metrics.sharedRejects.WithLabelValues(rejectBlocks).Inc()
			return true
		}
		pod := strings.TrimSuffix(field, fieldBlocks)
		if sum.blocks == nil {
			sum.blocks = map[string][]uint64{}
		}
		for i := 0; i < len(v); i += 8 {
			sum.blocks[pod] = append(sum.blocks[pod], binary.LittleEndian.Uint64([]byte(v[i:i+8])))
		}
		return true
	case strings.HasPrefix(field, fieldOutputPrefix):
		model := strings.TrimPrefix(field, fieldOutputPrefix)
		if c.cfg.Predictors == nil {
			return true
		}
		if err := addHistogram(sum, model, v, c.cfg.Predictors.HistogramSize()); err != nil {
			c.metrics.sharedRejects.WithLabelValues(rejectHistogram).Inc()
			c.log.V(2).Info("Dropped another gateway's output history", "model", model, "err", err)
		}
		return true
	}
	return false
}

// maxHistogramCount bounds each count of the sum of the other replicas'
// output histories.
const maxHistogramCount = 1 << 30

// addHistogram adds the encoded history v of model, which must hold size
// counts, to sum's. A history of another shape (another version's, or a
// replica configured otherwise) is left out alone: the others still sum.
func addHistogram(sum *remoteCounts, model, v string, size int) error {
	if len(v) != 4*size {
		return fmt.Errorf("history of %d bytes, where this gateway's predictors hold %d counts of 4 bytes", len(v), size)
	}
	hist := make([]int32, size)
	for i := range hist {
		n := int32(binary.LittleEndian.Uint32([]byte(v[4*i : 4*i+4])))
		if n < 0 {
			return errors.New("history holds a negative count")
		}
		hist[i] = n
	}
	if sum.hists == nil {
		sum.hists = map[string][]int32{}
	}
	old, ok := sum.hists[model]
	if !ok {
		sum.hists[model] = hist
		return nil
	}
	for i, n := range hist {
		old[i] = min(old[i]+n, maxHistogramCount)
	}
	return nil
}

// applyRouting sets on the pods and the predictors the prompt blocks and
// output histories of the other replicas in sum.
func (c *SharedCounts) applyRouting(sum remoteCounts) {
	if c.cfg.Prefixes != nil {
		for _, p := range c.pods.PodLoads() {
			p.SetRemoteBlocks(sum.blocks[p.ID()])
		}
	}
	if c.cfg.Predictors != nil {
		if err := c.cfg.Predictors.SetRemoteHistograms(sum.hists); err != nil {
			c.metrics.sharedRejects.WithLabelValues(rejectHistogram).Inc()
			c.log.V(2).Info("Dropped other gateways' output histories", "err", err)
		}
	}
}
