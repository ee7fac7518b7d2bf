package discovery

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/internal/testapiserver"
	"github.com/kvgate/kvgate/internal/testsupport"
)

// rewrite returns an InferenceModelRewrite ns/name created at minute age
// of a fixed hour, with rules.
func rewrite(ns, name string, age int, rules ...ModelRewriteRule) *InferenceModelRewrite {
	return &InferenceModelRewrite{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
			CreationTimestamp: metav1.NewTime(time.Date(2026, 1, 1, 0, age, 0, 0, time.UTC))},
		Spec: InferenceModelRewriteSpec{PoolRef: PoolReference{Name: "pool"}, Rules: rules},
	}
}

// rule returns a rule matching models exactly (generic without any)
// rewriting to targets, each "model" or "model=weight".
func rule(models []string, targets ...string) ModelRewriteRule {
	var r ModelRewriteRule
	for _, m := range models {
		var mm ModelRewriteMatch
		mm.Model.Type, mm.Model.Value = "Exact", m
		r.Matches = append(r.Matches, mm)
	}
	for _, t := range targets {
		name, weight, ok := strings.Cut(t, "=")
		tg := ModelRewriteTarget{ModelRewrite: name}
		if ok {
			var w int32
			fmt.Sscan(weight, &w)
			tg.Weight = &w
		}
		r.Targets = append(r.Targets, tg)
	}
	return r
}

func TestRewriteTablePrecedence(t *testing.T) {
	tests := []struct {
		name     string
		rewrites []*InferenceModelRewrite
		model    string
		want     string // "" for no rule matching
	}{
		{"an alias rewrites its model", []*InferenceModelRewrite{
			rewrite("ns", "a", 0, rule([]string{"alias"}, "base"))}, "alias", "base"},
		{"a model no rule names is not rewritten", []*InferenceModelRewrite{
			rewrite("ns", "a", 0, rule([]string{"alias"}, "base"))}, "other", ""},
		{"a generic rule rewrites the models no exact rule names", []*InferenceModelRewrite{
			rewrite("ns", "a", 0, rule(nil, "fallback"), rule([]string{"alias"}, "base"))}, "other", "fallback"},
		{"an exact rule beats an earlier generic rule", []*InferenceModelRewrite{
			rewrite("ns", "a", 0, rule(nil, "fallback"), rule([]string{"alias"}, "base"))}, "alias", "base"},
		{"an exact rule of a newer rewrite beats an older generic rule", []*InferenceModelRewrite{
			rewrite("ns", "old", 0, rule(nil, "fallback")), rewrite("ns", "new", 5, rule([]string{"alias"}, "base"))}, "alias", "base"},
		{"the oldest rewrite wins an exact tie", []*InferenceModelRewrite{
			rewrite("ns", "new", 5, rule([]string{"alias"}, "from-new")), rewrite("ns", "old", 1, rule([]string{"alias"}, "from-old"))},
			"alias", "from-old"},
		{"the oldest rewrite wins a generic tie", []*InferenceModelRewrite{
			rewrite("ns", "new", 5, rule(nil, "from-new")), rewrite("ns", "old", 1, rule(nil, "from-old"))}, "x", "from-old"},
		{"rewrites of one age are ordered by namespace, then name", []*InferenceModelRewrite{
			rewrite("b", "a", 1, rule([]string{"alias"}, "from-b/a")), rewrite("a", "z", 1, rule([]string{"alias"}, "from-a/z")),
			rewrite("a", "y", 1, rule([]string{"alias"}, "from-a/y"))}, "alias", "from-a/y"},
		{"the first matching rule of a rewrite wins", []*InferenceModelRewrite{
			rewrite("ns", "a", 0, rule([]string{"other"}, "x"), rule([]string{"alias"}, "first"), rule([]string{"alias"}, "second"))},
			"alias", "first"},
		{"the first generic rule of a rewrite wins", []*InferenceModelRewrite{
			rewrite("ns", "a", 0, rule(nil, "first"), rule(nil, "second"))}, "x", "first"},
		{"a rule matches each model it names", []*InferenceModelRewrite{
			rewrite("ns", "a", 0, rule([]string{"one", "two"}, "base"))}, "two", "base"},
		{"a match of another type than Exact matches nothing", []*InferenceModelRewrite{
			rewrite("ns", "a", 0, func() ModelRewriteRule {
				r := rule([]string{"alias"}, "base")
				r.Matches[0].Model.Type = "Prefix"
				return r
			}())}, "alias", ""},
		{"a rule whose targets all weigh 0 is ignored", []*InferenceModelRewrite{
			rewrite("ns", "a", 0, rule([]string{"alias"}, "x=0", "y=0"), rule([]string{"alias"}, "next"))}, "alias", "next"},
		{"a target of weight 0 is never drawn", []*InferenceModelRewrite{
			rewrite("ns", "a", 0, rule([]string{"alias"}, "never=0", "always=3"))}, "alias", "always"},
		{"a rule without targets is ignored", []*InferenceModelRewrite{
			rewrite("ns", "a", 0, rule([]string{"alias"}), rule([]string{"alias"}, "next"))}, "alias", "next"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			table, _ := NewRewriteTable(tt.rewrites)
			r := rand.New(rand.NewPCG(1, 2))
			for range 50 {
				got, ok := table.Resolve(tt.model, r)
				if ok != (tt.want != "") || got != tt.want {
					t.Fatalf("Resolve(%q) = %q, %v; want %q", tt.model, got, ok, tt.want)
				}
			}
		})
	}
}

