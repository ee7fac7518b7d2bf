package hf

import (
	"encoding/json"
	"fmt"
	"strings"

	"golang.org/x/text/unicode/norm"
)

// normalizer rewrites a text segment before it is pre-tokenized.
type normalizer func(string) string

type normalizerJSON struct {
	Type        string            `json:"type"`
	Normalizers []json.RawMessage `json:"normalizers"`
	Prepend     string            `json:"prepend"`
	Pattern     patternJSON       `json:"pattern"`
	Content     string            `json:"content"`
}

// patternJSON is a Split or Replace pattern: a literal string or a regular
// expression.
type patternJSON struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

// parseNormalizer builds the normalizer raw describes; nil when raw is
// null.
func parseNormalizer(raw json.RawMessage) (normalizer, error) {
	if !present(raw) {
		return nil, nil
	}
	var n normalizerJSON
	if err := json.Unmarshal(raw, &n); err != nil {
		return nil, fmt.Errorf("normalizer: %w", err)
	}
	switch n.Type {
	case "NFC":
		return unicodeForm(norm.NFC), nil
	case "NFD":
		return unicodeForm(norm.NFD), nil
	case "NFKC":
		return unicodeForm(norm.NFKC), nil
	case "NFKD":
		return unicodeForm(norm.NFKD), nil
	case "Lowercase":
		return strings.ToLower, nil
	case "Prepend":
		p := n.Prepend
		return func(s string) string {
			if s == "" {
				return s
			}
			return p + s
		}, nil
	case "Replace":
		if n.Pattern.String == nil {
			return nil, fmt.Errorf("normalizer Replace: only string patterns are implemented, not %s", raw)
		}
		old, repl := *n.Pattern.String, n.Content
		return func(s string) string { return strings.ReplaceAll(s, old, repl) }, nil
	case "Sequence":
		var seq []normalizer
		for _, r := range n.Normalizers {
			f, err := parseNormalizer(r)
			if err != nil {
				return nil, err
			}
			if f != nil {
				seq = append(seq, f)
			}
		}
		return func(s string) string {
			for _, f := range seq {
				s = f(s)
			}
			return s
		}, nil
	}
	return nil, fmt.Errorf("normalizer type %q is not implemented", n.Type)
}

// cgj is U+034F COMBINING GRAPHEME JOINER.
const cgj = "\u034f"

// unicodeForm returns a normalizer to form f without the Stream-Safe Text
// Format: package norm inserts a CGJ after every 30 combining marks in a
// row, which Hugging Face's normalizers do not. The CGJs of the text itself
// are kept; being starters that compose with nothing, they split the text
// into parts that normalize independently.
func unicodeForm(f norm.Form) normalizer {
	return func(s string) string {
		out := f.String(s)
		if !strings.Contains(out, cgj) || strings.Count(out, cgj) == strings.Count(s, cgj) {
			return out
		}
		parts := strings.Split(s, cgj)
		for i, p := range parts {
			parts[i] = strings.ReplaceAll(f.String(p), cgj, "")
		}
		return strings.Join(parts, cgj)
	}
}

var jsonNull = []byte("null")

func present(raw json.RawMessage) bool {
	return len(raw) > 0 && string(raw) != string(jsonNull)
}
