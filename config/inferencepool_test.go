package manifests

import (
	"net"
	"slices"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/kvgate/kvgate/pkg/config"
)

// TestInferencePoolSampleWiresThePoolToThePicker follows a request through
// the InferencePool sample as its objects describe it: the Gateway's
// HTTPRoute sends it to the pool, the pool's endpointPickerRef names a
// Service port that reaches the gateway's external processor, served over
// TLS as gateways connect to pickers, and the gateway discovers that pool.
func TestInferencePoolSampleWiresThePoolToThePicker(t *testing.T) {
	objs := render(t, poolSample)
	s := loadSettings(t, poolSample)
	pools := inferencePools(t, objs)
	if len(pools) != 1 {
		t.Fatalf("%d InferencePools, want 1", len(pools))
	}
	pool := pools[0]

	d := s.config.Discovery
	if d.Mode != config.DiscoveryInferencePool || (len(d.Pools) > 0 && !slices.Contains(d.Pools, pool.Name)) ||
		d.Namespace != pool.Namespace {
		t.Errorf("the gateway discovers %s; want the pool %s/%s", d, pool.Namespace, pool.Name)
	}
	x := s.config.ExtProc
	_, listen, err := net.SplitHostPort(x.ListenAddress)
	if err != nil {
		t.Fatalf("external processing address %q: %v", x.ListenAddress, err)
	}
	if strconv.Itoa(int(port(t, s.manifest.container, "extproc"))) != listen || !x.TLS {
		t.Errorf("external processing on %s (TLS %v); want the container port extproc, over TLS", x.ListenAddress, x.TLS)
	}
	if !s.config.DisableProxy {
		t.Errorf("the picker serves the OpenAI API too: clients are to go through the Gateway")
	}

	ref := picker(t, objs, pool.Name)
	svc := &corev1.Service{}
	for _, u := range only(objs, "Service") {
		if u.GetName() == ref.name {
			fromUnstructured(t, u, svc)
		}
	}
	if svc.Name == "" {
		t.Fatalf("the pool's picker, Service %s, is not installed", ref.name)
	}
	reaches := false
	for _, p := range svc.Spec.Ports {
		reaches = reaches || (int(p.Port) == ref.port && p.TargetPort.StrVal == "extproc")
	}
	if !reaches || !labelsMatch(svc.Spec.Selector, s.manifest.deployment.Spec.Template.Labels) {
		t.Errorf("Service %s does not send port %d to the gateway's extproc port: %+v", svc.Name, ref.port, svc.Spec)
	}

	var gateways []string
	for _, u := range only(objs, "Gateway") {
		g := &gatewayv1.Gateway{}
		fromUnstructured(t, u, g)
		gateways = append(gateways, g.Name)
	}
	routed := false
	for _, u := range only(objs, "HTTPRoute") {
		r := &gatewayv1.HTTPRoute{}
		fromUnstructured(t, u, r)
		for _, parent := range r.Spec.ParentRefs {
			if !slices.Contains(gateways, string(parent.Name)) {
				t.Errorf("HTTPRoute %s's parent %s is not a Gateway of the sample", r.Name, parent.Name)
			}
		}
		for _, rule := range r.Spec.Rules {
			for _, b := range rule.BackendRefs {
				routed = routed || (b.Group != nil && string(*b.Group) == "inference.networking.k8s.io" &&
					b.Kind != nil && string(*b.Kind) == "InferencePool" && string(b.Name) == pool.Name)
			}
		}
	}
	if !routed {
		t.Errorf("no HTTPRoute sends requests to the InferencePool %s", pool.Name)
	}
}

// pickerRef is an InferencePool's endpointPickerRef.
type pickerRef struct {
	name, failureMode string
	port              int
}

// picker returns the endpointPickerRef of pool name among objs.
func picker(t *testing.T, objs []*unstructured.Unstructured, name string) pickerRef {
	t.Helper()
	for _, u := range only(objs, "InferencePool") {
		if u.GetName() != name {
			continue
		}
		ref, _, _ := unstructured.NestedMap(u.Object, "spec", "endpointPickerRef")
		r := pickerRef{}
		r.name, _ = ref["name"].(string)
		r.failureMode, _ = ref["failureMode"].(string)
		switch n, _, _ := unstructured.NestedFieldNoCopy(ref, "port", "number"); n := n.(type) {
		case int64:
			r.port = int(n)
		case float64:
			r.port = int(n)
		}
		return r
	}
	t.Fatalf("no InferencePool %s", name)
	return pickerRef{}
}

// labelsMatch reports whether a selector selects objects with labels.
func labelsMatch(selector, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return len(selector) > 0
}

// TestInferenceObjectiveCRDTakesWhatDiscoveryReads applies InferenceObjectives
// to the CRD config/inference-extension installs: one naming only its pool
// gets the extension's defaults for the pool's group and kind and no
// priority (0), one with a negative priority keeps it, and one without a
// pool is refused.
func TestInferenceObjectiveCRDTakesWhatDiscoveryReads(t *testing.T) {
	var crds []string
	for _, o := range only(render(t, "inference-extension"), "CustomResourceDefinition") {
		crds = append(crds, o.GetName())
	}
	slices.Sort(crds)
	if want := []string{"inferencemodelrewrites.inference.networking.x-k8s.io", "inferenceobjectives.inference.networking.x-k8s.io",
		"inferencepools.inference.networking.k8s.io"}; !slices.Equal(crds, want) {
		t.Fatalf("config/inference-extension installs the CRDs %q; want %q", crds, want)
	}
	c, _ := newClient(t)
	objective := func(name string, spec map[string]any) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceObjective",
			"metadata": map[string]any{"name": name, "namespace": "default"}, "spec": spec,
		}}
	}
	plain := objective("objective-plain", map[string]any{"poolRef": map[string]any{"name": "llama"}})
	if err := c.Create(testContext(t), plain); err != nil {
		t.Fatalf("create an objective naming its pool alone: %v", err)
	}
	t.Cleanup(func() { _ = c.Delete(testContext(t), plain) })
	group, _, _ := unstructured.NestedString(plain.Object, "spec", "poolRef", "group")
	kind, _, _ := unstructured.NestedString(plain.Object, "spec", "poolRef", "kind")
	_, hasPriority, _ := unstructured.NestedFieldNoCopy(plain.Object, "spec", "priority")
	if group != "inference.networking.k8s.io" || kind != "InferencePool" || hasPriority {
		t.Errorf("stored poolRef group %q kind %q, priority set %v; want the InferencePool group and kind, no priority",
			group, kind, hasPriority)
	}
	sheddable := objective("objective-sheddable", map[string]any{"priority": int64(-1), "poolRef": map[string]any{"name": "llama"}})
	if err := c.Create(testContext(t), sheddable); err != nil {
		t.Fatalf("create a sheddable objective: %v", err)
	}
	t.Cleanup(func() { _ = c.Delete(testContext(t), sheddable) })
	if p, _, _ := unstructured.NestedInt64(sheddable.Object, "spec", "priority"); p != -1 {
		t.Errorf("stored priority %d; want -1", p)
	}
	if err := c.Create(testContext(t), objective("objective-poolless", map[string]any{"priority": int64(1)})); err == nil {
		t.Errorf("an objective naming no pool was accepted")
	}
}
