package manifests

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvgate/kvgate/internal/testapiserver"
	"github.com/kvgate/kvgate/internal/testsupport"
)

// access is one request the gateway's ServiceAccount might make.
type access struct {
	verb, group, resource, subresource string
	// namespace is "" for a cluster-scoped resource or every namespace.
	namespace string
}

func (a access) String() string {
	r := a.resource
	if a.group != "" {
		r += "." + a.group
	}
	if a.subresource != "" {
		r += "/" + a.subresource
	}
	ns := a.namespace
	if ns == "" {
		ns = "every namespace"
	}
	return fmt.Sprintf("%s %s in %s", a.verb, r, ns)
}

// forbidden are requests the gateway never needs, in namespace ns.
func forbidden(ns string) []access {
	return []access{
		{"create", "", "pods", "", ns},
		{"update", "", "pods", "", ns},
		{"patch", "", "pods", "", ns},
		{"delete", "", "pods", "", ns},
		{"deletecollection", "", "pods", "", ns},
		{"update", "", "pods", "status", ns},
		{"get", "", "pods", "log", ns},
		{"create", "", "pods", "exec", ns},
		{"create", "", "pods", "eviction", ns},
		{"get", "", "secrets", "", ns},
		{"list", "", "secrets", "", ns},
		{"list", "", "configmaps", "", ns},
		{"list", "", "services", "", ns},
		{"get", "", "endpoints", "", ns},
		{"list", "discovery.k8s.io", "endpointslices", "", ns},
		{"create", "", "events", "", ns},
		{"get", "apps", "deployments", "", ns},
		{"get", "coordination.k8s.io", "leases", "", ns},
		{"create", "", "serviceaccounts", "token", ns},
		{"watch", "", "nodes", "", ""},
		{"list", "", "namespaces", "", ""},
		{"list", "apiextensions.k8s.io", "customresourcedefinitions", "", ""},
	}
}

// readPods are the requests of pod discovery in namespace ns.
func readPods(ns string) []access {
	return []access{{"get", "", "pods", "", ns}, {"list", "", "pods", "", ns}, {"watch", "", "pods", "", ns}}
}

// poolGroup is the API group of InferencePools.
const poolGroup = "inference.networking.k8s.io"

// readPools are the requests of InferencePool discovery in namespace ns,
// beside readPods.
func readPools(ns string) []access {
	return []access{{"get", poolGroup, "inferencepools", "", ns}, {"list", poolGroup, "inferencepools", "", ns},
		{"watch", poolGroup, "inferencepools", "", ns}}
}

// alphaGroup is the API group of InferenceObjectives and
// InferenceModelRewrites.
const alphaGroup = "inference.networking.x-k8s.io"

// readObjectives are the requests of InferencePool discovery on the
// InferenceObjectives of namespace ns.
func readObjectives(ns string) []access {
	return []access{{"get", alphaGroup, "inferenceobjectives", "", ns},
		{"list", alphaGroup, "inferenceobjectives", "", ns}, {"watch", alphaGroup, "inferenceobjectives", "", ns}}
}

// writeObjectives are requests on InferenceObjectives no gateway needs.
func writeObjectives(ns string) []access {
	return []access{{"create", alphaGroup, "inferenceobjectives", "", ns},
		{"update", alphaGroup, "inferenceobjectives", "", ns}, {"delete", alphaGroup, "inferenceobjectives", "", ns}}
}

// readRewrites are the requests of InferenceModelRewrite discovery in
// namespace ns, beside readPools.
func readRewrites(ns string) []access {
	return []access{{"get", alphaGroup, "inferencemodelrewrites", "", ns}, {"list", alphaGroup, "inferencemodelrewrites", "", ns},
		{"watch", alphaGroup, "inferencemodelrewrites", "", ns}}
}

