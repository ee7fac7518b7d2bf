package manifests

import (
	"bufio"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kvgate/kvgate/pkg/config"
)

var update = flag.Bool("update", false, "rewrite manager/gateway.env from the variables pkg/config declares")

// envFilePath is the file the gateway-env ConfigMap is generated from.
const envFilePath = "manager/gateway.env"

const envFileHeader = `# Settings of the kvgate gateway. The gateway-env ConfigMap is generated from
# this file (config/manager/kustomization.yaml) and the gateway reads it as its
# environment.
#
# Every variable the gateway reads is listed, with its meaning, commented out
# at its default: a variable that is not set takes its default. To set one,
# uncomment it here, or merge it into gateway-env from your own overlay of
# config/default, naming the namespace that overlay installs into:
#
#   configMapGenerator:
#   - name: gateway-env
#     namespace: kvgate-system
#     behavior: merge
#     literals:
#     - KVGATE_ROUTING_ALGORITHM=prefix-cache
#
# The ConfigMap's name carries a hash of its content, so a change rolls the
# gateway's pods. The comments are generated from the declarations in
# pkg/config by ` + "`go test ./config -update`" + `, which keeps the settings.
`

// envFile renders the env file of the gateway's settings: every variable of
// vars, by section, with its documentation, commented out at its default
// unless values sets it. Variables in inDeployment are set by the
// Deployment's env instead, which the file says.
func envFile(vars []config.Var, values map[string]string, inDeployment map[string]bool) string {
	var b strings.Builder
	b.WriteString(envFileHeader)
	for _, section := range config.Sections {
		first := true
		for _, v := range vars {
			if v.Section != section {
				continue
			}
			if first {
				fmt.Fprintf(&b, "\n\n## %s\n", section)
				first = false
			}
			b.WriteString("\n")
			writeComment(&b, v.Doc)
			if len(v.Aliases) > 0 {
				writeComment(&b, "Read from "+strings.Join(v.Aliases, " or ")+" when unset.")
			}
			switch value, set := values[v.Name]; {
			case inDeployment[v.Name]:
				writeComment(&b, v.Name+" (default "+strconv.Quote(v.Default)+") is set by the gateway's Deployment (gateway.yaml), not here.")
			case set:
				fmt.Fprintf(&b, "%s=%s\n", v.Name, value)
			default:
				fmt.Fprintf(&b, "# %s=%s\n", v.Name, v.Default)
			}
		}
	}
	return b.String()
}

// writeComment writes text as comment lines of at most 80 columns.
func writeComment(b *strings.Builder, text string) {
	line := "#"
	for _, word := range strings.Fields(text) {
		if len(line)+1+len(word) > 80 && line != "#" {
			b.WriteString(line + "\n")
			line = "#"
		}
		line += " " + word
	}
	b.WriteString(line + "\n")
}

// parseEnvFile returns the settings of an env file: its lines NAME=value
// that are not comments, as kustomize reads them.
func parseEnvFile(text string) (map[string]string, error) {
	values := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, value, ok := strings.Cut(line, "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("line %d: %q is neither a comment nor NAME=value", n, line)
		}
		if _, dup := values[name]; dup {
			return nil, fmt.Errorf("line %d: %s set twice", n, name)
		}
		values[name] = value
	}
	return values, sc.Err()
}

func TestParseEnvFile(t *testing.T) {
	tests := []struct {
		name    string
		text    string
		want    map[string]string
		wantErr bool
	}{
		{"comments and blank lines are skipped", "# A=1\n\n  # B=2\n", map[string]string{}, false},
		{"settings keep everything after the first =", "A=x=y\nB=\n", map[string]string{"A": "x=y", "B": ""}, false},
		{"a line without = is refused", "A\n", nil, true},
		{"a name set twice is refused", "A=1\nA=2\n", nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseEnvFile(tt.text)
			if (err != nil) != tt.wantErr || (err == nil && !maps.Equal(got, tt.want)) {
				t.Errorf("parseEnvFile(%q) = %v, %v; want %v, error %v", tt.text, got, err, tt.want, tt.wantErr)
			}
		})
	}
}

