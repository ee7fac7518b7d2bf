package manifests

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// install is a root kustomization (one an operator applies) and what it
// needs from the cluster.
type install struct {
	// dir is the kustomization's directory relative to config/.
	dir string
	// namespace is the namespace the installation expects to exist: the
	// test creates it, and places there the objects without a namespace.
	// "" when the kustomization creates its namespace.
	namespace string
	// podSecurity is the Pod Security Standard its pods meet; the test's
	// namespaces warn on any pod template below it.
	podSecurity string
}

// installs lists every root kustomization of config/;
// TestInstallsCoverEveryRootKustomization keeps it complete.
var installs = []install{
	{dir: "default", podSecurity: "restricted"},
	{dir: "namespaced", namespace: "kvgate", podSecurity: "restricted"},
	{dir: "samples/simulator", namespace: "sim-models", podSecurity: "restricted"},
	// vLLM's image runs as root.
	{dir: "samples/vllm", namespace: "vllm-models", podSecurity: "baseline"},
	{dir: "samples/vllm-dp", namespace: "vllm-dp-models", podSecurity: "baseline"},
	// The InferencePool, InferenceObjective and InferenceModelRewrite CRDs:
	// cluster-scoped, no pods.
	{dir: "inference-extension"},
	{dir: poolSample, namespace: "llm", podSecurity: "restricted"},
}

// poolSample is the sample deploying kvgate as an InferencePool's picker.
const poolSample = "samples/inferencepool"

// installOf returns the install of dir.
func installOf(t *testing.T, dir string) install {
	t.Helper()
	for _, in := range installs {
		if in.dir == dir {
			return in
		}
	}
	t.Fatalf("no install of config/%s", dir)
	return install{}
}

const fieldOwner = client.FieldOwner("kvgate-manifests-test")

func TestInstallsCoverEveryRootKustomization(t *testing.T) {
	ks := kustomizations(t)
	var want, got []string
	for _, k := range roots(ks) {
		want = append(want, k.dir)
	}
	for _, in := range installs {
		got = append(got, in.dir)
	}
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("installs = %q, but the root kustomizations of config/ are %q", got, want)
	}
	for _, k := range ks {
		if len(k.commentedRefs) > 0 && !slices.Contains(want, k.dir) {
			t.Errorf("config/%s is included by another kustomization but has commented-out features %q: "+
				"only a root's features are tested", k.dir, k.commentedRefs)
		}
	}
}

func TestEveryKustomizationRenders(t *testing.T) {
	for _, k := range kustomizations(t) {
		if k.component {
			continue // rendered by TestInstallsPassServerSideDryRun, in the roots that enable it
		}
		t.Run(k.dir, func(t *testing.T) {
			objs := render(t, k.dir)
			if len(objs) == 0 {
				t.Fatal("renders no object")
			}
			for _, o := range objs {
				if o.GetAPIVersion() == "" || o.GetKind() == "" || o.GetName() == "" {
					t.Errorf("object without apiVersion, kind or name: %v", o.Object)
				}
			}
		})
	}
}

// TestInstallsPassServerSideDryRun applies every root kustomization to the
// API server with server-side apply in dry-run mode, as `kubectl apply
// --server-side --dry-run=server` does: schemas, strict field validation
// (unknown fields fail), defaulting and admission run, nothing is stored.
// Each feature a root turns on by uncommenting lines (the ServiceMonitor) is
// applied as well, on its own.
func TestInstallsPassServerSideDryRun(t *testing.T) {
	c, w := newClient(t)
	ks := kustomizations(t)
	for _, in := range installs {
		t.Run(in.dir, func(t *testing.T) {
			dryRunApply(t, c, w, in, render(t, in.dir))
			for _, k := range ks {
				if k.dir != in.dir {
					continue
				}
				for _, feature := range k.commentedRefs {
					t.Run("with "+feature, func(t *testing.T) {
						dryRunApply(t, c, w, in, renderEnabling(t, in.dir, feature))
					})
				}
			}
		})
	}
}

