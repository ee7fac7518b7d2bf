package cache

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
)

// filteredPage returns the lines of a golden exposition that scrapes parse.
func filteredPage(t testing.TB, name string) []byte {
	t.Helper()
	var b bytes.Buffer
	sel := newMetricSelection(map[string]struct{}{"vllm:request_queue_time_seconds": {}, "vllm:generation_tokens_total": {}})
	sel.filter.filter(&b, readExposition(t, name))
	return b.Bytes()
}

// withValues returns page with the value of its i-th sample line replaced
// by value(i, old value).
func withValues(page []byte, value func(i int, old string) string) []byte {
	var out bytes.Buffer
	i := 0
	for line := range bytes.Lines(page) {
		if line[0] == '#' {
			out.Write(line)
			continue
		}
		body := bytes.TrimSuffix(line, newline)
		at := valueStart(body)
		out.Write(body[:at])
		out.WriteString(value(i, string(body[at:])))
		out.WriteByte('\n')
		i++
	}
	return out.Bytes()
}

// parsedInFull parses page with a parser of its own.
func parsedInFull(page []byte) (map[string]*dto.MetricFamily, error) {
	p := newTextParser()
	return p.TextToMetricFamilies(bytes.NewReader(page))
}

// checkAgrees fails t unless got and gotErr are what the text parser makes
// of page.
func checkAgrees(t *testing.T, page []byte, got map[string]*dto.MetricFamily, gotErr error) {
	t.Helper()
	want, wantErr := parsedInFull(page)
	if (gotErr == nil) != (wantErr == nil) {
		t.Fatalf("page %q: error %v, the parser's %v", page, gotErr, wantErr)
	}
	if wantErr != nil {
		return
	}
	if !slices.Equal(slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want))) {
		t.Fatalf("page %q: families %v, the parser's %v", page, slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
	}
	for name, mf := range want {
		if !proto.Equal(got[name], mf) {
			t.Fatalf("page %q: family %s is\n%v\nthe parser's\n%v", page, name, got[name], mf)
		}
	}
}

func TestPageMemoReadsNewValuesOfTheSameShapeAsTheParserDoes(t *testing.T) {
	for _, name := range []string{"vllm_v1_t0.txt", "vllm_v1_dp2.txt", "vllm_v1_two_models.txt", "vllm_v0_gpu_cache.txt"} {
		t.Run(name, func(t *testing.T) {
			page := filteredPage(t, name)
			m := newPageMemo()
			first, err := m.parse(page)
			checkAgrees(t, page, first, err)
			if m.families == nil {
				t.Fatal("the page's shape was not remembered")
			}
			for round, value := range []func(int, string) string{
				func(i int, old string) string { return old },
				func(i int, old string) string { return fmt.Sprint(i*7 + 3) },
				func(i int, old string) string { return fmt.Sprintf("%d.0e0", 2*i+1) },
			} {
				next := withValues(page, value)
				got, err := m.parse(next)
				checkAgrees(t, next, got, err)
				if fmt.Sprintf("%p", got) != fmt.Sprintf("%p", first) {
					t.Fatalf("round %d: the page was parsed in full, want its values read into the families remembered", round)
				}
			}
		})
	}
}

func TestPageMemoParsesInFullWhatItCannotReadAsValues(t *testing.T) {
	page := filteredPage(t, "vllm_v1_t0.txt")
	firstSample := func(f func(line string) string) []byte {
		done := false
		return withValues(page, func(i int, old string) string {
			if done {
				return old
			}
			done = true
			return f(old)
		})
	}
	histogramCount := func(v string) []byte {
		return bytes.Replace(page, []byte("vllm:time_to_first_token_seconds_count{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 50.0"),
			[]byte("vllm:time_to_first_token_seconds_count{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} "+v), 1)
	}
	if bytes.Equal(histogramCount("7"), page) {
		t.Fatal("the golden page has no histogram count to change")
	}
	for _, c := range []struct {
		name string
		page []byte
	}{
		{"a series more", append(slices.Clone(page), "vllm:num_requests_running{engine=\"9\",model_name=\"x\"} 1\n"...)},
		{"a series less", page[:bytes.LastIndexByte(page[:len(page)-1], '\n')+1]},
		{"a label changed", bytes.Replace(page, []byte(`engine="0"`), []byte(`engine="7"`), 1)},
		{"a value with a timestamp", firstSample(func(v string) string { return v + " 1700000000000" })},
		{"a value the parser rejects", firstSample(func(string) string { return "0x1p3" })},
		{"a value with an underscore", firstSample(func(string) string { return "1_000" })},
		{"an infinite gauge", firstSample(func(string) string { return "+Inf" })},
		{"a fractional histogram count", histogramCount("2.5")},
		{"a negative histogram count", histogramCount("-1")},
		{"a histogram count past 2^64", histogramCount("1e30")},
		{"no final newline", page[:len(page)-1]},
		{"a blank line", append(slices.Clone(page), '\n')},
		{"a help line", append([]byte("# HELP vllm:num_requests_running Running.\n"), page...)},
		{"the same page", page},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := newPageMemo()
			first, err := m.parse(page)
			checkAgrees(t, page, first, err)
			got, err := m.parse(c.page)
			checkAgrees(t, c.page, got, err)
			// And back: the memo read the next page right whatever it
			// made of this one.
			got, err = m.parse(page)
			checkAgrees(t, page, got, err)
		})
	}
}