// TestGatewayEnvFileListsEveryVariable keeps manager/gateway.env equal to
// what envFile renders from config.Vars and the file's own settings, so
// that a variable declared in pkg/config but missing here, or documented
// differently, fails until `go test ./config -update` rewrites the file.
func TestGatewayEnvFileListsEveryVariable(t *testing.T) {
	text, err := os.ReadFile(envFilePath)
	if err != nil {
		t.Fatal(err)
	}
	values, err := parseEnvFile(string(text))
	if err != nil {
		t.Fatalf("%s: %v", envFilePath, err)
	}
	declared := declaredNames()
	for name := range values {
		if !declared[name] {
			t.Errorf("%s sets %s, which pkg/config does not declare (config.Vars)", envFilePath, name)
		}
	}
	inDeployment := map[string]bool{}
	for _, e := range findGateway(t, render(t, "manager")).container.Env {
		inDeployment[e.Name] = true
	}
	want := envFile(config.Vars, values, inDeployment)
	for _, v := range config.Vars {
		_, set := values[v.Name]
		if !set && !inDeployment[v.Name] && !strings.Contains(want, "\n# "+v.Name+"=") {
			t.Fatalf("%s cannot list %s: its section %q is not in config.Sections", envFilePath, v.Name, v.Section)
		}
	}
	if string(text) == want {
		return
	}
	if !*update {
		t.Fatalf("%s is out of date with pkg/config: run go test ./config -update", envFilePath)
	}
	if err := os.WriteFile(envFilePath, []byte(want), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestGatewaySetsOnlyDeclaredVariables checks, in every installation of
// the gateway, that each variable its container gets (env, or a ConfigMap
// through envFrom) is declared in pkg/config under its own name, not an
// alias, and that the container reads the ConfigMap made of gateway.env.
func TestGatewaySetsOnlyDeclaredVariables(t *testing.T) {
	declared := declaredNames()
	for _, dir := range []string{"default", "namespaced", poolSample} {
		t.Run(dir, func(t *testing.T) {
			g := findGateway(t, render(t, dir))
			env, secrets := gatewayEnvironment(t, g)
			for _, name := range slices.Concat(slices.Collect(maps.Keys(env)), secrets) {
				if !declared[name] {
					t.Errorf("the gateway container sets %s, which pkg/config does not declare (config.Vars)", name)
				}
			}
			if !readsEnvFile(g) {
				t.Errorf("the gateway container does not read the gateway-env ConfigMap through envFrom")
			}
		})
	}
}

// TestOverlaySetsAGatewayVariable applies the way gateway.env tells an
// operator to set a variable: a merge into gateway-env from an overlay of
// config/default. The gateway must get the value, and the Deployment must
// name the merged ConfigMap, whose new hash rolls the pods.
func TestOverlaySetsAGatewayVariable(t *testing.T) {
	base := findGateway(t, render(t, "default"))
	g := findGateway(t, render(t, "testdata/settings-overlay"))
	env, _ := gatewayEnvironment(t, g)
	if got := env[config.RoutingAlgorithm.Name]; got.value != "prefix-cache" {
		t.Errorf("%s = %q from %s, want prefix-cache from the overlay", config.RoutingAlgorithm.Name, got.value, got.from)
	}
	if before, after := base.container.EnvFrom[0].ConfigMapRef.Name, g.container.EnvFrom[0].ConfigMapRef.Name; before == after {
		t.Errorf("the ConfigMap keeps its name %s: changing a setting would not roll the gateway", after)
	}
}

// readsEnvFile reports whether the gateway's container reads a ConfigMap
// generated from gateway.env: one named <prefix>gateway-env-<hash>.
func readsEnvFile(g gatewayManifest) bool {
	for _, from := range g.container.EnvFrom {
		if ref := from.ConfigMapRef; ref != nil && strings.Contains(ref.Name, "gateway-env-") && g.configMaps[ref.Name] != nil {
			return true
		}
	}
	return false
}

// declaredNames returns the names (not aliases) of config.Vars.
func declaredNames() map[string]bool {
	names := map[string]bool{}
	for _, v := range config.Vars {
		names[v.Name] = true
	}
	return names
}

// setting is how the gateway's container gets one variable.
type setting struct {
	value string
	// from says where the value comes from, for messages.
	from string
}

// gatewayEnvironment returns the variables the gateway's container is
// started with, as the kubelet resolves them in the Deployment's namespace:
// ConfigMaps of envFrom first, then env, which wins. An optional secret key
// is left unset, as it is when the Secret does not exist; it is returned in
// secrets.
func gatewayEnvironment(t *testing.T, g gatewayManifest) (env map[string]setting, secrets []string) {
	t.Helper()
	env = map[string]setting{}
	for _, from := range g.container.EnvFrom {
		if from.ConfigMapRef == nil || from.Prefix != "" {
			t.Fatalf("envFrom %+v: the gateway reads only ConfigMaps, without prefix", from)
		}
		cm := g.configMaps[from.ConfigMapRef.Name]
		if cm == nil {
			t.Fatalf("envFrom names ConfigMap %s, which is not installed", from.ConfigMapRef.Name)
		}
		for k, v := range cm.Data {
			env[k] = setting{v, "ConfigMap " + cm.Name}
		}
	}
	for _, e := range g.container.Env {
		switch src := e.ValueFrom; {
		case src == nil:
			env[e.Name] = setting{e.Value, "env"}
		case src.FieldRef != nil && src.FieldRef.FieldPath == "metadata.namespace":
			env[e.Name] = setting{g.deployment.Namespace, "env from metadata.namespace"}
		case isOptionalSecret(src):
			delete(env, e.Name)
			secrets = append(secrets, e.Name)
		default:
			t.Fatalf("env %s: a source the test does not resolve: %+v", e.Name, src)
		}
	}
	slices.Sort(secrets)
	return env, secrets
}

func isOptionalSecret(src *corev1.EnvVarSource) bool {
	ref := src.SecretKeyRef
	return ref != nil && ref.Optional != nil && *ref.Optional
}
