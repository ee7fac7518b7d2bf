package manifests

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// gatewayContainer is the name of the gateway's container in its Deployment.
const gatewayContainer = "gateway"

// gatewayManifest is the gateway's part of a rendered kustomization.
type gatewayManifest struct {
	deployment *appsv1.Deployment
	container  *corev1.Container
	// configMaps are the rendered ConfigMaps by name.
	configMaps map[string]*corev1.ConfigMap
}

// findGateway returns the gateway of objs: the one Deployment labelled
// app.kubernetes.io/component: gateway and its container named
// gatewayContainer.
func findGateway(t *testing.T, objs []*unstructured.Unstructured) gatewayManifest {
	t.Helper()
	g := gatewayManifest{configMaps: map[string]*corev1.ConfigMap{}}
	for _, u := range only(objs, "ConfigMap") {
		cm := &corev1.ConfigMap{}
		fromUnstructured(t, u, cm)
		g.configMaps[cm.Name] = cm
	}
	for _, u := range only(objs, "Deployment") {
		if u.GetLabels()["app.kubernetes.io/component"] != "gateway" {
			continue
		}
		if g.deployment != nil {
			t.Fatalf("two gateway Deployments: %s and %s", g.deployment.Name, u.GetName())
		}
		g.deployment = &appsv1.Deployment{}
		fromUnstructured(t, u, g.deployment)
	}
	if g.deployment == nil {
		t.Fatal("no Deployment labelled app.kubernetes.io/component: gateway")
	}
	for i, c := range g.deployment.Spec.Template.Spec.Containers {
		if c.Name == gatewayContainer {
			g.container = &g.deployment.Spec.Template.Spec.Containers[i]
		}
	}
	if g.container == nil {
		t.Fatalf("Deployment %s has no container %q", g.deployment.Name, gatewayContainer)
	}
	return g
}

// fromUnstructured converts u into the typed object out.
func fromUnstructured(t *testing.T, u *unstructured.Unstructured, out any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, out, true); err != nil {
		t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
	}
}

// port returns the number of the container port named name, or fails t.
func port(t *testing.T, c *corev1.Container, name string) int32 {
	t.Helper()
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	t.Fatalf("container %s has no port named %q", c.Name, name)
	return 0
}