// writePools are requests on InferencePools no gateway needs.
func writePools(ns string) []access {
	return []access{{"create", poolGroup, "inferencepools", "", ns}, {"update", poolGroup, "inferencepools", "", ns},
		{"delete", poolGroup, "inferencepools", "", ns}, {"update", poolGroup, "inferencepools", "status", ns},
		{"create", alphaGroup, "inferencemodelrewrites", "", ns}, {"update", alphaGroup, "inferencemodelrewrites", "", ns},
		{"delete", alphaGroup, "inferencemodelrewrites", "", ns}}
}

// TestGatewayMayOnlyReadPods installs the ServiceAccount and RBAC of each
// overlay for real and asks the API server what the gateway's
// ServiceAccount may do: get, list and watch pods (in every namespace for
// config/default, in its own for config/namespaced), and the InferencePools
// and the InferenceObjectives and InferenceModelRewrites of its namespace
// too for the InferencePool
// sample's picker, and nothing
// more. Besides the SubjectAccessReviews of a list of requests, it compares
// the account's complete rules (SelfSubjectRulesReview) with those of an
// account bound to nothing.
func TestGatewayMayOnlyReadPods(t *testing.T) {
	c, _ := newClient(t)
	tests := []struct {
		in install
		// clusterWide is true when the gateway reads the pods of every
		// namespace; pools when it reads InferencePools and
		// InferenceObjectives.
		clusterWide, pools bool
	}{
		{installs[0], true, false},
		{installs[1], false, false},
		{installOf(t, poolSample), false, true},
	}
	for _, tt := range tests {
		t.Run(tt.in.dir, func(t *testing.T) {
			objs := render(t, tt.in.dir)
			ensureNamespaces(t, c, tt.in, objs)
			for _, o := range objs {
				switch o.GetKind() {
				case "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding":
					if err := applyObject(t, c, o); err != nil {
						t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
					}
				}
			}
			g := findGateway(t, objs)
			ns, sa := g.deployment.Namespace, g.deployment.Spec.Template.Spec.ServiceAccountName
			const elsewhere = "default"

			allowed := readPods(ns)
			denied := slices.Concat(forbidden(ns), forbidden(elsewhere), writePools(ns), readPools(elsewhere), readPools(""),
				writeObjectives(ns), readObjectives(elsewhere), readObjectives(""), readRewrites(elsewhere), readRewrites(""))
			if tt.clusterWide {
				allowed = slices.Concat(allowed, readPods(elsewhere), readPods(""))
			} else {
				denied = slices.Concat(denied, readPods(elsewhere), readPods(""))
			}
			if tt.pools {
				allowed = slices.Concat(allowed, readPools(ns), readObjectives(ns), readRewrites(ns))
			} else {
				denied = slices.Concat(denied, readPools(ns), readObjectives(ns), readRewrites(ns))
			}
			// The apiserver authorizes from caches of the roles and bindings
			// just applied: what they allow may take a moment to be allowed.
			// Once it all is, the denials are the bindings' own.
			for _, a := range allowed {
				testsupport.Eventually(t, fmt.Sprintf("%s/%s allowed to %s", ns, sa, a), func() bool {
					return mayDo(t, c, ns, sa, a)
				})
			}
			for _, a := range denied {
				if mayDo(t, c, ns, sa, a) {
					t.Errorf("%s/%s may %s", ns, sa, a)
				}
			}

			nobody := unbound(t, c, ns)
			for _, where := range []string{ns, elsewhere} {
				extra := ruleSet(t, ns, sa, where)
				for r := range ruleSet(t, ns, nobody, where) {
					delete(extra, r)
				}
				want := map[rule]bool{}
				if tt.clusterWide || where == ns {
					for _, verb := range []string{"get", "list", "watch"} {
						want[rule{verb: verb, group: "", resource: "pods"}] = true
						if tt.pools {
							want[rule{verb: verb, group: poolGroup, resource: "inferencepools"}] = true
							want[rule{verb: verb, group: alphaGroup, resource: "inferenceobjectives"}] = true
							want[rule{verb: verb, group: alphaGroup, resource: "inferencemodelrewrites"}] = true
						}
					}
				}
				if !maps.Equal(extra, want) {
					t.Errorf("in namespace %s, %s/%s may, beyond what every account may: %v; want %v",
						where, ns, sa, sortedRules(extra), sortedRules(want))
				}
			}
		})
	}
}

