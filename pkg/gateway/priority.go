package gateway

import "github.com/kvgate/kvgate/pkg/types"

// HeaderInferenceObjective names the Gateway API Inference Extension's
// InferenceObjective a request belongs to, whose priority ranks it among
// the requests of its pool (types.RoutingContext.Priority).
const HeaderInferenceObjective = "X-Gateway-Inference-Objective"

// MaxObjectiveNameBytes bounds the name HeaderInferenceObjective may carry,
// the longest name of a Kubernetes object. A longer value, or one that is
// not a Kubernetes object name (lower-case letters, digits, '-' and '.',
// starting and ending with a letter or digit), is ignored: the request has
// priority 0, and it is counted in
// kvgate_gateway_invalid_inference_objectives_total.
const MaxObjectiveNameBytes = 253

// HeaderFairnessID names the flow a request belongs to among the requests
// of its priority, after the Gateway API Inference Extension's flow
// control: e.g. a tenant (types.RoutingContext.FairnessID). A model's SLO
// queue takes turns among the flows waiting at one priority when
// KVGATE_SLO_QUEUE_FAIRNESS is round-robin. A request without it joins the
// default flow, as does one whose value is longer than
// types.MaxFairnessIDBytes or holds a byte that is not printable ASCII:
// that one is counted in kvgate_gateway_invalid_fairness_ids_total.
const HeaderFairnessID = "X-Gateway-Inference-Fairness-Id"

// ObjectivePriorities looks up InferenceObjectives by name: the priority of
// the objective of that name, and whether one counts. Its Priority is
// called on every request naming an objective, concurrently.
type ObjectivePriorities interface {
	Priority(name string) (int, bool)
}

// priority returns the priority of a request whose
// HeaderInferenceObjective is name ("" for none): its objective's, 0 when
// it names none, an unknown one or an invalid name (counted), or when the
// gateway reads no objectives.
func (g *Gateway) priority(name string) int {
	if name == "" {
		return 0
	}
	if !validObjectiveName(name) {
		g.metrics.invalidObjectives.Inc()
		return 0
	}
	if g.priorities == nil {
		return 0
	}
	p, _ := g.priorities.Priority(name)
	return p
}

// validObjectiveName reports whether name can be a Kubernetes object's
// name: at most MaxObjectiveNameBytes bytes of lower-case letters, digits,
// '-' and '.', starting and ending with a letter or digit.
func validObjectiveName(name string) bool {
	if len(name) == 0 || len(name) > MaxObjectiveNameBytes {
		return false
	}
	for i := range len(name) {
		c := name[i]
		alnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		if !alnum && (c != '-' && c != '.' || i == 0 || i == len(name)-1) {
			return false
		}
	}
	return true
}

// fairnessID returns the flow of a request whose HeaderFairnessID is id
// ("" for none): id, or "" (the default flow) when id is not a valid
// types.RoutingContext.FairnessID (counted).
func (g *Gateway) fairnessID(id string) string {
	if !types.ValidFairnessID(id) {
		g.metrics.invalidFairnessIDs.Inc()
		return ""
	}
	return id
}
