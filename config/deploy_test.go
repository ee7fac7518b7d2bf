package manifests

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestKustomizeBuildScriptSetsTheImage runs hack/kustomize-build.sh, whose
// output make deploy, undeploy, deploy-sample and build-installer send to
// kubectl, and checks that it renders what the other tests check, with
// every kvgate image replaced by the one asked for and nothing else
// changed, and that it leaves no temporary overlay behind.
func TestKustomizeBuildScriptSetsTheImage(t *testing.T) {
	const image = "registry.example.com:5000/team/kvgate:v1.2.3"
	for _, in := range installs {
		dir := in.dir
		t.Run(dir, func(t *testing.T) {
			// The first run builds kustomize, minutes on a loaded machine.
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
			defer cancel()
			out, err := exec.CommandContext(ctx, "../hack/kustomize-build.sh", dir, image).Output()
			if err != nil {
				t.Fatalf("hack/kustomize-build.sh %s: %v\n%s", dir, err, stderr(err))
			}
			got, err := decodeObjects(out)
			if err != nil {
				t.Fatal(err)
			}
			want := render(t, dir)
			for _, o := range want {
				setKvgateImage(t, o, image)
			}
			if !reflect.DeepEqual(byID(got), byID(want)) {
				t.Errorf("hack/kustomize-build.sh %s %s renders\n%s\nwant\n%s", dir, image, out, asJSON(t, want))
			}
		})
	}
	if left, _ := filepath.Glob("../.kustomize-build.*"); len(left) > 0 {
		t.Errorf("temporary overlays left behind: %q", left)
	}
}

// setKvgateImage replaces the kvgate images (kvgate:dev in config/) of the
// pod template of o, if o has one, by image.
func setKvgateImage(t *testing.T, o *unstructured.Unstructured, image string) {
	t.Helper()
	path := []string{"spec", "template", "spec", "containers"}
	containers, found, err := unstructured.NestedSlice(o.Object, path...)
	if err != nil || !found {
		return
	}
	for _, c := range containers {
		if c := c.(map[string]any); c["image"] == "kvgate:dev" {
			c["image"] = image
		}
	}
	if err := unstructured.SetNestedSlice(o.Object, containers, path...); err != nil {
		t.Fatal(err)
	}
}

// byID indexes objects by kind, namespace and name.
func byID(objs []*unstructured.Unstructured) map[string]map[string]any {
	m := map[string]map[string]any{}
	for _, o := range objs {
		m[o.GetKind()+" "+o.GetNamespace()+"/"+o.GetName()] = o.Object
	}
	return m
}

func asJSON(t *testing.T, objs []*unstructured.Unstructured) string {
	t.Helper()
	var s string
	for _, o := range objs {
		b, err := o.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		s += string(b) + "\n"
	}
	return s
}

// stderr returns the standard error of a failed command, if captured.
func stderr(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(ee.Stderr)
	}
	return ""
}
