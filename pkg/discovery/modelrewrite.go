package discovery

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// InferenceModelRewriteResource is the resource of the Gateway API Inference
// Extension's InferenceModelRewrites that ModelRewriteSource watches.
var InferenceModelRewriteResource = schema.GroupVersionResource{Group: "inference.networking.x-k8s.io",
	Version: "v1alpha2", Resource: "inferencemodelrewrites"}

// Bounds on what ModelRewriteSource and NewRewriteTable keep of the
// InferenceModelRewrites: the oldest MaxModelRewrites rewrites, the first
// MaxRewriteRules rules of each, the first MaxRewriteMatches matches and
// MaxRewriteTargets targets of each rule; a model name (a match's value or
// a target's modelRewrite) longer than MaxModelNameBytes bytes, or empty, is
// dropped. What is dropped is logged.
const (
	MaxModelRewrites  = 1000
	MaxRewriteRules   = 100
	MaxRewriteMatches = 100
	MaxRewriteTargets = 100
	MaxModelNameBytes = 253
	// MaxRewriteWeight bounds a target's weight, as the CRD does.
	MaxRewriteWeight = 1_000_000
)

// InferenceModelRewrite is what kvgate reads of an InferenceModelRewrite
// (inference.networking.x-k8s.io/v1alpha2): the pool it applies to and its
// rules.
type InferenceModelRewrite struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              InferenceModelRewriteSpec `json:"spec"`
}

// InferenceModelRewriteSpec is the spec of an InferenceModelRewrite.
type InferenceModelRewriteSpec struct {
	// PoolRef names the InferencePool of the rewrite's namespace its rules
	// apply to.
	PoolRef PoolReference `json:"poolRef"`
	// Rules are tried in order: the first that matches a model rewrites it.
	Rules []ModelRewriteRule `json:"rules"`
}

// PoolReference names an InferencePool: Group and Kind default to
// inference.networking.k8s.io and InferencePool.
type PoolReference struct {
	Group string `json:"group,omitempty"`
	Kind  string `json:"kind,omitempty"`
	Name  string `json:"name"`
}

// ModelRewriteRule rewrites the models its Matches name to one of its
// Targets; a rule without matches is generic: it matches every model no
// rule names exactly.
type ModelRewriteRule struct {
	Matches []ModelRewriteMatch  `json:"matches,omitempty"`
	Targets []ModelRewriteTarget `json:"targets"`
}

// ModelRewriteMatch matches the model of a request.
type ModelRewriteMatch struct {
	Model struct {
		// Type is Exact, the only type (and the default).
		Type  string `json:"type,omitempty"`
		Value string `json:"value"`
	} `json:"model"`
}

// ModelRewriteTarget is a model a rule rewrites to, chosen with probability
// Weight over the sum of the rule's weights; an unset weight counts as 1.
type ModelRewriteTarget struct {
	ModelRewrite string `json:"modelRewrite"`
	Weight       *int32 `json:"weight,omitempty"`
}

// RewriteTable resolves a requested model to the model it is rewritten to,
// by the rules of a set of InferenceModelRewrites (see NewRewriteTable). It
// is immutable and safe for concurrent use.
type RewriteTable struct {
	exact   map[string]*rewriteChoice
	generic *rewriteChoice
}

// rewriteChoice is the targets of one rule, with their cumulative weights.
type rewriteChoice struct {
	models []string
	cum    []uint64
}

// pick returns a target drawn by weight with r (rand/v2's global source
// when nil).
func (c *rewriteChoice) pick(r *rand.Rand) string {
	if len(c.models) == 1 {
		return c.models[0]
	}
	total := c.cum[len(c.cum)-1]
	var n uint64
	if r != nil {
		n = r.Uint64N(total)
	} else {
		n = rand.Uint64N(total)
	}
	i, _ := slices.BinarySearch(c.cum, n+1)
	return c.models[i]
}

// Dropped counts what NewRewriteTable left out of the rewrites it was given
// by the bounds (see MaxModelRewrites and the others), and the rules it
// ignored because no target could be chosen.
type Dropped struct {
	Rewrites, Rules, Matches, Targets int
}

// Zero reports whether nothing was dropped.
func (d Dropped) Zero() bool { return d == Dropped{} }

