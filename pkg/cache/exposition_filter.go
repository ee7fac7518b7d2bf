package cache

import (
	"bytes"
)

// lineFilter keeps the lines of a Prometheus text exposition that the Store
// reads, so that the text parser only sees those. vLLM serves several
// hundred lines, mostly histogram buckets the Store does not need, and the
// parser allocates for every line it sees: filtering first makes a scrape
// many times cheaper.
type lineFilter struct {
	types   map[string]bool // families whose # TYPE line is kept
	samples map[string]bool // sample names kept
}

// builtinHistograms are read for their _sum and _count only.
var builtinHistograms = [...]string{vllmTTFT, vllmInterTokenLat, vllmTimePerOutputTok, vllmE2ELatency, vllmPrefillTime}

// newLineFilter keeps the built-in families and the subscribed ones, whole.
func newLineFilter(subscribed map[string]struct{}) *lineFilter {
	f := &lineFilter{types: map[string]bool{}, samples: map[string]bool{}}
	for _, name := range [...]string{vllmRunning, vllmWaiting, vllmKVCacheUsage, vllmGPUCacheUsage, vllmCPUCacheUsage,
		vllmPrefixHits, vllmPrefixQueries, vllmPromptTokens, vllmCacheConfigInfo} {
		f.types[name], f.samples[name] = true, true
	}
	for _, name := range builtinHistograms {
		f.types[name], f.samples[name+"_sum"], f.samples[name+"_count"] = true, true, true
	}
	for name := range subscribed {
		f.types[name] = true
		for _, suffix := range [...]string{"", "_sum", "_count", "_bucket"} {
			f.samples[name+suffix] = true
		}
	}
	return f
}

// filter appends to dst the lines of src to parse: the # TYPE lines and the
// samples of the kept families. Other comments, # HELP lines and blank
// lines are dropped; so are samples whose metric name is quoted inside the
// braces, which vLLM does not emit.
func (f *lineFilter) filter(dst *bytes.Buffer, src []byte) {
	// A page lists a family's samples together (a histogram's buckets,
	// one line each, are most of vLLM's), so a sample with the name of
	// the one before is decided as that one was, without a lookup.
	var last []byte
	lastKept := false
	for len(src) > 0 {
		line := src
		if i := bytes.IndexByte(src, '\n'); i >= 0 {
			line, src = src[:i+1], src[i+1:]
		} else {
			src = nil
		}
		var kept bool
		switch {
		case len(line) > 0 && line[0] != '#':
			if last != nil && len(line) > len(last) && bytes.HasPrefix(line, last) && endsToken(line[len(last)]) {
				kept = lastKept
			} else {
				last = firstToken(line)
				kept = f.samples[string(last)]
				lastKept = kept
			}
		case bytes.HasPrefix(line, []byte("# TYPE ")):
			kept = f.types[string(firstToken(line[len("# TYPE "):]))]
		}
		if kept {
			dst.Write(line)
			if line[len(line)-1] != '\n' {
				dst.WriteByte('\n')
			}
		}
	}
}

// firstToken returns line up to the first brace, blank, tab or line end.
func firstToken(line []byte) []byte {
	for i, c := range line {
		if endsToken(c) {
			return line[:i]
		}
	}
	return line
}

// endsToken reports whether c ends a metric name.
func endsToken(c byte) bool {
	switch c {
	case '{', ' ', '\t', '\n', '\r':
		return true
	}
	return false
}
