package gateway

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/pkg/config"
)

// TestLoadConfigReadsExactlyTheDeclaredVariables keeps the configuration
// reference honest: every environment variable the gateway looks up is
// declared in config.Vars (and so documented in the README and in
// config/manager/gateway.env), and every declared variable is looked up.
func TestLoadConfigReadsExactlyTheDeclaredVariables(t *testing.T) {
	declared := declaredVariables()
	read := map[string]bool{}
	e := config.NewEnv(func(name string) (string, bool) {
		read[name] = true
		return "", false
	})
	LoadConfig(e)

	var undeclared, unread []string
	for name := range read {
		if !declared[name] {
			undeclared = append(undeclared, name)
		}
	}
	for _, v := range config.Vars {
		if !read[v.Name] {
			unread = append(unread, v.Name)
		}
	}
	sort.Strings(undeclared)
	sort.Strings(unread)
	if len(undeclared) > 0 {
		t.Errorf("LoadConfig reads variables config.Vars does not declare: %v", undeclared)
	}
	if len(unread) > 0 {
		t.Errorf("config.Vars declares variables LoadConfig never reads: %v", unread)
	}
}

// TestNoPackageReadsTheEnvironmentDirectly keeps every setting on the
// declared path: outside package main (which hands os.LookupEnv to
// config.Env) and test support, no code reads the environment itself or
// names a kvgate or AIBrix variable anywhere but pkg/config.
func TestNoPackageReadsTheEnvironmentDirectly(t *testing.T) {
	root := filepath.Join("..", "..")
	// os.Environ is not listed: handing the environment on to a child
	// process reads no setting.
	readers := map[string]bool{"Getenv": true, "LookupEnv": true, "ExpandEnv": true}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			switch rel {
			case "internal", filepath.Join("pkg", "internal"), "hack", "out", "bin":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			return err
		}
		if f.Name.Name == "main" {
			return nil
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if pkg, ok := sel.X.(*ast.Ident); ok && pkg.Name == "os" && readers[sel.Sel.Name] {
				t.Errorf("%s reads the environment with os.%s; declare a config.Var and read it through config.Env", rel, sel.Sel.Name)
			}
			return true
		})
		for _, lit := range stringLiterals(f) {
			if (strings.HasPrefix(lit, "AIBRIX_") || strings.HasPrefix(lit, "KVGATE_")) && filepath.Dir(rel) != filepath.Join("pkg", "config") {
				t.Errorf("%s names environment variable %q outside pkg/config, where variables are declared", rel, lit)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func stringLiterals(f *ast.File) []string {
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
			if s, err := strconv.Unquote(lit.Value); err == nil {
				out = append(out, s)
			}
		}
		return true
	})
	return out
}