// NewRewriteTable returns the table of rewrites' rules, and what of them it
// dropped. Precedence: a rule naming the model exactly beats a generic
// rule; among rules of several rewrites, the oldest rewrite's wins
// (creationTimestamp, then namespace and name); within a rewrite, the first
// matching rule in order. Only the oldest MaxModelRewrites rewrites are
// read, with the bounds of MaxRewriteRules and the others. A match of a
// type other than Exact matches nothing. A rule whose targets all weigh 0
// is ignored, as one without targets is.
func NewRewriteTable(rewrites []*InferenceModelRewrite) (*RewriteTable, Dropped) {
	var d Dropped
	sorted := slices.Clone(rewrites)
	slices.SortFunc(sorted, func(a, b *InferenceModelRewrite) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	if len(sorted) > MaxModelRewrites {
		d.Rewrites = len(sorted) - MaxModelRewrites
		sorted = sorted[:MaxModelRewrites]
	}
	t := &RewriteTable{exact: map[string]*rewriteChoice{}}
	for _, rw := range sorted {
		rules := rw.Spec.Rules
		if len(rules) > MaxRewriteRules {
			d.Rules += len(rules) - MaxRewriteRules
			rules = rules[:MaxRewriteRules]
		}
		for _, rule := range rules {
			choice := newChoice(rule.Targets, &d)
			if choice == nil {
				d.Rules++
				continue
			}
			matches := rule.Matches
			if len(matches) == 0 {
				if t.generic == nil {
					t.generic = choice
				}
				continue
			}
			if len(matches) > MaxRewriteMatches {
				d.Matches += len(matches) - MaxRewriteMatches
				matches = matches[:MaxRewriteMatches]
			}
			for _, m := range matches {
				v := m.Model.Value
				if !validModelName(v) {
					d.Matches++
					continue
				}
				if typ := m.Model.Type; typ != "" && typ != "Exact" {
					continue
				}
				if _, ok := t.exact[v]; !ok {
					t.exact[v] = choice
				}
			}
		}
	}
	return t, d
}

// newChoice returns the choice among targets, nil when none can be chosen,
// counting in d the targets dropped.
func newChoice(targets []ModelRewriteTarget, d *Dropped) *rewriteChoice {
	if len(targets) > MaxRewriteTargets {
		d.Targets += len(targets) - MaxRewriteTargets
		targets = targets[:MaxRewriteTargets]
	}
	c := &rewriteChoice{}
	var total uint64
	for _, tg := range targets {
		if !validModelName(tg.ModelRewrite) {
			d.Targets++
			continue
		}
		w := uint64(1)
		if tg.Weight != nil {
			w = uint64(min(max(*tg.Weight, 0), MaxRewriteWeight))
		}
		if w == 0 {
			continue
		}
		total += w
		c.models = append(c.models, tg.ModelRewrite)
		c.cum = append(c.cum, total)
	}
	if total == 0 {
		return nil
	}
	return c
}

// validModelName reports whether s may name a model in a rewrite: not
// empty, at most MaxModelNameBytes bytes.
func validModelName(s string) bool { return s != "" && len(s) <= MaxModelNameBytes }

// Resolve returns the model a request for model is rewritten to, drawing a
// weighted target with r (rand/v2's global source when nil), and whether a
// rule matched. The model returned may be model itself, as a split that
// keeps part of the traffic on it draws.
func (t *RewriteTable) Resolve(model string, r *rand.Rand) (string, bool) {
	if t == nil {
		return "", false
	}
	if c, ok := t.exact[model]; ok {
		return c.pick(r), true
	}
	if t.generic != nil {
		return t.generic.pick(r), true
	}
	return "", false
}

// Len returns the number of models the table names exactly, and whether it
// has a generic rule.
func (t *RewriteTable) Len() (exact int, generic bool) {
	if t == nil {
		return 0, false
	}
	return len(t.exact), t.generic != nil
}

// ModelRewriteSource watches the InferenceModelRewrites of the pools an
// InferencePoolSource follows, and resolves requested models by their rules
// (see NewRewriteTable for the precedence). A rewrite applies only while its
// poolRef names an InferencePool (group inference.networking.k8s.io, kind
// InferencePool, the defaults) that the source follows: one that exists in
// the rewrite's namespace, among Pools when those are named. The source
// watches the InferencePools' names for that: a rewrite naming a pool that
// does not exist (yet, or any longer) is ignored until it does. A request's pool is not
// known before it is routed: the rules of every followed pool are merged,
// with the same precedence.
//
// A cluster that does not serve InferenceModelRewrites, or whose RBAC does
// not let kvgate list them, rewrites nothing: Run logs it once, and checks
// again every 30 seconds. A CRD installed or a permission granted later is
// read as soon as it is found, logged once, without a restart.
type ModelRewriteSource struct {
	// Namespace limits the watch to one namespace; "" watches all.
	Namespace string
	// Pools names the pools followed; empty follows every pool.
	Pools []string
	// Resync is the informer's resync period; 0 disables resyncs.
	Resync time.Duration
	// Logger receives the source's logs (klog's global logger when zero).
	Logger klog.Logger

	table atomic.Pointer[RewriteTable]

	mu sync.Mutex
	// rewrites holds the rewrites naming a pool the source follows when it
	// exists; pools, the InferencePools that exist.
	rewrites map[types.NamespacedName]*InferenceModelRewrite
	pools    map[types.NamespacedName]bool
	log      klog.Logger
	// ignored is the number of rewrites past MaxModelRewrites last logged.
	ignored int

	// resource replaces InferenceModelRewriteResource when set.
	resource schema.GroupVersionResource
}

// RewriteModel returns the model a request for model goes to by the
// rewrites' rules, and whether a rule matched (see RewriteTable.Resolve).
// It is safe for concurrent use, and rewrites nothing before Run read the
// rewrites.
func (s *ModelRewriteSource) RewriteModel(model string) (string, bool) {
	return s.table.Load().Resolve(model, nil)
}

// Table returns the rules read so far; nil before Run read any.
func (s *ModelRewriteSource) Table() *RewriteTable { return s.table.Load() }

// Run watches the InferenceModelRewrites until ctx is cancelled, and calls
// synced once those that existed at start are read, or once it found that
// the cluster does not serve them or does not let kvgate list them (then
// it logs why, rewrites nothing, and reads them once it finds it can). It
// fails when config is nil, the API
// server cannot tell whether it serves them or lets kvgate list them (it
// cannot be reached), or ctx ends before the informer synced; otherwise it
// returns nil after ctx is cancelled.
func (s *ModelRewriteSource) Run(ctx context.Context, config *rest.Config, synced func()) error {
	if config == nil {
		return errors.New("model rewrite source needs a Kubernetes client configuration")
	}
	s.log = s.Logger
	if s.log.GetSink() == nil {
		s.log = klog.Background()
	}
	s.log = s.log.WithName("modelrewrite")
	kube, dyn, err := clients(config)
	if err != nil {
		return fmt.Errorf("model rewrite source: %w", err)
	}
	why, err := s.unavailable(ctx, kube, dyn)
	if err != nil {
		return fmt.Errorf("model rewrite source: %w", err)
	}
	s.mu.Lock()
	s.rewrites = map[types.NamespacedName]*InferenceModelRewrite{}
	s.pools = map[types.NamespacedName]bool{}
	s.mu.Unlock()
	if why == "" {
		if !s.watch(ctx, dyn, func(n int) {
			s.log.Info("InferenceModelRewrite informer synced", "namespace", s.Namespace, "rewrites", n)
			synced()
		}) {
			return fmt.Errorf("model rewrite source: stopped before the informer synced: %w", context.Cause(ctx))
		}
		return nil
	}
	s.log.Info("InferenceModelRewrites are not read yet: requests are not rewritten by rules; checked again every "+
		recheckInterval.String(), "reason", why)
	synced()
	err = wait.PollUntilContextCancel(ctx, recheckInterval, false, func(ctx context.Context) (bool, error) {
		why, err := s.unavailable(ctx, kube, dyn)
		return why == "" && err == nil, nil
	})
	if err != nil {
		return nil // ctx ended
	}
	s.watch(ctx, dyn, func(n int) {
		s.log.Info("InferenceModelRewrites are now read: requests are rewritten by their rules", "namespace", s.Namespace,
			"rewrites", n)
	})
	return nil
}

// watch runs the informer of the rewrites until ctx is cancelled, calling
// onSync with the number of rewrites read once those that existed at start
// are. It reports false when ctx ended before the informer synced.
func (s *ModelRewriteSource) watch(ctx context.Context, dyn dynamic.Interface, onSync func(n int)) bool {
	factory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, s.Resync, s.Namespace, nil)
	// AddEventHandler fails only on an informer already stopped.
	reg, _ := factory.ForResource(s.resourceOf()).Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    s.set,
		UpdateFunc: func(_, obj any) { s.set(obj) },
		DeleteFunc: s.delete,
	})
	poolReg, _ := factory.ForResource(InferencePoolResource).Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.setPool(obj, true) },
		DeleteFunc: func(obj any) { s.setPool(obj, false) },
	})
	informerCtx, cancel := context.WithCancel(ctx)
	defer factory.Shutdown()
	defer cancel()
	factory.Start(informerCtx.Done())
	if !toolscache.WaitForCacheSync(informerCtx.Done(), reg.HasSynced, poolReg.HasSynced) {
		return false
	}
	s.mu.Lock()
	n := len(s.rewrites)
	s.mu.Unlock()
	onSync(n)
	<-ctx.Done()
	return true
}

