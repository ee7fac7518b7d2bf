package hf

import (
	"encoding/json"
	"fmt"
	"strings"
)

// preTokenizer cuts a normalized segment into the words the model encodes
// one by one, calling emit for each.
type preTokenizer interface {
	split(s string, first bool, emit func(string))
}

type preTokenizerJSON struct {
	Type           string            `json:"type"`
	PreTokenizers  []json.RawMessage `json:"pretokenizers"`
	Pattern        patternJSON       `json:"pattern"`
	Behavior       string            `json:"behavior"`
	Invert         bool              `json:"invert"`
	AddPrefixSpace bool              `json:"add_prefix_space"`
	UseRegex       *bool             `json:"use_regex"`
	Replacement    string            `json:"replacement"`
	PrependScheme  string            `json:"prepend_scheme"`
	Split          *bool             `json:"split"`
}

// parsePreTokenizer builds the pre-tokenizer raw describes, reporting
// whether it is byte-level. A null raw gives one that keeps the segment
// whole.
func parsePreTokenizer(raw json.RawMessage) (preTokenizer, bool, error) {
	if !present(raw) {
		return whole{}, false, nil
	}
	var p preTokenizerJSON
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, false, fmt.Errorf("pre_tokenizer: %w", err)
	}
	switch p.Type {
	case "Sequence":
		var seq sequence
		byteLevel := false
		for _, r := range p.PreTokenizers {
			s, bl, err := parsePreTokenizer(r)
			if err != nil {
				return nil, false, err
			}
			byteLevel = byteLevel || bl
			if b, ok := s.(byteLevelPre); ok && !b.addPrefixSpace && b.pattern == nil {
				continue // keeps every word as it is
			}
			seq = append(seq, s)
		}
		switch len(seq) {
		case 0:
			return whole{}, byteLevel, nil
		case 1:
			return seq[0], byteLevel, nil
		}
		return seq, byteLevel, nil
	case "Split":
		if p.Pattern.Regex == nil {
			return nil, false, fmt.Errorf("pre_tokenizer Split: only the regex patterns of known models are implemented, not %s", raw)
		}
		f, ok := splitters[*p.Pattern.Regex]
		if !ok {
			return nil, false, fmt.Errorf("pre_tokenizer Split: pattern %q is not one of the implemented patterns", *p.Pattern.Regex)
		}
		if p.Behavior != "Isolated" || p.Invert {
			return nil, false, fmt.Errorf("pre_tokenizer Split: behavior %q (invert %v) is not implemented, only Isolated", p.Behavior, p.Invert)
		}
		return splitter(f), false, nil
	case "ByteLevel":
		b := byteLevelPre{addPrefixSpace: p.AddPrefixSpace}
		if p.UseRegex == nil || *p.UseRegex {
			b.pattern = splitGPT2
		}
		return b, true, nil
	case "Metaspace":
		m := metaspace{replacement: p.Replacement, scheme: p.PrependScheme, cut: p.Split == nil || *p.Split}
		if m.replacement == "" {
			m.replacement = "\u2581"
		}
		switch m.scheme {
		case "":
			m.scheme = "always"
		case "always", "first", "never":
		default:
			return nil, false, fmt.Errorf("pre_tokenizer Metaspace: prepend_scheme %q is unknown", m.scheme)
		}
		return m, false, nil
	}
	return nil, false, fmt.Errorf("pre_tokenizer type %q is not implemented", p.Type)
}

// whole keeps a segment as one word.
type whole struct{}

func (whole) split(s string, _ bool, emit func(string)) {
	if s != "" {
		emit(s)
	}
}

// sequence applies pre-tokenizers one after another, each to the words
// of the one before.
type sequence []preTokenizer

func (q sequence) split(s string, first bool, emit func(string)) {
	q.from(0, s, first, emit)
}

func (q sequence) from(i int, s string, first bool, emit func(string)) {
	if i == len(q) {
		emit(s)
		return
	}
	q[i].split(s, first, func(w string) { q.from(i+1, w, first, emit) })
}

// splitter isolates the pieces a pattern's splitFunc finds.
type splitter splitFunc

func (f splitter) split(s string, _ bool, emit func(string)) {
	for i := 0; i < len(s); {
		end := f(s, i)
		emit(s[i:end])
		i = end
	}
}

// byteLevelPre is the ByteLevel pre-tokenizer: the byte mapping itself is
// the model's (it encodes raw bytes); this prepends the prefix space and,
// with use_regex, splits with GPT-2's pattern.
type byteLevelPre struct {
	addPrefixSpace bool
	pattern        splitFunc // nil without use_regex
}

func (b byteLevelPre) split(s string, _ bool, emit func(string)) {
	if b.addPrefixSpace && s != "" && s[0] != ' ' {
		s = " " + s
	}
	if b.pattern == nil {
		if s != "" {
			emit(s)
		}
		return
	}
	splitter(b.pattern).split(s, false, emit)
}

// metaspace replaces spaces with the replacement character, prepends one
// to the segment as its scheme says, and with split cuts before each.
type metaspace struct {
	replacement string
	scheme      string
	cut         bool
}

func (m metaspace) split(s string, first bool, emit func(string)) {
	s = strings.ReplaceAll(s, " ", m.replacement)
	if m.scheme == "always" || m.scheme == "first" && first {
		if !strings.HasPrefix(s, m.replacement) {
			s = m.replacement + s
		}
	}
	if !m.cut {
		if s != "" {
			emit(s)
		}
		return
	}
	start := 0
	for i := 0; i < len(s); {
		if i > start && strings.HasPrefix(s[i:], m.replacement) {
			emit(s[start:i])
			start = i
		}
		if strings.HasPrefix(s[i:], m.replacement) {
			i += len(m.replacement)
		} else {
			i++
		}
	}
	if start < len(s) {
		emit(s[start:])
	}
}
