package cache

import (
	"bytes"
	"math"
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// maxMemoSamples and maxMemoBytes bound the page whose shape pageMemo
// remembers; a larger page is parsed in full at every scrape. The lines of
// vLLM's page that the Store reads are a few dozen, a few kilobytes, per
// model and data-parallel rank.
const (
	maxMemoSamples = 4096
	maxMemoBytes   = 256 << 10
)

// pageMemo parses the filtered expositions of one pod's successive scrapes.
// An engine's page keeps its shape from one scrape to the next (the same
// lines, in the same order, but for the sample values), so pageMemo keeps
// the families of the last page the text parser read in full, and for each
// sample line, the field of those families its value set. A page that
// differs from that one only in its sample values is read by updating
// those fields in place: a comparison and a float parse a line, where the
// parser allocates a few dozen objects a line. Any other page is read in
// full by the parser, whose families are then remembered in turn.
//
// The fast path reads nothing the parser would read differently: every
// line but the values must be byte for byte the same, every value must
// parse as the parser parses it and fit its field as the parser stores it
// (a histogram's counts as integers), or the page is parsed in full.
// Shapes it cannot map line to field exactly (timestamps, summaries, a
// histogram's sample repeated, fractional histogram counts) are not
// remembered.
//
// The families it returns are overwritten by the next parse. A pageMemo
// is not safe for concurrent use.
type pageMemo struct {
	parser expfmt.TextParser
	// lineParser reads one line at a time, to learn where it lands.
	lineParser expfmt.TextParser
	// text is the page last parsed in full when its shape is remembered
	// (families is then not nil), and slots has a field for each of its
	// sample lines, in order.
	text     []byte
	slots    []sampleSlot
	families map[string]*dto.MetricFamily
	// read reports that a page was read into the remembered shape.
	read bool
	// unread counts the shapes learned in a row that no page was read
	// into, up to maxMemoBackoff, and skip the full parses left before the
	// next shape is learned: learning one costs about two full parses, so
	// a page whose shape changes at every scrape learns one every
	// 2^unread pages.
	unread, skip int
}

// maxMemoBackoff bounds pageMemo.unread: a page whose shape changes at
// every scrape learns one shape every 64 pages.
const maxMemoBackoff = 6

// sampleSlot is where a sample line's value goes: a float field, or an
// integer count of a histogram.
type sampleSlot struct {
	f *float64
	u *uint64
}

func newPageMemo() *pageMemo {
	return &pageMemo{parser: newTextParser(), lineParser: newTextParser()}
}

// parse returns the families of page, a filtered exposition whose every
// line ends in a newline.
func (m *pageMemo) parse(page []byte) (map[string]*dto.MetricFamily, error) {
	whole := len(page) > 0 && page[len(page)-1] == '\n'
	if m.families != nil && whole && m.update(page) {
		m.read = true
		return m.families, nil
	}
	if m.families != nil {
		if m.read {
			m.unread = 0
		} else {
			m.unread = min(m.unread+1, maxMemoBackoff)
			m.skip = 1<<m.unread - 1
		}
	}
	m.forget()
	families, err := m.parser.TextToMetricFamilies(bytes.NewReader(page))
	if err != nil {
		return nil, err
	}
	switch {
	case m.skip > 0:
		m.skip--
	case whole && len(page) <= maxMemoBytes:
		m.learn(page, families)
	}
	return families, nil
}

// forget drops the remembered shape.
func (m *pageMemo) forget() {
	m.text, m.slots, m.families, m.read = m.text[:0], m.slots[:0], nil, false
}

// update sets the remembered fields from page's values and reports whether
// page has the remembered shape; when it does not, the fields may have been
// partly updated, and must be forgotten.
func (m *pageMemo) update(page []byte) bool {
	old, k := m.text, 0
	for len(page) > 0 && len(old) > 0 {
		line, rest, _ := bytes.Cut(page, newline)
		was, wasRest, _ := bytes.Cut(old, newline)
		page, old = rest, wasRest
		if len(line) > 0 && line[0] == '#' {
			if !bytes.Equal(line, was) {
				return false
			}
			continue
		}
		at := valueStart(line)
		if at != valueStart(was) || !bytes.Equal(line[:at], was[:at]) || k == len(m.slots) {
			return false
		}
		v, err := parseSampleValue(line[at:])
		if err != nil || !m.slots[k].set(v) {
			return false
		}
		k++
	}
	return len(page) == 0 && len(old) == 0 && k == len(m.slots)
}

var newline = []byte{'\n'}

// valueStart returns where the value of sample line starts: after its last
// blank or tab.
func valueStart(line []byte) int {
	return bytes.LastIndexAny(line, " \t") + 1
}

// parseSampleValue parses a sample value as the text parser does.
func parseSampleValue(b []byte) (float64, error) {
	s := string(b)
	if strings.ContainsAny(s, "pP_") {
		return 0, strconv.ErrSyntax
	}
	return strconv.ParseFloat(s, 64)
}

// set stores v in the slot, and reports false when the slot cannot hold it
// as the text parser would store it.
func (s sampleSlot) set(v float64) bool {
	if s.f != nil {
		*s.f = v
		return true
	}
	u, ok := wholeCount(v)
	if ok {
		*s.u = u
	}
	return ok
}

// wholeCount returns v as a histogram count the text parser stores as an
// integer.
func wholeCount(v float64) (uint64, bool) {
	if !(v >= 0 && v < 1<<64 && v == math.Trunc(v)) {
		return 0, false
	}
	return uint64(v), true
}

// learn remembers the shape of page, which parsed in full as families,
// when every sample line maps to a field of its own.
func (m *pageMemo) learn(page []byte, families map[string]*dto.MetricFamily) {
	index := map[string][]*dto.Metric{}
	occurrences := map[string]int{}
	var typeLine []byte
	var lineBuf bytes.Buffer
	seen := map[any]bool{}
	for rest := page; len(rest) > 0; {
		var line []byte
		line, rest, _ = bytes.Cut(rest, newline)
		if len(line) > 0 && line[0] == '#' {
			if bytes.HasPrefix(line, []byte("# TYPE ")) {
				typeLine = line
			}
			continue
		}
		if len(m.slots) == maxMemoSamples {
			m.forget()
			return
		}
		lineBuf.Reset()
		if typeLine != nil {
			lineBuf.Write(typeLine)
			lineBuf.WriteByte('\n')
		}
		lineBuf.Write(line)
		lineBuf.WriteByte('\n')
		one, err := m.lineParser.TextToMetricFamilies(&lineBuf)
		s, ok := sampleSlot{}, err == nil && len(one) == 1
		if ok {
			s, ok = slotOf(one, families, index, occurrences)
		}
		if ok {
			v, err := parseSampleValue(line[valueStart(line):])
			ok = err == nil && s.holds(v) && !seen[s.key()]
		}
		if !ok {
			m.forget()
			return
		}
		seen[s.key()] = true
		m.slots = append(m.slots, s)
	}
	m.text = append(m.text[:0], page...)
	m.families = families
}

// key identifies the field of s.
func (s sampleSlot) key() any {
	if s.f != nil {
		return s.f
	}
	return s.u
}

// holds reports whether the slot holds v, as the page's parse stored it.
func (s sampleSlot) holds(v float64) bool {
	if s.f != nil {
		return math.Float64bits(*s.f) == math.Float64bits(v)
	}
	u, ok := wholeCount(v)
	return ok && *s.u == u
}

// slotOf returns the field of families that the single sample one parsed
// from sets. index maps family and label set to the metrics of families
// with them, in order (indexMetrics fills it when empty), and occurrences
// counts the samples of each that slotOf has seen: the parser gives each
// sample of a gauge, counter or untyped family a metric of its own, even a
// sample of a series seen before, so the n-th such sample sets the n-th
// metric; a histogram's samples of one series share its metric.
func slotOf(one, families map[string]*dto.MetricFamily, index map[string][]*dto.Metric,
	occurrences map[string]int) (sampleSlot, bool) {
	var name string
	var sample *dto.Metric
	for n, mf := range one {
		if len(mf.Metric) != 1 {
			return sampleSlot{}, false
		}
		name, sample = n, mf.Metric[0]
	}
	mf := families[name]
	if mf == nil || mf.GetType() != one[name].GetType() || sample.TimestampMs != nil {
		return sampleSlot{}, false
	}
	if len(index) == 0 {
		indexMetrics(families, index)
	}
	key := seriesKey(name, sample.Label)
	metrics, n := index[key], 0
	if mf.GetType() != dto.MetricType_HISTOGRAM {
		n = occurrences[key]
		occurrences[key]++
	}
	if n >= len(metrics) {
		return sampleSlot{}, false
	}
	m := metrics[n]
	switch mf.GetType() {
	case dto.MetricType_GAUGE:
		if g := m.GetGauge(); g != nil && g.Value != nil {
			return sampleSlot{f: g.Value}, true
		}
	case dto.MetricType_COUNTER:
		if c := m.GetCounter(); c != nil && c.Value != nil {
			return sampleSlot{f: c.Value}, true
		}
	case dto.MetricType_UNTYPED:
		if u := m.GetUntyped(); u != nil && u.Value != nil {
			return sampleSlot{f: u.Value}, true
		}
	case dto.MetricType_HISTOGRAM:
		return histogramSlot(sample.GetHistogram(), m.GetHistogram())
	}
	return sampleSlot{}, false
}

// histogramSlot returns the field of histogram h that the single sample of
// line sets.
func histogramSlot(line, h *dto.Histogram) (sampleSlot, bool) {
	if line == nil || h == nil {
		return sampleSlot{}, false
	}
	switch {
	case line.SampleSum != nil:
		return sampleSlot{f: h.SampleSum}, h.SampleSum != nil
	case line.SampleCount != nil:
		return sampleSlot{u: h.SampleCount}, h.SampleCount != nil
	case len(line.Bucket) == 1 && line.Bucket[0].CumulativeCount != nil:
		bound := math.Float64bits(line.Bucket[0].GetUpperBound())
		same := func(b *dto.Bucket) bool { return math.Float64bits(b.GetUpperBound()) == bound }
		i := slices.IndexFunc(h.Bucket, same)
		if i < 0 || h.Bucket[i].CumulativeCount == nil || slices.ContainsFunc(h.Bucket[i+1:], same) {
			return sampleSlot{}, false
		}
		return sampleSlot{u: h.Bucket[i].CumulativeCount}, true
	}
	return sampleSlot{}, false
}

// indexMetrics maps each family's metrics by their label set into index,
// in the order of the family's metrics.
func indexMetrics(families map[string]*dto.MetricFamily, index map[string][]*dto.Metric) {
	for name, mf := range families {
		for _, m := range mf.Metric {
			k := seriesKey(name, m.Label)
			index[k] = append(index[k], m)
		}
	}
}

// seriesKey names a family's series by its label set, in any order.
func seriesKey(family string, labels []*dto.LabelPair) string {
	pairs := make([]string, len(labels))
	for i, l := range labels {
		pairs[i] = strconv.Quote(l.GetName()) + "=" + strconv.Quote(l.GetValue())
	}
	slices.Sort(pairs)
	return strconv.Quote(family) + "{" + strings.Join(pairs, ",") + "}"
}