// resourceOf returns the resource of the rewrites the source reads.
func (s *ModelRewriteSource) resourceOf() schema.GroupVersionResource {
	return cmp.Or(s.resource, InferenceModelRewriteResource)
}

// unavailable says why the rewrites cannot be read, "" when they can: the
// API server does not serve them, or kvgate may not list them or the
// InferencePools they name. It fails
// when the API server cannot tell (it cannot be reached, say), which the
// pool source fails on too.
func (s *ModelRewriteSource) unavailable(ctx context.Context, kube kubernetes.Interface, dyn dynamic.Interface) (string, error) {
	r := s.resourceOf()
	missing := fmt.Sprintf("the API server does not serve %s %s (install config/inference-extension, "+
		"or the Gateway API Inference Extension's CRDs)", r.GroupVersion(), r.Resource)
	list, err := kube.Discovery().ServerResourcesForGroupVersion(r.GroupVersion().String())
	switch {
	case apierrors.IsNotFound(err):
		return missing, nil
	case err != nil:
		return "", err
	case !slices.ContainsFunc(list.APIResources, func(res metav1.APIResource) bool { return res.Name == r.Resource }):
		return missing, nil
	}
	for _, r := range []schema.GroupVersionResource{r, InferencePoolResource} {
		err = listable(ctx, dyn, r, s.Namespace)
		switch {
		case apierrors.IsForbidden(err):
			return fmt.Sprintf("not allowed to list %s: grant get, list and watch on them (%v)", r.Resource, err), nil
		case apierrors.IsNotFound(err) && r == InferencePoolResource:
			return fmt.Sprintf("the API server does not serve %s", r.Resource), nil
		case err != nil:
			return "", err
		}
	}
	return "", nil
}