// TestDryRunCatchesWhatItChecks proves that the dry run of
// TestInstallsPassServerSideDryRun fails on an unknown field and on a pod
// template below the namespace's Pod Security Standard.
func TestDryRunCatchesWhatItChecks(t *testing.T) {
	c, w := newClient(t)
	in := install{dir: "default", podSecurity: "restricted"}
	ensureNamespaces(t, c, in, render(t, in.dir))
	tests := []struct {
		name   string
		mutate func(container map[string]any)
		// wantErr or wantWarning is a fragment of the expected error or
		// warning.
		wantErr, wantWarning string
	}{
		{"unknown field", func(ct map[string]any) { ct["imagePullPolicyy"] = "Always" }, "imagePullPolicyy", ""},
		{"privilege escalation", func(ct map[string]any) {
			ct["securityContext"].(map[string]any)["allowPrivilegeEscalation"] = true
		}, "", "allowPrivilegeEscalation"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			deploy := only(render(t, in.dir), "Deployment")[0]
			containers, _, _ := unstructured.NestedSlice(deploy.Object, "spec", "template", "spec", "containers")
			tt.mutate(containers[0].(map[string]any))
			if err := unstructured.SetNestedSlice(deploy.Object, containers, "spec", "template", "spec", "containers"); err != nil {
				t.Fatal(err)
			}
			w.take()
			err := applyObject(t, c, deploy, client.DryRunAll)
			warned := strings.Join(w.take(), "\n")
			switch {
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("dry run error = %v, want one mentioning %q", err, tt.wantErr)
			case tt.wantWarning != "" && (err != nil || !strings.Contains(warned, tt.wantWarning)):
				t.Errorf("dry run error = %v, warnings %q; want no error and a warning mentioning %q", err, warned, tt.wantWarning)
			}
		})
	}
}

// dryRunApply creates the namespaces objs need, then dry-run applies every
// object, failing t on any error or warning.
func dryRunApply(t *testing.T, c client.Client, w *warnings, in install, objs []*unstructured.Unstructured) {
	t.Helper()
	ensureNamespaces(t, c, in, objs)
	w.take()
	for _, o := range objs {
		if err := applyObject(t, c, o, client.DryRunAll); err != nil {
			t.Errorf("%s %s: %v", o.GetKind(), o.GetName(), err)
		}
		for _, warning := range w.take() {
			t.Errorf("%s %s: warning: %s", o.GetKind(), o.GetName(), warning)
		}
	}
}

// ensureNamespaces creates, for real, the Namespaces among objs and the
// namespace in expects, and places the namespaced objects of objs that have
// none in the latter. It checks that every namespace warns below
// in.podSecurity.
func ensureNamespaces(t *testing.T, c client.Client, in install, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, ns := range only(objs, "Namespace") {
		if err := applyObject(t, c, ns); err != nil {
			t.Fatalf("Namespace %s: %v", ns.GetName(), err)
		}
	}
	if in.namespace != "" {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: in.namespace,
			Labels: map[string]string{"pod-security.kubernetes.io/warn": in.podSecurity}}}
		if err := c.Create(testContext(t), ns); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	for _, o := range objs {
		namespaced, err := c.IsObjectNamespaced(o)
		if err != nil {
			t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
		}
		if !namespaced {
			continue
		}
		if o.GetNamespace() == "" {
			if in.namespace == "" {
				t.Fatalf("%s %s has no namespace, and config/%s sets none", o.GetKind(), o.GetName(), in.dir)
			}
			o.SetNamespace(in.namespace)
		}
		var ns corev1.Namespace
		if err := c.Get(testContext(t), client.ObjectKey{Name: o.GetNamespace()}, &ns); err != nil {
			t.Fatalf("namespace of %s %s: %v", o.GetKind(), o.GetName(), err)
		}
		if got := ns.Labels["pod-security.kubernetes.io/warn"]; got != in.podSecurity {
			t.Fatalf("namespace %s warns below Pod Security Standard %q, want %q", ns.Name, got, in.podSecurity)
		}
	}
}

// applyObject applies o with server-side apply, as the test's field owner,
// taking over fields other owners hold. It leaves o as it was (the client
// would overwrite it with the server's answer).
func applyObject(t *testing.T, c client.Client, o *unstructured.Unstructured, opts ...client.ApplyOption) error {
	t.Helper()
	opts = append([]client.ApplyOption{fieldOwner, client.ForceOwnership}, opts...)
	return c.Apply(testContext(t), client.ApplyConfigurationFromUnstructured(o.DeepCopy()), opts...)
}

// testContext returns a context that ends with the test or after a minute,
// a generous bound for one request to a loaded API server.
func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}