func TestRewriteTableSplitsByWeight(t *testing.T) {
	const draws = 20000
	tests := []struct {
		name    string
		targets []string
		want    map[string]float64
	}{
		{"90/10", []string{"v1=90", "v2=10"}, map[string]float64{"v1": 0.9, "v2": 0.1}},
		{"weights unset on all split equally", []string{"a", "b", "c", "d"},
			map[string]float64{"a": 0.25, "b": 0.25, "c": 0.25, "d": 0.25}},
		{"an unset weight counts as 1", []string{"a", "b=3"}, map[string]float64{"a": 0.25, "b": 0.75}},
		{"a target of weight 0 gets nothing", []string{"a=0", "b=1", "c=1"}, map[string]float64{"b": 0.5, "c": 0.5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			table, _ := NewRewriteTable([]*InferenceModelRewrite{rewrite("ns", "a", 0, rule([]string{"m"}, tt.targets...))})
			r := rand.New(rand.NewPCG(7, 11))
			got := map[string]int{}
			for range draws {
				m, _ := table.Resolve("m", r)
				got[m]++
			}
			for m, n := range got {
				if _, ok := tt.want[m]; !ok {
					t.Errorf("%d draws went to %q, which should get none", n, m)
				}
			}
			for m, share := range tt.want {
				// 0.02 is over 4 standard deviations of any share here.
				if f := float64(got[m]) / draws; math.Abs(f-share) > 0.02 {
					t.Errorf("%q drew %.3f of the requests, want %.2f", m, f, share)
				}
			}
		})
	}
}