func TestPageMemoRemembersOnlyShapesItMapsLineToField(t *testing.T) {
	for _, c := range []struct {
		name, page string
		remembered bool
	}{
		{"gauges, counters and a histogram", "# TYPE g gauge\ng{a=\"1\"} 1\ng{a=\"2\"} 2\n# TYPE c counter\nc 3\n" +
			"# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 4\nh_count 2\n", true},
		{"untyped", "u{a=\"x y\"} 5\n", true},
		{"a summary", "# TYPE s summary\ns{quantile=\"0.5\"} 1\ns_sum 2\ns_count 3\n", false},
		{"a repeated series", "# TYPE g gauge\ng{a=\"1\"} 1\ng{b=\"2\"} 2\ng{a=\"1\"} 3\n", true},
		{"labels reordered within a histogram", "# TYPE h histogram\nh_sum{a=\"1\",b=\"2\"} 1\nh_count{b=\"2\",a=\"1\"} 1\n", true},
		{"a repeated histogram sum", "# TYPE h histogram\nh_sum 1\nh_sum 2\nh_count 1\n", false},
		{"a repeated bucket", "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"1.0\"} 1\nh_count 1\n", false},
		{"a fractional histogram count", "# TYPE h histogram\nh_sum 1\nh_count 1.5\n", false},
		{"a timestamp", "# TYPE g gauge\ng 1 1700000000000\n", false},
		{"a histogram sample without a suffix", "# TYPE h histogram\nh 1\n", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := newPageMemo()
			got, err := m.parse([]byte(c.page))
			checkAgrees(t, []byte(c.page), got, err)
			if (m.families != nil) != c.remembered {
				t.Fatalf("shape remembered: %v, want %v", m.families != nil, c.remembered)
			}
			next := withValues([]byte(c.page), func(i int, old string) string { return fmt.Sprint(i + 10) })
			got, err = m.parse(next)
			checkAgrees(t, next, got, err)
		})
	}
}

func TestPageMemoRemembersNoPageBeyondItsBounds(t *testing.T) {
	var many strings.Builder
	many.WriteString("# TYPE g gauge\n")
	for i := range maxMemoSamples + 1 {
		fmt.Fprintf(&many, "g{i=\"%d\"} 1\n", i)
	}
	long := "# TYPE g gauge\ng{pad=\"" + strings.Repeat("x", maxMemoBytes) + "\"} 1\n"
	for name, page := range map[string]string{"too many samples": many.String(), "too many bytes": long} {
		t.Run(name, func(t *testing.T) {
			m := newPageMemo()
			got, err := m.parse([]byte(page))
			checkAgrees(t, []byte(page), got, err)
			if m.families != nil || len(m.text) > 0 {
				t.Fatalf("remembered a page beyond the bounds: %d slots, %d bytes", len(m.slots), len(m.text))
			}
		})
	}
}

// FuzzPageMemoAgreesWithTheParser reads a page, then the page with new
// values and any lines appended, and checks that both read as the text
// parser reads them.
func FuzzPageMemoAgreesWithTheParser(f *testing.F) {
	f.Add([]byte("# TYPE g gauge\ng{a=\"1\"} 1\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 4\nh_count 2\n"), "2,NaN,3,5.5,1", []byte{})
	f.Add([]byte("# TYPE c counter\nc{a=\"x\"} 3\nc{a=\"y\"} 4\n"), "+Inf,-0", []byte("c{a=\"z\"} 1\n"))
	f.Add([]byte("u 1\n"), "1e400", []byte{})
	f.Fuzz(func(t *testing.T, page []byte, values string, tail []byte) {
		if len(page) > 4096 || len(tail) > 1024 {
			return
		}
		m := newPageMemo()
		got, err := m.parse(page)
		checkAgrees(t, page, got, err)
		vs := strings.Split(values, ",")
		next := page
		if len(page) > 0 && page[len(page)-1] == '\n' && !bytes.Contains(page, []byte("\n\n")) && page[0] != '\n' {
			next = withValues(page, func(i int, old string) string {
				if i < len(vs) && !strings.ContainsAny(vs[i], " \t\n") {
					return vs[i]
				}
				return old
			})
		}
		next = append(slices.Clip(next), tail...)
		got, err = m.parse(next)
		checkAgrees(t, next, got, err)
	})
}

func TestPageMemoLearnsRarelyFromPagesThatChangeShapeEveryTime(t *testing.T) {
	pages := [][]byte{filteredPage(t, "vllm_v1_t0.txt"), filteredPage(t, "vllm_v1_dp2.txt")}
	m := newPageMemo()
	learned := 0
	const n = 256
	for i := range n {
		got, err := m.parse(pages[i%2])
		checkAgrees(t, pages[i%2], got, err)
		if m.families != nil {
			learned++
		}
	}
	// 1, 2, 4, ... 64 pages apart: 1 + 2 + 4 + 8 + 16 + 32 + 64 + 64 < 256.
	if want := maxMemoBackoff + 1 + (n-(1<<(maxMemoBackoff+1)))/(1<<maxMemoBackoff) + 1; learned > want {
		t.Fatalf("learned %d shapes of %d pages that each changed shape, want at most %d", learned, n, want)
	}
	// Once the shape holds, the memo reads the page's values again.
	stable := pages[0]
	for range 1<<maxMemoBackoff + 1 {
		got, err := m.parse(stable)
		checkAgrees(t, stable, got, err)
		if m.read {
			return
		}
	}
	t.Fatalf("a page of one shape was parsed in full %d times in a row", 1<<maxMemoBackoff+1)
}
