package cache

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
)

// ModelGPUNameTemplate formats the Redis key of a GPU profile from a model
// and a deployment name.
const ModelGPUNameTemplate = "aibrix:profile_%s_%s"

// SignatureTolerance places the boundary between two neighbouring profile
// indexes, on the log2 scale: a feature below
// lower + (upper-lower)*SignatureTolerance maps to the lower index. 0.5 is
// neutral; smaller values prefer the upper index.
const SignatureTolerance = 0.5

// Bounds of a decoded profile, which Unmarshal refuses to exceed: the
// optimizer writes two index dimensions (output tokens, input tokens) of a
// dozen values each, and tables of as many rows and columns. A profile
// within them holds at most 4 tables of 64 by 64 values, 128 KiB.
const (
	MaxProfileIndexDimensions = 2
	MaxProfileIndexValues     = 64
)

// Errors of a profile lacking the table asked for.
var (
	ErrProfileNoThroughput = errors.New("profile has no throughput data")
	ErrProfileNoE2E        = errors.New("profile has no E2E latency data")
	ErrProfileNoTTFT       = errors.New("profile has no TTFT data")
	ErrProfileNoTPOT       = errors.New("profile has no TPOT data")
)

// ModelGPUProfile is the performance profile of one model on one GPU
// deployment, as AIBrix's GPU optimizer writes it to Redis under
// ModelGPUProfileKey. Its tables are indexed by a signature (see
// GetSignature): table[signature[0]][signature[1]].
type ModelGPUProfile struct {
	Deployment string      `json:"gpu"`     // Deployment that runs the model on the GPU.
	Cost       float64     `json:"cost"`    // Dollar cost of the GPU per unit of time.
	Tputs      [][]float64 `json:"tputs"`   // Max requests per second per signature.
	Indexes    [][]float64 `json:"indexes"` // Ascending feature values per dimension: [output tokens, input tokens].
	Created    float64     `json:"created"` // When the profile was generated, Unix seconds.
	E2E        [][]float64 `json:"e2e"`     // Mean end-to-end latency in seconds per signature.
	TTFT       [][]float64 `json:"ttft"`    // Mean time to first token in seconds per signature.
	TPOT       [][]float64 `json:"tpot"`    // Mean time per output token in seconds per signature.
	SLOs       ModelSLOs   `json:"slos"`    // SLOs the profile was generated for.
}

// ModelSLOs are the service level objectives of a profile.
type ModelSLOs struct {
	Percentile int     `json:"percentile"` // Percentile the SLOs apply to.
	TPUT       float64 `json:"tput"`       // Request throughput, requests per second.
	TT         float64 `json:"tt"`         // Token throughput.
	E2E        float64 `json:"e2e"`        // End-to-end latency.
	TTFT       float64 `json:"ttft"`       // Time to first token.
	TPAT       float64 `json:"tpat"`       // Time per token of prompt and output.
	TPOT       float64 `json:"tpot"`       // Time per output token.
}

// ModelGPUProfileKey returns the Redis key of the profile of modelName on
// deploymentName.
func ModelGPUProfileKey(modelName, deploymentName string) string {
	return fmt.Sprintf(ModelGPUNameTemplate, modelName, deploymentName)
}

// Unmarshal decodes a profile from its JSON form and checks that every
// index dimension is non-empty, positive and ascending, and that the
// indexes and tables are within MaxProfileIndexDimensions and
// MaxProfileIndexValues. On error pf is left unchanged.
func (pf *ModelGPUProfile) Unmarshal(data []byte) error {
	var p ModelGPUProfile
	if err := json.Unmarshal(data, &p); err != nil {
		return fmt.Errorf("decode GPU profile: %w", err)
	}
	if len(p.Indexes) > MaxProfileIndexDimensions {
		return fmt.Errorf("decode GPU profile: %d index dimensions, more than %d", len(p.Indexes), MaxProfileIndexDimensions)
	}
	for _, t := range []struct {
		name  string
		table [][]float64
	}{{"tputs", p.Tputs}, {"e2e", p.E2E}, {"ttft", p.TTFT}, {"tpot", p.TPOT}} {
		if len(t.table) > MaxProfileIndexValues {
			return fmt.Errorf("decode GPU profile: table %s has %d rows, more than %d", t.name, len(t.table), MaxProfileIndexValues)
		}
		for r, row := range t.table {
			if len(row) > MaxProfileIndexValues {
				return fmt.Errorf("decode GPU profile: row %d of table %s has %d values, more than %d", r, t.name, len(row), MaxProfileIndexValues)
			}
		}
	}
	for d, idx := range p.Indexes {
		if len(idx) == 0 {
			return fmt.Errorf("decode GPU profile: index dimension %d is empty", d)
		}
		if len(idx) > MaxProfileIndexValues {
			return fmt.Errorf("decode GPU profile: index dimension %d has %d values, more than %d", d, len(idx), MaxProfileIndexValues)
		}
		for i, v := range idx {
			if !(v > 0) || (i > 0 && v <= idx[i-1]) {
				return fmt.Errorf("decode GPU profile: index dimension %d is not positive and ascending at %d (%v)", d, i, v)
			}
		}
	}
	*pf = p
	return nil
}