func TestRewriteTableBounds(t *testing.T) {
	long := strings.Repeat("m", MaxModelNameBytes+1)
	edge := strings.Repeat("m", MaxModelNameBytes)
	var many []*InferenceModelRewrite
	for i := range MaxModelRewrites + 3 {
		many = append(many, rewrite("ns", fmt.Sprintf("r%04d", i), 0, rule([]string{fmt.Sprintf("model-%d", i)}, "base")))
	}
	manyRules := rewrite("ns", "rules", 0)
	for i := range MaxRewriteRules + 2 {
		manyRules.Spec.Rules = append(manyRules.Spec.Rules, rule([]string{fmt.Sprintf("model-%d", i)}, "base"))
	}
	var matches, targets []string
	for i := range MaxRewriteMatches + 4 {
		matches = append(matches, fmt.Sprintf("model-%d", i))
	}
	for i := range MaxRewriteTargets + 5 {
		targets = append(targets, fmt.Sprintf("target-%d", i))
	}
	tests := []struct {
		name        string
		rewrites    []*InferenceModelRewrite
		dropped     Dropped
		kept, gone  string // a model resolved, a model not
		keptTargets int    // the targets model kept draws, when set
	}{
		{"the oldest rewrites are kept", many, Dropped{Rewrites: 3},
			fmt.Sprintf("model-%d", MaxModelRewrites-1), fmt.Sprintf("model-%d", MaxModelRewrites), 0},
		{"a rewrite's first rules are kept", []*InferenceModelRewrite{manyRules}, Dropped{Rules: 2},
			fmt.Sprintf("model-%d", MaxRewriteRules-1), fmt.Sprintf("model-%d", MaxRewriteRules), 0},
		{"a rule's first matches are kept", []*InferenceModelRewrite{rewrite("ns", "a", 0, rule(matches, "base"))},
			Dropped{Matches: 4}, fmt.Sprintf("model-%d", MaxRewriteMatches-1), fmt.Sprintf("model-%d", MaxRewriteMatches), 0},
		{"a rule's first targets are kept", []*InferenceModelRewrite{rewrite("ns", "a", 0, rule([]string{"m"}, targets...))},
			Dropped{Targets: 5}, "m", "", MaxRewriteTargets},
		{"a match of a name too long is dropped", []*InferenceModelRewrite{
			rewrite("ns", "a", 0, rule([]string{long, edge}, "base"))}, Dropped{Matches: 1}, edge, long, 0},
		{"a target of a name too long is dropped", []*InferenceModelRewrite{
			rewrite("ns", "a", 0, rule([]string{"m"}, long)), rewrite("ns", "b", 1, rule([]string{"m"}, edge))},
			Dropped{Rules: 1, Targets: 1}, "m", "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			table, d := NewRewriteTable(tt.rewrites)
			if d != tt.dropped {
				t.Errorf("dropped %+v, want %+v", d, tt.dropped)
			}
			if _, ok := table.Resolve(tt.kept, nil); !ok {
				t.Errorf("%.20q... is not rewritten; want it kept", tt.kept)
			}
			if got, ok := table.Resolve(tt.gone, nil); tt.gone != "" && ok {
				t.Errorf("%.20q... is rewritten to %q; want its rule dropped", tt.gone, got)
			}
			if got, _ := table.Resolve("m", nil); tt.name == "a target of a name too long is dropped" && got != edge {
				t.Errorf("m is rewritten to %.20q...; want the newer rewrite's target", got)
			}
			if tt.keptTargets > 0 {
				seen := map[string]bool{}
				r := rand.New(rand.NewPCG(3, 4))
				for range 100 * tt.keptTargets {
					m, _ := table.Resolve(tt.kept, r)
					seen[m] = true
				}
				if len(seen) != tt.keptTargets || seen[fmt.Sprintf("target-%d", MaxRewriteTargets)] {
					t.Errorf("drew %d targets, want the first %d", len(seen), tt.keptTargets)
				}
			}
		})
	}
}

func TestModelRewriteSourceFollowsOnlyItsPools(t *testing.T) {
	tests := []struct {
		pools []string
		ref   PoolReference
		want  bool
	}{
		{nil, PoolReference{Name: "any"}, true},
		{[]string{"p"}, PoolReference{Name: "p"}, true},
		{[]string{"p"}, PoolReference{Name: "q"}, false},
		{nil, PoolReference{Group: "inference.networking.k8s.io", Kind: "InferencePool", Name: "p"}, true},
		{nil, PoolReference{Group: "inference.networking.x-k8s.io", Name: "p"}, false},
		{nil, PoolReference{Kind: "Service", Name: "p"}, false},
	}
	for _, tt := range tests {
		s := &ModelRewriteSource{Pools: tt.pools}
		if got := s.follows(tt.ref); got != tt.want {
			t.Errorf("with pools %q, follows(%+v) = %v, want %v", tt.pools, tt.ref, got, tt.want)
		}
	}
}

