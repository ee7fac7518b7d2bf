package hf

import (
	"encoding/json"
	"fmt"
)

// postProcessor holds the ids a post-processor puts around a sequence
// when special tokens are added.
type postProcessor struct {
	prefix, suffix []uint32
}

type postJSON struct {
	Type          string            `json:"type"`
	Processors    []json.RawMessage `json:"processors"`
	Single        []templatePiece   `json:"single"`
	SpecialTokens map[string]struct {
		IDs []uint32 `json:"ids"`
	} `json:"special_tokens"`
	CLS []json.RawMessage `json:"cls"`
	SEP []json.RawMessage `json:"sep"`
}

type templatePiece struct {
	SpecialToken *struct {
		ID string `json:"id"`
	} `json:"SpecialToken"`
	Sequence *struct {
		ID string `json:"id"`
	} `json:"Sequence"`
}

// parsePostProcessor reads the post-processor raw describes into p.
func parsePostProcessor(raw json.RawMessage, p *postProcessor) error {
	if !present(raw) {
		return nil
	}
	var j postJSON
	if err := json.Unmarshal(raw, &j); err != nil {
		return fmt.Errorf("post_processor: %w", err)
	}
	switch j.Type {
	case "ByteLevel": // offsets only
		return nil
	case "Sequence":
		for _, r := range j.Processors {
			if err := parsePostProcessor(r, p); err != nil {
				return err
			}
		}
		return nil
	case "TemplateProcessing":
		seen := false
		for _, piece := range j.Single {
			switch {
			case piece.Sequence != nil:
				if seen {
					return fmt.Errorf("post_processor TemplateProcessing: the single template holds more than one sequence")
				}
				seen = true
			case piece.SpecialToken != nil:
				tok, ok := j.SpecialTokens[piece.SpecialToken.ID]
				if !ok {
					return fmt.Errorf("post_processor TemplateProcessing: special token %q is not defined", piece.SpecialToken.ID)
				}
				if seen {
					p.suffix = append(p.suffix, tok.IDs...)
				} else {
					p.prefix = append(p.prefix, tok.IDs...)
				}
			}
		}
		if !seen {
			return fmt.Errorf("post_processor TemplateProcessing: the single template holds no sequence")
		}
		return nil
	case "RobertaProcessing", "BertProcessing":
		cls, err := tokenPairID(j.CLS)
		if err != nil {
			return fmt.Errorf("post_processor %s cls: %w", j.Type, err)
		}
		sep, err := tokenPairID(j.SEP)
		if err != nil {
			return fmt.Errorf("post_processor %s sep: %w", j.Type, err)
		}
		p.prefix = append(p.prefix, cls)
		p.suffix = append(p.suffix, sep)
		return nil
	}
	return fmt.Errorf("post_processor type %q is not implemented", j.Type)
}

// tokenPairID reads the id of a ["token", id] pair.
func tokenPairID(pair []json.RawMessage) (uint32, error) {
	var id uint32
	if len(pair) != 2 {
		return 0, fmt.Errorf("want [token, id], got %d values", len(pair))
	}
	if err := json.Unmarshal(pair[1], &id); err != nil {
		return 0, err
	}
	return id, nil
}