// follows reports whether ref names a pool the source follows when it
// exists: an InferencePool, among Pools when those are named.
func (s *ModelRewriteSource) follows(ref PoolReference) bool {
	return cmp.Or(ref.Group, defaultPoolRefGroup) == defaultPoolRefGroup &&
		cmp.Or(ref.Kind, defaultPoolRefKind) == defaultPoolRefKind &&
		(len(s.Pools) == 0 || slices.Contains(s.Pools, ref.Name))
}

func (s *ModelRewriteSource) set(obj any) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	key := types.NamespacedName{Namespace: u.GetNamespace(), Name: u.GetName()}
	rw := &InferenceModelRewrite{}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, rw); err != nil {
		s.log.Error(err, "Ignoring an InferenceModelRewrite that cannot be read", "rewrite", key.String())
		delete(s.rewrites, key)
	} else if !s.follows(rw.Spec.PoolRef) {
		delete(s.rewrites, key)
	} else {
		s.rewrites[key] = rw
		if _, d := NewRewriteTable([]*InferenceModelRewrite{rw}); !d.Zero() {
			s.log.Info("An InferenceModelRewrite passes kvgate's bounds: what passes them is ignored", "rewrite", key.String(),
				"rulesDropped", d.Rules, "matchesDropped", d.Matches, "targetsDropped", d.Targets)
		}
	}
	s.rebuildLocked()
}

// setPool records whether the InferencePool obj exists, and publishes the
// table anew when that changes.
func (s *ModelRewriteSource) setPool(obj any, exists bool) {
	u, ok := unstructuredOf(obj)
	if !ok {
		return
	}
	key := types.NamespacedName{Namespace: u.GetNamespace(), Name: u.GetName()}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pools[key] == exists {
		return
	}
	if exists {
		s.pools[key] = true
	} else {
		delete(s.pools, key)
	}
	s.rebuildLocked()
}

func (s *ModelRewriteSource) delete(obj any) {
	u, ok := unstructuredOf(obj)
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.rewrites, types.NamespacedName{Namespace: u.GetNamespace(), Name: u.GetName()})
	s.rebuildLocked()
}

// rebuildLocked publishes the table of the rewrites held whose pools
// exist.
func (s *ModelRewriteSource) rebuildLocked() {
	all := make([]*InferenceModelRewrite, 0, len(s.rewrites))
	for key, rw := range s.rewrites {
		if s.pools[types.NamespacedName{Namespace: key.Namespace, Name: rw.Spec.PoolRef.Name}] {
			all = append(all, rw)
		}
	}
	t, d := NewRewriteTable(all)
	if d.Rewrites != s.ignored {
		s.ignored = d.Rewrites
		s.log.Info("More InferenceModelRewrites than kvgate reads: the newest are ignored", "max", MaxModelRewrites,
			"ignored", d.Rewrites)
	}
	s.table.Store(t)
}