// TestModelRewriteSourceWithoutRewritesRewritesNothing checks the zero
// source, before Run read anything.
func TestModelRewriteSourceWithoutRewritesRewritesNothing(t *testing.T) {
	var s ModelRewriteSource
	if m, ok := s.RewriteModel("m"); ok {
		t.Fatalf("RewriteModel = %q; want nothing before Run", m)
	}
	if err := s.Run(context.Background(), nil, func() {}); err == nil {
		t.Fatal("Run without a configuration succeeded")
	}
}

// runRewriteSource runs s on the API server cfg until the test ends, and
// waits until it synced.
func runRewriteSource(t *testing.T, cfg *rest.Config, s *ModelRewriteSource) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	synced, done := make(chan struct{}), make(chan error, 1)
	go func() { done <- s.Run(ctx, cfg, func() { close(synced) }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	select {
	case <-synced:
	case err := <-done:
		t.Fatalf("Run returned before it synced: %v", err)
	case <-time.After(testsupport.WaitTimeout):
		t.Fatalf("the source did not sync within %v", testsupport.WaitTimeout)
	}
}

// applyRewrite creates or replaces the InferenceModelRewrite name of pool
// in ns, with rules given as unstructured values.
func applyRewrite(t *testing.T, rewrites dynamic.ResourceInterface, name, pool string, rules ...any) {
	t.Helper()
	applyRewriteOf(t, rewrites, InferenceModelRewriteResource.GroupVersion().String(), name, pool, rules...)
}

// applyRewriteOf is applyRewrite for rewrites of apiVersion.
func applyRewriteOf(t *testing.T, rewrites dynamic.ResourceInterface, apiVersion, name, pool string, rules ...any) {
	t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": apiVersion,
		"kind":       "InferenceModelRewrite",
		"metadata":   map[string]any{"name": name},
		"spec":       map[string]any{"poolRef": map[string]any{"name": pool}, "rules": rules},
	}}
	testapiserver.Apply(t, rewrites, u)
}

// alias is a rule rewriting model to target, as the API server takes it.
func alias(model, target string) any {
	return map[string]any{
		"matches": []any{map[string]any{"model": map[string]any{"value": model}}},
		"targets": []any{map[string]any{"modelRewrite": target}},
	}
}

// waitRewrite waits until s rewrites model to want ("" for not at all).
func waitRewrite(t *testing.T, s *ModelRewriteSource, step, model, want string) {
	t.Helper()
	testsupport.EventuallyWhy(t, step, func() (string, bool) {
		got, ok := s.RewriteModel(model)
		return fmt.Sprintf("%s rewritten to %q (%v)", model, got, ok), ok == (want != "") && got == want
	})
}

// applyRewritePool creates or replaces the InferencePool name in ns.
func applyRewritePool(t *testing.T, cfg *rest.Config, ns, name string) {
	t.Helper()
	testapiserver.Apply(t, rewritePools(t, cfg, ns), poolObject(name, name, []int{8000}, nil))
}

// rewritePools returns the InferencePools of ns.
func rewritePools(t *testing.T, cfg *rest.Config, ns string) dynamic.ResourceInterface {
	t.Helper()
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return dyn.Resource(InferencePoolResource).Namespace(ns)
}

// newRewriteNamespace creates a namespace of its own for a test.
func newRewriteNamespace(t *testing.T, cfg *rest.Config) (string, dynamic.ResourceInterface) {
	t.Helper()
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ns := createNamespace(t, client, "rewrite")
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return ns, dyn.Resource(InferenceModelRewriteResource).Namespace(ns)
}

