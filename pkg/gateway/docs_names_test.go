package gateway

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/pkg/config"
)

// Patterns of names the documentation cites, each checked against the code.
var (
	// envVarPattern finds kvgate and AIBrix environment variables.
	envVarPattern = regexp.MustCompile(`\b(?:KVGATE|AIBRIX)_[A-Z0-9_]*[A-Z0-9]\b`)
	// podKeyPattern finds pod labels and annotations.
	podKeyPattern = regexp.MustCompile(`\b(?:kvgate\.io|model\.aibrix\.ai)/[a-z0-9-]*[a-z0-9]`)
	// logLinePattern finds the message of a log line quoted in klog's text
	// format: I1121 13:09:34.187499   16969 client.go:298] "Message" ...
	logLinePattern = regexp.MustCompile(`(?m)^[IWE]\d{4} [\d:.]+ +\d+ [\w.]+:\d+\] "((?:[^"\\]|\\.)*)"`)
	// vllmMetricPattern finds vLLM's metric families.
	vllmMetricPattern = regexp.MustCompile(`\bvllm:[a-z0-9_:]*[a-z0-9]`)
)

// The table of vLLM metrics the Store reads sits between these markers.
const (
	engineMetricsBegin = "<!-- BEGIN ENGINE METRICS: checked by go test ./pkg/gateway -run TestDocs -->\n"
	engineMetricsEnd   = "<!-- END ENGINE METRICS -->\n"
)

// The table of AIBrix's gateway settings, which names settings kvgate does
// not read, sits between these markers of aibrixDoc.
const (
	aibrixDoc           = "../../docs/aibrix.md"
	aibrixSettingsBegin = "<!-- BEGIN AIBRIX SETTINGS: checked by go test ./pkg/gateway -run TestDocs -->\n"
	aibrixSettingsEnd   = "<!-- END AIBRIX SETTINGS -->\n"
)

// aibrixRow is a row of the AIBrix settings table: | `NAME` | What kvgate does |.
var aibrixRow = regexp.MustCompile("(?m)^\\| `([A-Z0-9_]+)` \\| ([^|]*)")

// TestDocsCiteOnlyNamesTheCodeDefines keeps the operator documentation
// (README.md and docs/*.md) honest about the names it cites: environment
// variables must be declared in config.Vars, pod labels and annotations and
// quoted log messages must be spelled in the code, and the table of vLLM
// metrics the Store reads must list exactly the vLLM families package cache
// names. Metric names are checked against a running gateway by
// TestMetricsReferenceListsEveryRegisteredMetric.
func TestDocsCiteOnlyNamesTheCodeDefines(t *testing.T) {
	vars := declaredVariables()
	literals := sourceLiterals(t, "../../pkg", "../../cmd")
	for _, file := range docFiles(t) {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		text := string(data)
		if file == aibrixDoc {
			text = checkAIBrixSettings(t, text, vars)
		}
		for _, name := range envVarPattern.FindAllString(text, -1) {
			if !vars[name] {
				t.Errorf("%s names environment variable %s, which config.Vars does not declare", file, name)
			}
		}
		for _, key := range podKeyPattern.FindAllString(text, -1) {
			if !literals[key] {
				t.Errorf("%s names pod label or annotation %s, which no code reads", file, key)
			}
		}
		for _, m := range logLinePattern.FindAllStringSubmatch(text, -1) {
			msg := strings.ReplaceAll(m[1], `\"`, `"`)
			if !literals[msg] {
				t.Errorf("%s quotes log message %q, which no code logs", file, msg)
			}
		}
	}
	checkEngineMetricsTable(t)
}

