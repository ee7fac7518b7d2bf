package discovery

import (
	"sync"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// InferenceObjectiveResource is the resource of the Gateway API Inference
// Extension's InferenceObjectives that InferencePoolSource watches when it
// is given an Objectives to fill.
var InferenceObjectiveResource = schema.GroupVersionResource{Group: "inference.networking.x-k8s.io", Version: "v1alpha2",
	Resource: "inferenceobjectives"}

// The group and kind of the pool an InferenceObjective's or
// InferenceModelRewrite's poolRef names when it gives none.
const (
	defaultPoolRefGroup = "inference.networking.k8s.io"
	defaultPoolRefKind  = "InferencePool"
)

// MaxInferenceObjectives bounds the InferenceObjectives an Objectives
// keeps. An objective arriving beyond it is ignored, and counted (see
// Objectives.Dropped), until an update of it finds room.
const MaxInferenceObjectives = 10000

// Objectives is the look-up of the priorities of the Gateway API Inference
// Extension's InferenceObjectives (inference.networking.x-k8s.io/v1alpha2)
// that InferencePoolSource fills as it watches them. Its methods are safe
// for concurrent use.
//
// An objective counts only while the pool its poolRef names is one the
// source follows: an InferencePool of the objective's namespace, among
// InferencePoolSource.Pools when those are named. An objective naming
// another pool, or another kind of pool, is ignored. A name may be taken
// by objectives of several namespaces, which kvgate cannot tell apart by
// the request's header alone: the lowest of their priorities holds, so
// that a request is never ranked above what any of them grants. At most
// MaxInferenceObjectives objectives are kept.
type Objectives struct {
	mu sync.RWMutex
	// byName holds the objectives kept, by name, then namespace.
	byName map[string]map[string]objective
	kept   int
	// served holds the pools the source follows.
	served map[types.NamespacedName]bool
	// priority holds the priority each name resolves to, for the names of
	// at least one objective of a served pool.
	priority map[string]int
	dropped  atomic.Int64
}

// objective is what Objectives keeps of one InferenceObjective.
type objective struct {
	// pool is the InferencePool it names; the zero name for a reference to
	// another kind of pool.
	pool     types.NamespacedName
	priority int
}

// NewObjectives returns an empty Objectives: every look-up finds nothing
// until a source fills it.
func NewObjectives() *Objectives {
	return &Objectives{byName: map[string]map[string]objective{}, served: map[types.NamespacedName]bool{},
		priority: map[string]int{}}
}

// Priority returns the priority of the InferenceObjective named name, and
// whether one of that name counts (see Objectives); 0 and false when none
// does. It allocates nothing.
func (o *Objectives) Priority(name string) (int, bool) {
	o.mu.RLock()
	p, ok := o.priority[name]
	o.mu.RUnlock()
	return p, ok
}

// Dropped returns how many times an objective was ignored because
// MaxInferenceObjectives were kept already.
func (o *Objectives) Dropped() int64 { return o.dropped.Load() }

// Len returns the number of objectives kept, whether their pools are
// served or not.
func (o *Objectives) Len() int {
	o.mu.RLock()
	defer o.mu.RUnlock()
	return o.kept
}

// set keeps the objective u, replacing the one of its name and namespace.
// It reports false, having counted the drop, when it is new and
// MaxInferenceObjectives are kept already.
func (o *Objectives) set(u *unstructured.Unstructured) bool {
	obj := objectiveOf(u)
	name, ns := u.GetName(), u.GetNamespace()
	o.mu.Lock()
	defer o.mu.Unlock()
	byNS := o.byName[name]
	if _, had := byNS[ns]; !had {
		if o.kept >= MaxInferenceObjectives {
			o.dropped.Add(1)
			return false
		}
		if byNS == nil {
			byNS = map[string]objective{}
			o.byName[name] = byNS
		}
		o.kept++
	}
	byNS[ns] = obj
	o.resolveLocked(name)
	return true
}

// remove forgets the objective of name in namespace ns.
func (o *Objectives) remove(ns, name string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	byNS := o.byName[name]
	if _, had := byNS[ns]; !had {
		return
	}
	delete(byNS, ns)
	o.kept--
	if len(byNS) == 0 {
		delete(o.byName, name)
	}
	o.resolveLocked(name)
}

// setServed records whether the source follows the pool of key.
func (o *Objectives) setServed(key types.NamespacedName, served bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.served[key] == served {
		return
	}
	if served {
		o.served[key] = true
	} else {
		delete(o.served, key)
	}
	for name, byNS := range o.byName {
		if _, refers := byNS[key.Namespace]; refers {
			o.resolveLocked(name)
		}
	}
}

// resolveLocked recomputes the priority name resolves to.
func (o *Objectives) resolveLocked(name string) {
	found, lowest := false, 0
	for _, obj := range o.byName[name] {
		if obj.pool.Name == "" || !o.served[obj.pool] {
			continue
		}
		if !found || obj.priority < lowest {
			found, lowest = true, obj.priority
		}
	}
	if found {
		o.priority[name] = lowest
	} else {
		delete(o.priority, name)
	}
}

// objectiveOf reads the spec of the InferenceObjective u: its priority (0
// when unset) and the InferencePool of its namespace its poolRef names (the
// zero name when it names another group or kind).
func objectiveOf(u *unstructured.Unstructured) objective {
	var obj objective
	if p, found, err := unstructured.NestedInt64(u.Object, "spec", "priority"); found && err == nil {
		obj.priority = int(p)
	}
	group, _, _ := unstructured.NestedString(u.Object, "spec", "poolRef", "group")
	kind, _, _ := unstructured.NestedString(u.Object, "spec", "poolRef", "kind")
	name, _, _ := unstructured.NestedString(u.Object, "spec", "poolRef", "name")
	if group == "" {
		group = defaultPoolRefGroup
	}
	if kind == "" {
		kind = defaultPoolRefKind
	}
	if group == defaultPoolRefGroup && kind == defaultPoolRefKind && name != "" {
		obj.pool = types.NamespacedName{Namespace: u.GetNamespace(), Name: name}
	}
	return obj
}