func TestModelRewriteSourceFollowsTheRewritesOfItsPools(t *testing.T) {
	cfg := testapiserver.Config(t)
	ns, rewrites := newRewriteNamespace(t, cfg)
	applyRewritePool(t, cfg, ns, "pool")
	applyRewritePool(t, cfg, ns, "other-pool")
	applyRewrite(t, rewrites, "before", "pool", alias("early", "base"))
	s := &ModelRewriteSource{Namespace: ns, Pools: []string{"pool"}, Logger: klog.Background().V(4)}
	runRewriteSource(t, cfg, s)
	if got, ok := s.RewriteModel("early"); !ok || got != "base" {
		t.Fatalf("after sync, early is rewritten to %q (%v); want base, from the rewrite created before", got, ok)
	}

	applyRewrite(t, rewrites, "alias", "pool", alias("chat", "llama"))
	waitRewrite(t, s, "a created rewrite to apply", "chat", "llama")
	applyRewrite(t, rewrites, "alias", "pool", alias("chat", "llama-v2"))
	waitRewrite(t, s, "an updated rewrite to apply", "chat", "llama-v2")

	// A rewrite of another pool is not read, nor one that moves to it.
	applyRewrite(t, rewrites, "other", "other-pool", alias("elsewhere", "base"))
	applyRewrite(t, rewrites, "alias", "other-pool", alias("chat", "llama-v3"))
	waitRewrite(t, s, "a rewrite moved to another pool to stop applying", "chat", "")
	if got, ok := s.RewriteModel("elsewhere"); ok {
		t.Fatalf("a rewrite of a pool not followed rewrote elsewhere to %q", got)
	}

	if err := rewrites.Delete(context.Background(), "before", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRewrite(t, s, "a deleted rewrite to stop applying", "early", "")
}

func TestModelRewritesApplyOnlyWhileTheirPoolExists(t *testing.T) {
	cfg := testapiserver.Config(t)
	ns, rewrites := newRewriteNamespace(t, cfg)
	applyRewritePool(t, cfg, ns, "pool")
	applyRewrite(t, rewrites, "marker", "pool", alias("marker", "base"))
	applyRewrite(t, rewrites, "alias", "later", alias("chat", "llama"))
	s := &ModelRewriteSource{Namespace: ns, Logger: klog.Background().V(4)}
	runRewriteSource(t, cfg, s)
	waitRewrite(t, s, "the rewrite of an existing pool to apply", "marker", "base")
	if got, ok := s.RewriteModel("chat"); ok {
		t.Fatalf("a rewrite of a pool that does not exist rewrote chat to %q", got)
	}

	applyRewritePool(t, cfg, ns, "later")
	waitRewrite(t, s, "the rewrite to apply once its pool is created", "chat", "llama")
	if err := rewritePools(t, cfg, ns).Delete(context.Background(), "later", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRewrite(t, s, "the rewrite to stop applying once its pool is deleted", "chat", "")
	if got, ok := s.RewriteModel("marker"); !ok || got != "base" {
		t.Fatalf("the rewrite of a pool still there rewrites marker to %q (%v); want base", got, ok)
	}
}

func TestModelRewriteSourceWithoutPermissionRewritesNothing(t *testing.T) {
	cfg := rest.CopyConfig(testapiserver.Config(t))
	ns, rewrites := newRewriteNamespace(t, cfg)
	applyRewrite(t, rewrites, "alias", "pool", alias("chat", "llama"))
	// A user bound to nothing may not list the rewrites.
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":nobody"}
	s := &ModelRewriteSource{Namespace: ns}
	runRewriteSource(t, cfg, s)
	if got, ok := s.RewriteModel("chat"); ok {
		t.Fatalf("without permission, chat is rewritten to %q", got)
	}
}

func TestModelRewriteSourceWithoutTheCRDRewritesNothing(t *testing.T) {
	cfg := testapiserver.Config(t)
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := &ModelRewriteSource{}
	if why, err := s.unavailable(context.Background(), kube, dyn); why != "" || err != nil {
		t.Fatalf("with the CRD installed: %q, %v", why, err)
	}
	// A version the server does not serve stands for a cluster without
	// the CRD.
	s.resource = InferenceModelRewriteResource
	s.resource.Version = "v9"
	if why, err := s.unavailable(context.Background(), kube, dyn); err != nil || !strings.Contains(why, "does not serve") {
		t.Fatalf("unavailable = %q, %v; want the CRD named missing", why, err)
	}
	runRewriteSource(t, cfg, s)
	if got, ok := s.RewriteModel("m"); ok {
		t.Fatalf("without the CRD, m is rewritten to %q", got)
	}
}

func TestModelRewriteSourceFailsWhenTheAPIServerCannotTell(t *testing.T) {
	// Nothing listens on the port of a listener just closed.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	s := &ModelRewriteSource{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	synced, done := make(chan struct{}), make(chan error, 1)
	go func() { done <- s.Run(ctx, &rest.Config{Host: "http://" + addr}, func() { close(synced) }) }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Run returned nil")
		}
	case <-synced:
		t.Fatal("an unreachable API server passed for one without the CRD: rewrites would stay off for good")
	case <-time.After(testsupport.WaitTimeout):
		t.Fatalf("Run neither failed nor synced within %v", testsupport.WaitTimeout)
	}
}

