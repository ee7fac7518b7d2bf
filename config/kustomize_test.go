package manifests

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// kustomization is one kustomization.yaml of config/.
type kustomization struct {
	// dir is the kustomization's directory relative to config/, e.g.
	// "default" or "samples/vllm".
	dir string
	// component is true for a kustomize Component, which only renders
	// inside the kustomizations that include it.
	component bool
	// refs are the directories, relative to config/, of the
	// kustomizations it includes as resources or components.
	refs []string
	// commentedRefs are those its commented lines would include
	// ("#- ../prometheus"), for a feature an operator turns on.
	commentedRefs []string
}

// kustomizations returns every kustomization under config/ but testdata,
// sorted by directory.
func kustomizations(t *testing.T) []kustomization {
	t.Helper()
	var ks []kustomization
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path == "testdata" {
			return filepath.SkipDir
		}
		if d.IsDir() || d.Name() != "kustomization.yaml" {
			return nil
		}
		k, err := readKustomization(filepath.Dir(path))
		if err == nil {
			ks = append(ks, k)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(ks) == 0 {
		t.Fatal("no kustomization.yaml under config/")
	}
	return ks
}

func readKustomization(dir string) (kustomization, error) {
	text, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		return kustomization{}, err
	}
	var spec struct {
		Kind       string   `json:"kind"`
		Resources  []string `json:"resources"`
		Components []string `json:"components"`
	}
	if err := yaml.Unmarshal(text, &spec); err != nil {
		return kustomization{}, errors.Join(errors.New(dir+"/kustomization.yaml"), err)
	}
	k := kustomization{dir: filepath.ToSlash(dir), component: spec.Kind == "Component"}
	for _, r := range append(spec.Resources, spec.Components...) {
		if ref := filepath.Join(dir, r); isDir(ref) {
			k.refs = append(k.refs, filepath.ToSlash(ref))
		}
	}
	for _, line := range strings.Split(string(text), "\n") {
		if r, ok := strings.CutPrefix(line, "#- "); ok && isDir(filepath.Join(dir, r)) {
			k.commentedRefs = append(k.commentedRefs, filepath.ToSlash(filepath.Join(dir, r)))
		}
	}
	return k, nil
}

func isDir(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}

// roots returns the kustomizations that no other one includes: the units an
// operator installs (overlays and samples). The others are bases and
// components, installed through the roots.
func roots(ks []kustomization) []kustomization {
	included := map[string]bool{}
	for _, k := range ks {
		for _, r := range append(k.refs, k.commentedRefs...) {
			included[r] = true
		}
	}
	var out []kustomization
	for _, k := range ks {
		if !included[k.dir] {
			out = append(out, k)
		}
	}
	return out
}

// render builds the kustomization in dir (relative to config/) from the
// files on disk, as `kustomize build` does.
func render(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	objs, err := build(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build config/%s: %v", dir, err)
	}
	return objs
}

// renderEnabling builds the kustomization in dir with its commented lines
// that include feature (a directory relative to config/, e.g. "prometheus")
// uncommented, as the operator turning the feature on does. It fails t when
// dir has no such lines.
func renderEnabling(t *testing.T, dir, feature string) []*unstructured.Unstructured {
	t.Helper()
	mem := filesys.MakeFsInMemory()
	abs, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	err = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(path)
		if err == nil {
			err = mem.WriteFile(filepath.Join(abs, path), data)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(abs, dir, "kustomization.yaml")
	text, err := mem.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(dir, feature)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	uncommented := 0
	for _, line := range strings.Split(string(text), "\n") {
		if line == "#components:" || line == "#- "+filepath.ToSlash(rel) {
			line = strings.TrimPrefix(line, "#")
			uncommented++
		}
		lines = append(lines, line)
	}
	if uncommented != 2 {
		t.Fatalf("config/%s/kustomization.yaml: want the two commented lines %q and %q that enable %s, found %d such lines",
			dir, "#components:", "#- "+rel, feature, uncommented)
	}
	if err := mem.WriteFile(path, []byte(strings.Join(lines, "\n"))); err != nil {
		t.Fatal(err)
	}
	objs, err := build(mem, filepath.Join(abs, dir))
	if err != nil {
		t.Fatalf("kustomize build config/%s with %s enabled: %v", dir, feature, err)
	}
	return objs
}

func build(fsys filesys.FileSystem, dir string) ([]*unstructured.Unstructured, error) {
	resources, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fsys, dir)
	if err != nil {
		return nil, err
	}
	text, err := resources.AsYaml()
	if err != nil {
		return nil, err
	}
	return decodeObjects(text)
}

// decodeObjects decodes a stream of YAML documents into objects.
func decodeObjects(text []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(text), 4096)
	var objs []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
			return objs, nil
		} else if err != nil {
			return nil, err
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
}

// only returns the objects of the given kind.
func only(objs []*unstructured.Unstructured, kind string) []*unstructured.Unstructured {
	return slices.DeleteFunc(slices.Clone(objs), func(u *unstructured.Unstructured) bool { return u.GetKind() != kind })
}