// GetSignature maps feature values (output tokens, input tokens, in the
// order of Indexes) to the indexes of the profile entries that describe
// them. A value between two index values goes to the nearer one on the log2
// scale, as SignatureTolerance sets; values outside the range go to the
// first or last index. It fails for no features, a negative feature, or
// more features than index dimensions.
func (pf *ModelGPUProfile) GetSignature(features ...float64) ([]int, error) {
	if len(features) == 0 {
		return nil, errors.New("profile signature: no features")
	}
	if len(features) > len(pf.Indexes) {
		return nil, fmt.Errorf("profile signature: %d features for %d index dimensions", len(features), len(pf.Indexes))
	}
	sig := make([]int, len(features))
	for d, v := range features {
		if v < 0 || math.IsNaN(v) {
			return nil, fmt.Errorf("profile signature: feature %d is %v, want a non-negative value", d, v)
		}
		idx := pf.Indexes[d]
		if len(idx) == 0 {
			return nil, fmt.Errorf("profile signature: index dimension %d is empty", d)
		}
		upper := sort.SearchFloat64s(idx, v) // first index value >= v
		switch {
		case upper == 0:
			sig[d] = 0
		case upper == len(idx):
			sig[d] = len(idx) - 1
		case idx[upper] == v:
			sig[d] = upper
		default:
			lo, hi := math.Log2(idx[upper-1]), math.Log2(idx[upper])
			if math.Log2(v) < lo+(hi-lo)*SignatureTolerance {
				sig[d] = upper - 1
			} else {
				sig[d] = upper
			}
		}
	}
	return sig, nil
}

// ThroughputRPS returns the maximum requests per second at signature.
func (pf *ModelGPUProfile) ThroughputRPS(signature ...int) (float64, error) {
	return profileValue("throughput", pf.Tputs, ErrProfileNoThroughput, signature)
}

// LatencySeconds returns the mean end-to-end latency at signature.
func (pf *ModelGPUProfile) LatencySeconds(signature ...int) (float64, error) {
	return profileValue("E2E latency", pf.E2E, ErrProfileNoE2E, signature)
}

// TTFTSeconds returns the mean time to first token at signature.
func (pf *ModelGPUProfile) TTFTSeconds(signature ...int) (float64, error) {
	return profileValue("TTFT", pf.TTFT, ErrProfileNoTTFT, signature)
}

// TPOTSeconds returns the mean time per output token at signature.
func (pf *ModelGPUProfile) TPOTSeconds(signature ...int) (float64, error) {
	return profileValue("TPOT", pf.TPOT, ErrProfileNoTPOT, signature)
}

// ProfilePoint is what a profile tells of requests of one shape; a value
// whose table the profile lacks is 0.
type ProfilePoint struct {
	// ThroughputRPS is the most requests per second the deployment serves.
	ThroughputRPS float64
	// E2ESeconds, TTFTSeconds and TPOTSeconds are the mean latencies at
	// that throughput.
	E2ESeconds, TTFTSeconds, TPOTSeconds float64
}

// Point returns the profile's values for requests of outputTokens output
// tokens and inputTokens input tokens (see GetSignature). It fails when the
// signature does not fit the tables.
func (pf *ModelGPUProfile) Point(outputTokens, inputTokens int) (ProfilePoint, error) {
	var pt ProfilePoint
	sig, err := pf.GetSignature(float64(max(outputTokens, 0)), float64(max(inputTokens, 0)))
	if err != nil {
		return pt, err
	}
	for _, f := range []struct {
		table [][]float64
		dst   *float64
	}{{pf.Tputs, &pt.ThroughputRPS}, {pf.E2E, &pt.E2ESeconds}, {pf.TTFT, &pt.TTFTSeconds}, {pf.TPOT, &pt.TPOTSeconds}} {
		if len(f.table) == 0 {
			continue
		}
		if *f.dst, err = profileValue("", f.table, nil, sig); err != nil {
			return ProfilePoint{}, err
		}
	}
	return pt, nil
}

// PendingLoad returns the share of a pod's capacity one request of the
// point's shape takes: 1/(λ·L), λ the throughput and L the latency (see
// PendingLoadProvider). It fails with ErrSLOFailureRequest when the
// throughput is 0, and when the profile has no latency there.
func (pt ProfilePoint) PendingLoad() (float64, error) {
	if pt.ThroughputRPS <= 0 {
		return 0, ErrSLOFailureRequest
	}
	if pt.E2ESeconds <= 0 {
		return 0, fmt.Errorf("GPU profile has latency %v", pt.E2ESeconds)
	}
	return 1 / (pt.ThroughputRPS * pt.E2ESeconds), nil
}

func profileValue(what string, table [][]float64, missing error, sig []int) (float64, error) {
	if len(table) == 0 {
		return 0, missing
	}
	if len(sig) < 2 {
		return 0, fmt.Errorf("profile %s: signature %v has fewer than 2 dimensions", what, sig)
	}
	if sig[0] < 0 || sig[0] >= len(table) || sig[1] < 0 || sig[1] >= len(table[sig[0]]) {
		return 0, fmt.Errorf("profile %s: signature %v outside the table", what, sig)
	}
	return table[sig[0]][sig[1]], nil
}
