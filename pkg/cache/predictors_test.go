package cache

import "testing"

// servedModels stands for the Store's models in unit tests.
type servedModels map[string]bool

func (m servedModels) HasModel(model string) bool { return m[model] }

func TestPruneDropsThePredictorsOfModelsThatLeft(t *testing.T) {
	served := servedModels{"llama": true, "qwen": true}
	ps, err := NewOutputPredictors(served, PredictorConfig{})
	if err != nil {
		t.Fatal(err)
	}
	llama, _ := ps.GetOutputPredictor("llama")
	qwen, _ := ps.GetOutputPredictor("qwen")
	delete(served, "qwen")
	ps.Prune()
	if p, err := ps.GetOutputPredictor("llama"); err != nil || p != llama {
		t.Errorf("the predictor of a model still served was replaced: %p, %v", p, err)
	}
	if _, err := ps.GetOutputPredictor("qwen"); err == nil {
		t.Error("a model no pod serves has a predictor")
	}
	served["qwen"] = true
	if p, err := ps.GetOutputPredictor("qwen"); err != nil || p == qwen {
		t.Errorf("the predictor of a model back in the fleet: %p, %v; want a new one", p, err)
	}
}

// leavingModels serves a model until the first check that it is served:
// it then leaves the fleet, which prunes the predictors, before the
// answer reaches the caller.
type leavingModels struct {
	served bool
	left   func()
}

func (m *leavingModels) HasModel(string) bool {
	if !m.served {
		return false
	}
	m.served = false
	m.left()
	return true
}

func TestAModelLeavingAsItsPredictorIsCreatedKeepsNone(t *testing.T) {
	models := &leavingModels{served: true}
	ps, err := NewOutputPredictors(models, PredictorConfig{})
	if err != nil {
		t.Fatal(err)
	}
	models.left = ps.Prune
	_, _ = ps.GetOutputPredictor("llama")
	if h := ps.Histograms(); len(h) != 0 {
		t.Errorf("predictors of %d models kept after the model left; want none", len(h))
	}
}