func TestModelRewritesOfACRDInstalledAfterStartApply(t *testing.T) {
	shortRecheck(t)
	cfg := testapiserver.Config(t)
	ns, _ := newRewriteNamespace(t, cfg)
	applyRewritePool(t, cfg, ns, "pool")
	late, install := lateCRD(t, cfg, "inferencemodelrewrites.yaml", "inferencemodelrewrites")
	var logs logLines
	s := &ModelRewriteSource{Namespace: ns, Logger: logs.logger(), resource: late}
	runRewriteSource(t, cfg, s)

	install()
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	applyRewriteOf(t, dyn.Resource(late).Namespace(ns), late.GroupVersion().String(), "alias", "pool", alias("chat", "llama"))
	waitRewrite(t, s, "the rewrite of the CRD installed late to apply", "chat", "llama")
	logs.wantLoggedOnce(t, "InferenceModelRewrites are not read", "InferenceModelRewrites are now read")
}

func TestModelRewritesApplyOncePermissionIsGrantedAfterStart(t *testing.T) {
	shortRecheck(t)
	admin := testapiserver.Config(t)
	ns, rewrites := newRewriteNamespace(t, admin)
	applyRewritePool(t, admin, ns, "pool")
	applyRewrite(t, rewrites, "alias", "pool", alias("chat", "llama"))
	user := "system:serviceaccount:" + ns + ":kvgate"
	cfg := rest.CopyConfig(admin)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	var logs logLines
	s := &ModelRewriteSource{Namespace: ns, Logger: logs.logger()}
	runRewriteSource(t, cfg, s)
	if got, ok := s.RewriteModel("chat"); ok {
		t.Fatalf("without permission, chat is rewritten to %q", got)
	}

	grantRead(t, admin, ns, user, InferenceModelRewriteResource, InferencePoolResource)
	waitRewrite(t, s, "the rewrite to apply once kvgate may read it", "chat", "llama")
	logs.wantLoggedOnce(t, "InferenceModelRewrites are not read", "InferenceModelRewrites are now read")
}

// grantRead lets user get, list and watch resources in ns, as the Role of
// config/samples/inferencepool does.
func grantRead(t *testing.T, admin *rest.Config, ns, user string, resources ...schema.GroupVersionResource) {
	t.Helper()
	kube, err := kubernetes.NewForConfig(admin)
	if err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kvgate"}}
	for _, r := range resources {
		role.Rules = append(role.Rules, rbacv1.PolicyRule{APIGroups: []string{r.Group}, Resources: []string{r.Resource},
			Verbs: []string{"get", "list", "watch"}})
	}
	ctx := context.Background()
	if _, err := kube.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kvgate"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "kvgate"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}}
	if _, err := kube.RbacV1().RoleBindings(ns).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}