// mayDo asks the API server whether ServiceAccount ns/sa may make request a.
func mayDo(t *testing.T, c client.Client, ns, sa string, a access) bool {
	t.Helper()
	review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:   serviceAccountUser(ns, sa),
		Groups: serviceAccountGroups(ns),
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: a.namespace, Verb: a.verb, Group: a.group, Resource: a.resource, Subresource: a.subresource,
		},
	}}
	if err := c.Create(testContext(t), review); err != nil {
		t.Fatalf("SubjectAccessReview of %s: %v", a, err)
	}
	return review.Status.Allowed
}

// rule is one verb on one resource, the unit rules are compared in.
type rule struct {
	verb, group, resource, resourceName, nonResourceURL string
}

func (r rule) String() string {
	if r.nonResourceURL != "" {
		return r.verb + " " + r.nonResourceURL
	}
	s := r.verb + " " + r.resource
	if r.group != "" {
		s = r.verb + " " + r.group + "/" + r.resource
	}
	if r.resourceName != "" {
		s += " named " + r.resourceName
	}
	return s
}

// ruleSet returns every (verb, resource) or (verb, URL) pair ServiceAccount
// ns/sa may use in namespace where, as the account itself learns it from a
// SelfSubjectRulesReview.
func ruleSet(t *testing.T, ns, sa, where string) map[rule]bool {
	t.Helper()
	cfg := testapiserver.Config(t)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: serviceAccountUser(ns, sa), Groups: serviceAccountGroups(ns)}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	review := &authorizationv1.SelfSubjectRulesReview{Spec: authorizationv1.SelfSubjectRulesReviewSpec{Namespace: where}}
	if err := c.Create(testContext(t), review); err != nil {
		t.Fatalf("SelfSubjectRulesReview of %s/%s in %s: %v", ns, sa, where, err)
	}
	if review.Status.Incomplete {
		t.Fatalf("SelfSubjectRulesReview of %s/%s in %s is incomplete: %s", ns, sa, where, review.Status.EvaluationError)
	}
	set := map[rule]bool{}
	for _, r := range review.Status.ResourceRules {
		names := r.ResourceNames
		if len(names) == 0 {
			names = []string{""}
		}
		for _, verb := range r.Verbs {
			for _, group := range r.APIGroups {
				for _, res := range r.Resources {
					for _, name := range names {
						set[rule{verb: verb, group: group, resource: res, resourceName: name}] = true
					}
				}
			}
		}
	}
	for _, r := range review.Status.NonResourceRules {
		for _, verb := range r.Verbs {
			for _, url := range r.NonResourceURLs {
				set[rule{verb: verb, nonResourceURL: url}] = true
			}
		}
	}
	return set
}

// unbound creates, in namespace ns, a ServiceAccount no role is bound to and
// returns its name.
func unbound(t *testing.T, c client.Client, ns string) string {
	t.Helper()
	sa := &unstructured.Unstructured{}
	sa.SetAPIVersion("v1")
	sa.SetKind("ServiceAccount")
	sa.SetNamespace(ns)
	sa.SetName("kvgate-test-unbound")
	if err := applyObject(t, c, sa); err != nil {
		t.Fatal(err)
	}
	return sa.GetName()
}

func serviceAccountUser(ns, sa string) string { return "system:serviceaccount:" + ns + ":" + sa }

func serviceAccountGroups(ns string) []string {
	return []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}
}

// sortedRules returns the rules of set in a stable order, for messages.
func sortedRules(set map[rule]bool) []rule {
	out := slices.Collect(maps.Keys(set))
	slices.SortFunc(out, func(a, b rule) int { return strings.Compare(a.String(), b.String()) })
	return out
}