// checkAIBrixSettings checks the AIBrix settings table of text, the
// content of aibrixDoc, against the variables kvgate declares (vars): a row
// of a declared variable says it is read ("Read ..."), a row of any other
// says it is not ("Not read ..."), and every declared AIBrix variable has a
// row. It returns text without the table, whose undeclared names the
// caller does not check again.
func checkAIBrixSettings(t *testing.T, text string, vars map[string]bool) string {
	t.Helper()
	b, e := strings.Index(text, aibrixSettingsBegin), strings.Index(text, aibrixSettingsEnd)
	if b < 0 || e < b {
		t.Fatalf("%s lacks the markers %q and %q", aibrixDoc, aibrixSettingsBegin, aibrixSettingsEnd)
	}
	rows := map[string]bool{}
	for _, m := range aibrixRow.FindAllStringSubmatch(text[b:e], -1) {
		name, what := m[1], strings.TrimSpace(m[2])
		rows[name] = true
		switch {
		case vars[name] && !strings.HasPrefix(what, "Read"):
			t.Errorf("%s says kvgate does not read %s, which config.Vars declares", aibrixDoc, name)
		case !vars[name] && !strings.HasPrefix(what, "Not read"):
			t.Errorf("%s says kvgate reads %s, which config.Vars does not declare", aibrixDoc, name)
		}
	}
	for name := range vars {
		if strings.HasPrefix(name, "AIBRIX_") && !rows[name] {
			t.Errorf("%s lacks the AIBrix setting %s, which kvgate reads", aibrixDoc, name)
		}
	}
	return text[:b] + text[e:]
}

// checkEngineMetricsTable compares the vLLM families of docs/metrics.md's
// engine table with the ones package cache names.
func checkEngineMetricsTable(t *testing.T) {
	t.Helper()
	doc, err := os.ReadFile(metricsDoc)
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)
	b, e := strings.Index(text, engineMetricsBegin), strings.Index(text, engineMetricsEnd)
	if b < 0 || e < b {
		t.Fatalf("%s lacks the markers %q and %q", metricsDoc, engineMetricsBegin, engineMetricsEnd)
	}
	documented := uniqueSorted(vllmMetricPattern.FindAllString(text[b:e], -1))
	var read []string
	for lit := range sourceLiterals(t, "../cache") {
		if vllmMetricPattern.MatchString(lit) && vllmMetricPattern.FindString(lit) == lit {
			read = append(read, lit)
		}
	}
	read = uniqueSorted(read)
	if !slices.Equal(documented, read) {
		t.Errorf("the engine metrics table of %s lists %v; package cache reads %v", metricsDoc, documented, read)
	}
}

// sourceLiterals returns the string literals of the non-test Go files under
// roots.
func sourceLiterals(t *testing.T, roots ...string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, root := range roots {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
			if err != nil {
				return err
			}
			for _, lit := range stringLiterals(f) {
				out[lit] = true
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// declaredVariables returns the names and aliases of config.Vars.
func declaredVariables() map[string]bool {
	declared := map[string]bool{}
	for _, v := range config.Vars {
		declared[v.Name] = true
		for _, a := range v.Aliases {
			declared[a] = true
		}
	}
	return declared
}

func uniqueSorted(s []string) []string {
	slices.Sort(s)
	return slices.Compact(s)
}

// markdownLink finds the target of an inline Markdown link.
var markdownLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestDocsLinksResolve fails for every relative link of the operator
// documentation whose file is missing or whose #anchor names no heading.
func TestDocsLinksResolve(t *testing.T) {
	for _, file := range docFiles(t) {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range markdownLink.FindAllStringSubmatch(string(data), -1) {
			target := m[1]
			if strings.Contains(target, "://") {
				continue
			}
			path, anchor, _ := strings.Cut(target, "#")
			resolved := file
			if path != "" {
				resolved = filepath.Join(filepath.Dir(file), path)
			}
			if _, err := os.Stat(resolved); err != nil {
				t.Errorf("%s links to %s, which does not exist", file, target)
				continue
			}
			if anchor != "" && !slices.Contains(headingAnchors(t, resolved), anchor) {
				t.Errorf("%s links to %s, which has no heading %q", file, path, anchor)
			}
		}
	}
}

// headingAnchors returns the anchors GitHub gives the headings of a
// Markdown file: lower case, spaces as hyphens, punctuation other than
// hyphens and underscores dropped.
func headingAnchors(t *testing.T, file string) []string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var anchors []string
	inCode := false
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
		}
		heading, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " ")
		if inCode || !strings.HasPrefix(line, "#") || !ok {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(heading) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
				b.WriteRune(r)
			}
		}
		anchors = append(anchors, b.String())
	}
	return anchors
}
