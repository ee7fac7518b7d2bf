package cache

import (
	"cmp"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kvgate/kvgate/pkg/inflight"
)

// Defaults of PredictorConfig's zero fields.
const (
	DefaultPredictorMaxTokens = 1 << 20
	DefaultPredictorWindow    = 240 * time.Second
)

// PredictorConfig sizes the SimpleOutputPredictor of each model.
type PredictorConfig struct {
	// MaxInputTokens, MaxOutputTokens and Window size each model's
	// predictor (defaults 1Mi, 1Mi, 240 s).
	MaxInputTokens  int
	MaxOutputTokens int
	Window          time.Duration
	// ColdPrediction is the predictors' strategy for unseen input sizes.
	ColdPrediction ColdPredictionStrategy
}

// OutputPredictors keeps one SimpleOutputPredictor per model served,
// created on first use and fed with the token usage of the requests that
// complete (see Observer). All its methods are safe for concurrent use.
type OutputPredictors struct {
	models     interface{ HasModel(string) bool }
	cfg        PredictorConfig
	predictors sync.Map // model -> *SimpleOutputPredictor
}

// NewOutputPredictors returns the predictors of the models models serves
// (the Store), configured by cfg. It fails when cfg is invalid.
func NewOutputPredictors(models interface{ HasModel(string) bool }, cfg PredictorConfig) (*OutputPredictors, error) {
	cfg.MaxInputTokens = cmp.Or(cfg.MaxInputTokens, DefaultPredictorMaxTokens)
	cfg.MaxOutputTokens = cmp.Or(cfg.MaxOutputTokens, DefaultPredictorMaxTokens)
	cfg.Window = cmp.Or(cfg.Window, DefaultPredictorWindow)
	if cfg.MaxInputTokens < 0 || cfg.MaxOutputTokens < 0 || cfg.Window < 0 {
		return nil, errors.New("invalid predictor config: token maxima and window must be positive")
	}
	return &OutputPredictors{models: models, cfg: cfg}, nil
}

// GetOutputPredictor returns the output predictor of modelName, created on
// first use. It fails with a *ModelNotFoundError when no registered pod
// serves the model, also when the model leaves the fleet (and Prune runs)
// as its predictor is created: no predictor outlives it.
func (p *OutputPredictors) GetOutputPredictor(modelName string) (*SimpleOutputPredictor, error) {
	if pr, ok := p.predictors.Load(modelName); ok {
		return pr.(*SimpleOutputPredictor), nil
	}
	if !p.models.HasModel(modelName) {
		return nil, &ModelNotFoundError{Model: modelName}
	}
	pr, loaded := p.predictors.LoadOrStore(modelName, NewSimpleOutputPredictor(
		p.cfg.MaxInputTokens, p.cfg.MaxOutputTokens, p.cfg.Window, WithColdPrediction(p.cfg.ColdPrediction)))
	if !loaded && !p.models.HasModel(modelName) {
		// The model left between the check and the store, and a Prune
		// may have run before the store: drop what it could not see.
		p.predictors.CompareAndDelete(modelName, pr)
		return nil, &ModelNotFoundError{Model: modelName}
	}
	return pr.(*SimpleOutputPredictor), nil
}

// Prune drops the predictors of the models no registered pod serves any
// more: a model that left the fleet starts afresh if it comes back.
func (p *OutputPredictors) Prune() {
	p.predictors.Range(func(model, _ any) bool {
		if !p.models.HasModel(model.(string)) {
			p.predictors.Delete(model)
		}
		return true
	})
}

// Observer returns the request ledger observer that feeds the predictors:
// an attempt closed as done with its usage reported adds its prompt and
// completion tokens to its model's predictor.
func (p *OutputPredictors) Observer() inflight.Observer {
	return inflight.Observer{Closed: func(h *inflight.Handle) {
		u, ok := h.Usage()
		if o, _ := h.Outcome(); !ok || o != inflight.Done {
			return
		}
		if pr, err := p.GetOutputPredictor(h.Request().Model()); err == nil {
			pr.AddTrace(int(u.PromptTokens), int(u.CompletionTokens), 1)
		}
	}}
}

// HistogramSize is the number of counts of every predictor's histogram
// (see SimpleOutputPredictor.Histogram): input by output buckets.
func (p *OutputPredictors) HistogramSize() int {
	return (log2Bucket(p.cfg.MaxInputTokens) + 1) * (log2Bucket(p.cfg.MaxOutputTokens) + 1)
}

// Histograms returns, per model, the own history of its predictor (see
// SimpleOutputPredictor.Histogram), for the other gateway replicas.
func (p *OutputPredictors) Histograms() map[string][]int32 {
	out := map[string][]int32{}
	p.predictors.Range(func(k, v any) bool {
		out[k.(string)] = v.(*SimpleOutputPredictor).Histogram()
		return true
	})
	return out
}

// SetRemoteHistograms sets, per model, the other gateway replicas' history
// on its predictor (created for a model served here and not yet
// predicted), and clears it on the predictors of models h leaves out. It
// returns the error of every histogram that did not fit its predictor,
// whose remote history is then cleared (see
// SimpleOutputPredictor.SetRemoteHistogram).
func (p *OutputPredictors) SetRemoteHistograms(h map[string][]int32) error {
	var errs []error
	p.predictors.Range(func(k, v any) bool {
		if _, ok := h[k.(string)]; !ok {
			_ = v.(*SimpleOutputPredictor).SetRemoteHistogram(nil)
		}
		return true
	})
	for model, hist := range h {
		pr, err := p.GetOutputPredictor(model)
		if err != nil {
			continue
		}
		if err := pr.SetRemoteHistogram(hist); err != nil {
			errs = append(errs, fmt.Errorf("model %q: %w", model, err))
		}
	}
	return errors.Join(errs...)
}
