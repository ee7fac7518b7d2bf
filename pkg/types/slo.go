package types

import (
	"fmt"
	"strings"
	"time"
)

// SLO is the service-level objective of a request: the latencies it is to
// be served within, each counted from its arrival at the gateway. A zero
// field sets no target of its kind, and the zero SLO none at all.
type SLO struct {
	// TTFT bounds the time to the first token: TTFT, plus
	// TTFTPerPromptToken for each prompt token, so that one objective fits
	// short and long prompts alike.
	TTFT               time.Duration
	TTFTPerPromptToken time.Duration
	// TPOT bounds the mean time between output tokens.
	TPOT time.Duration
	// E2E bounds the time to the last token.
	E2E time.Duration
}

// IsZero reports whether s sets no target.
func (s SLO) IsZero() bool { return s == SLO{} }

// TTFTFor returns the time-to-first-token target of a prompt of
// promptTokens tokens, 0 when s sets none.
func (s SLO) TTFTFor(promptTokens int) time.Duration {
	if s.TTFT == 0 && s.TTFTPerPromptToken == 0 {
		return 0
	}
	return s.TTFT + time.Duration(promptTokens)*s.TTFTPerPromptToken
}

// Validate reports a negative target.
func (s SLO) Validate() error {
	var neg []string
	for _, f := range []struct {
		name string
		v    time.Duration
	}{{"ttft", s.TTFT}, {"ttft per prompt token", s.TTFTPerPromptToken}, {"tpot", s.TPOT}, {"e2e", s.E2E}} {
		if f.v < 0 {
			neg = append(neg, fmt.Sprintf("%s %v", f.name, f.v))
		}
	}
	if len(neg) > 0 {
		return fmt.Errorf("negative SLO targets: %s", strings.Join(neg, ", "))
	}
	return nil
}

// String formats s as ParseSLO reads it, "none" for the zero SLO.
func (s SLO) String() string {
	var parts []string
	for _, f := range []struct {
		name string
		v    time.Duration
	}{{"ttft", s.TTFT}, {"ttft-per-token", s.TTFTPerPromptToken}, {"tpot", s.TPOT}, {"e2e", s.E2E}} {
		if f.v != 0 {
			parts = append(parts, f.name+":"+f.v.String())
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ",")
}

// ParseSLO reads an SLO written as comma-separated kind:duration pairs,
// kind being ttft, ttft-per-token, tpot or e2e and duration a Go duration
// ("2s", "150us"), e.g. "ttft:1s,ttft-per-token:200us,tpot:50ms". "none"
// and "" are the zero SLO. It fails on an unknown kind, a kind given twice,
// or a duration that does not parse or is not positive.
func ParseSLO(text string) (SLO, error) {
	var s SLO
	text = strings.TrimSpace(text)
	if text == "" || text == "none" {
		return s, nil
	}
	seen := map[string]bool{}
	for _, part := range strings.Split(text, ",") {
		kind, value, ok := strings.Cut(strings.TrimSpace(part), ":")
		kind = strings.ToLower(strings.TrimSpace(kind))
		if !ok {
			return SLO{}, fmt.Errorf("SLO %q: %q is not kind:duration", text, part)
		}
		d, err := time.ParseDuration(strings.TrimSpace(value))
		if err != nil {
			return SLO{}, fmt.Errorf("SLO %q: %s: %w", text, kind, err)
		}
		if d <= 0 {
			return SLO{}, fmt.Errorf("SLO %q: %s %v is not positive", text, kind, d)
		}
		if seen[kind] {
			return SLO{}, fmt.Errorf("SLO %q: %s given twice", text, kind)
		}
		seen[kind] = true
		switch kind {
		case "ttft":
			s.TTFT = d
		case "ttft-per-token":
			s.TTFTPerPromptToken = d
		case "tpot":
			s.TPOT = d
		case "e2e":
			s.E2E = d
		default:
			return SLO{}, fmt.Errorf("SLO %q: unknown kind %q (known: ttft, ttft-per-token, tpot, e2e)", text, kind)
		}
	}
	return s, nil
}
