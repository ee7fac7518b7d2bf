package manifests

import (
	"net"
	"slices"
	"strconv"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
)

// TestGatewayRunsReplicasThatShareStateAndStayAvailable checks each
// installation: two gateway replicas, a PodDisruptionBudget that keeps one
// through drains, the shared state switched on against the Redis Service
// it ships, and NetworkPolicies that admit the API port from clients and
// Redis from the gateway only.
func TestGatewayRunsReplicasThatShareStateAndStayAvailable(t *testing.T) {
	for _, dir := range []string{"default", "namespaced"} {
		t.Run(dir, func(t *testing.T) {
			objs := render(t, dir)
			s := loadSettings(t, dir)
			d := s.manifest.deployment
			podLabels := labels.Set(d.Spec.Template.Labels)
			if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
				t.Errorf("gateway replicas %v, want 2", d.Spec.Replicas)
			}
			pdbs := only(objs, "PodDisruptionBudget")
			if len(pdbs) != 1 {
				t.Fatalf("%d PodDisruptionBudgets, want 1", len(pdbs))
			}
			pdb := &policyv1.PodDisruptionBudget{}
			fromUnstructured(t, pdbs[0], pdb)
			if sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector); err != nil || !sel.Matches(podLabels) ||
				pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 1 {
				t.Errorf("PodDisruptionBudget %+v does not keep one gateway pod available (%v)", pdb.Spec, err)
			}

			rc := s.config.Redis
			if !rc.SharedCounts {
				t.Error("the gateway does not share its state")
			}
			host, p, err := net.SplitHostPort(rc.Address)
			if err != nil {
				t.Fatalf("Redis address %q: %v", rc.Address, err)
			}
			redisPod := labels.Set{}
			found := false
			for _, u := range only(objs, "Service") {
				if u.GetName() == host {
					found = true
					sel, _, _ := unstructuredSelector(u)
					redisPod = labels.Set(sel)
				}
			}
			if !found || p != "6379" {
				t.Fatalf("Redis address %q names no Service of the installation on 6379", rc.Address)
			}

			policies := map[string]*networkingv1.NetworkPolicy{}
			for _, u := range only(objs, "NetworkPolicy") {
				np := &networkingv1.NetworkPolicy{}
				fromUnstructured(t, u, np)
				policies[np.Spec.PodSelector.String()] = np
				sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
				if err != nil {
					t.Fatal(err)
				}
				switch {
				case sel.Matches(podLabels):
					if ports := admittedPorts(np); !slices.Equal(ports, []string{"http"}) {
						t.Errorf("gateway pods admit ports %q, want only the API port http", ports)
					}
				case sel.Matches(redisPod):
					rule := np.Spec.Ingress
					if len(rule) != 1 || len(rule[0].From) != 1 || rule[0].From[0].PodSelector == nil ||
						!labels.SelectorFromSet(rule[0].From[0].PodSelector.MatchLabels).Matches(podLabels) ||
						rule[0].From[0].NamespaceSelector != nil {
						t.Errorf("Redis admits %+v, want the gateway's pods only", rule)
					}
				}
			}
			if len(policies) != 2 {
				t.Errorf("%d NetworkPolicies, want the gateway's and Redis'", len(policies))
			}
		})
	}
}

// admittedPorts lists the ports np's ingress rules admit, by name or
// number.
func admittedPorts(np *networkingv1.NetworkPolicy) []string {
	var out []string
	for _, r := range np.Spec.Ingress {
		for _, p := range r.Ports {
			if p.Port == nil {
				out = append(out, "all")
				continue
			}
			if p.Port.StrVal != "" {
				out = append(out, p.Port.StrVal)
			} else {
				out = append(out, strconv.Itoa(p.Port.IntValue()))
			}
		}
	}
	return out
}

// unstructuredSelector returns the selector of Service u.
func unstructuredSelector(u *unstructured.Unstructured) (map[string]string, bool, error) {
	return unstructured.NestedStringMap(u.Object, "spec", "selector")
}
