package hf

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Files a model's tokenizer directory holds, as Hugging Face model
// repositories name them.
const (
	// TokenizerFile is the tokenizer itself; required.
	TokenizerFile = "tokenizer.json"
	// ConfigFile holds the chat template (chat_template) and the special
	// tokens the template reads (bos_token, eos_token, ...); optional.
	ConfigFile = "tokenizer_config.json"
	// TemplateFile holds the chat template on its own; optional, and
	// preferred to the config's.
	TemplateFile = "chat_template.jinja"
)

type fileJSON struct {
	AddedTokens   []addedToken    `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Model         modelJSON       `json:"model"`
}

type modelJSON struct {
	Type                    string            `json:"type"`
	Vocab                   map[string]uint32 `json:"vocab"`
	Merges                  json.RawMessage   `json:"merges"`
	UnkToken                *string           `json:"unk_token"`
	ByteFallback            bool              `json:"byte_fallback"`
	FuseUnk                 bool              `json:"fuse_unk"`
	IgnoreMerges            bool              `json:"ignore_merges"`
	ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
	Dropout                 *float64          `json:"dropout"`
}

// Load reads the tokenizer files in dir: TokenizerFile, and ConfigFile and
// TemplateFile when present. It fails when a file cannot be read or
// parsed, or describes a tokenizer this package does not implement; the
// error says which part.
func Load(dir string) (*Tokenizer, error) {
	tok, err := os.ReadFile(filepath.Join(dir, TokenizerFile))
	if err != nil {
		return nil, err
	}
	cfg, err := os.ReadFile(filepath.Join(dir, ConfigFile))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	tmpl, err := os.ReadFile(filepath.Join(dir, TemplateFile))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	t, err := Parse(tok, cfg, string(tmpl))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	return t, nil
}

// Parse builds a Tokenizer from the contents of the tokenizer files:
// tokenizerJSON is required; configJSON and template may be empty. A
// non-empty template replaces the config's chat_template.
func Parse(tokenizerJSON, configJSON []byte, template string) (*Tokenizer, error) {
	var f fileJSON
	if err := json.Unmarshal(tokenizerJSON, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", TokenizerFile, err)
	}
	t := &Tokenizer{}
	var err error
	if t.normalize, err = parseNormalizer(f.Normalizer); err != nil {
		return nil, fmt.Errorf("%s: %w", TokenizerFile, err)
	}
	var byteLevel bool
	if t.pre, byteLevel, err = parsePreTokenizer(f.PreTokenizer); err != nil {
		return nil, fmt.Errorf("%s: %w", TokenizerFile, err)
	}
	if err := parsePostProcessor(f.PostProcessor, &t.post); err != nil {
		return nil, fmt.Errorf("%s: %w", TokenizerFile, err)
	}
	if t.model, err = newBPE(f.Model, byteLevel); err != nil {
		return nil, fmt.Errorf("%s: model: %w", TokenizerFile, err)
	}
	for _, id := range t.model.vocab {
		t.vocabSize = max(t.vocabSize, id+1)
	}
	var raw, normalized []addedToken
	for _, a := range f.AddedTokens {
		if len(a.Content) > MaxAddedTokenBytes {
			return nil, fmt.Errorf("%s: added token %d is %d bytes long, more than the %d implemented",
				TokenizerFile, a.ID, len(a.Content), MaxAddedTokenBytes)
		}
		t.vocabSize = max(t.vocabSize, a.ID+1)
		if a.Normalized && !a.Special {
			normalized = append(normalized, a)
		} else {
			raw = append(raw, a)
		}
	}
	t.rawAdded, t.normAdded = newMatcher(raw), newMatcher(normalized)
	t.segments = newSegmentCache(DefaultSegmentCacheBytes)
	if err := t.parseConfig(configJSON, template); err != nil {
		return nil, err
	}
	return t, nil
}

// newBPE builds the model; byteLevel says whether its vocabulary is
// written in the byte-level alphabet.
func newBPE(j modelJSON, byteLevel bool) (*bpe, error) {
	if j.Type != "BPE" {
		return nil, fmt.Errorf("type %q is not implemented, only BPE", j.Type)
	}
	if j.Dropout != nil && *j.Dropout != 0 {
		return nil, errors.New("BPE dropout is not deterministic")
	}
	if j.ContinuingSubwordPrefix != nil && *j.ContinuingSubwordPrefix != "" ||
		j.EndOfWordSuffix != nil && *j.EndOfWordSuffix != "" {
		return nil, errors.New("continuing_subword_prefix and end_of_word_suffix are not implemented")
	}
	m := &bpe{
		vocab: make(map[string]uint32, len(j.Vocab)), byteLevel: byteLevel,
		byteFallback: j.ByteFallback, fuseUnk: j.FuseUnk, ignoreMerges: j.IgnoreMerges,
		words: newWordCache(),
	}
	for tok, id := range j.Vocab {
		if byteLevel {
			b, ok := fromByteLevel(tok)
			if !ok {
				return nil, fmt.Errorf("vocabulary token %q is not written in the byte-level alphabet", tok)
			}
			tok = b
		}
		m.vocab[tok] = id
	}
	if j.UnkToken != nil {
		id, ok := m.vocab[*j.UnkToken]
		if !ok {
			return nil, fmt.Errorf("unk_token %q is not in the vocabulary", *j.UnkToken)
		}
		m.unk, m.hasUnk = id, true
	}
	m.splitWords = !byteLevel && startsWords(m.vocab)
	for b := range 256 {
		var tok string
		switch {
		case byteLevel:
			tok = string([]byte{byte(b)})
		case j.ByteFallback:
			tok = fmt.Sprintf("<0x%02X>", b)
		default:
			continue
		}
		id, ok := m.vocab[tok]
		if !ok {
			return nil, fmt.Errorf("byte %#02x has no token (%q)", b, tok)
		}
		m.byteIDs[b] = id
	}
	merges, err := parseMerges(j.Merges)
	if err != nil {
		return nil, err
	}
	m.merges = make(map[uint64]merge, len(merges))
	for rank, pair := range merges {
		left, right := pair[0], pair[1]
		if byteLevel {
			var ok1, ok2 bool
			left, ok1 = fromByteLevel(left)
			right, ok2 = fromByteLevel(right)
			if !ok1 || !ok2 {
				return nil, fmt.Errorf("merge %d %q is not written in the byte-level alphabet", rank, pair)
			}
		}
		l, ok1 := m.vocab[left]
		r, ok2 := m.vocab[right]
		id, ok3 := m.vocab[left+right]
		if !ok1 || !ok2 || !ok3 {
			return nil, fmt.Errorf("merge %d %q names a token missing from the vocabulary", rank, pair)
		}
		if _, dup := m.merges[pairKey(l, r)]; !dup {
			m.merges[pairKey(l, r)] = merge{rank: uint32(rank), id: id}
		}
	}
	return m, nil
}

// parseMerges reads merges written as "left right" strings or as
// [left, right] pairs.
func parseMerges(raw json.RawMessage) ([][2]string, error) {
	var pairs [][2]string
	if err := json.Unmarshal(raw, &pairs); err == nil {
		return pairs, nil
	}
	var lines []string
	if err := json.Unmarshal(raw, &lines); err != nil {
		return nil, fmt.Errorf("merges are neither strings nor pairs: %w", err)
	}
	pairs = make([][2]string, len(lines))
	for i, l := range lines {
		left, right, ok := strings.Cut(l, " ")
		if !ok {
			return nil, fmt.Errorf("merge %d %q is not two tokens", i, l)
		}
		pairs[i] = [2]string{left, right}
	}
	return pairs, nil
}
