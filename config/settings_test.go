package manifests

import (
	"fmt"
	"net/url"
	"strconv"
	"testing"

	"github.com/kvgate/kvgate/pkg/config"
)

// settings are the gateway's settings in one installation, as the gateway
// loads them from its environment.
type settings struct {
	manifest  gatewayManifest
	kvSync    config.KVSync
	discovery config.Discovery
	// enginePort is the port of the engines' HTTP server the tokenizer
	// calls (AIBRIX_VLLM_TOKENIZER_ENDPOINT_TEMPLATE).
	enginePort int
}

// loadSettings renders the kustomization in dir and loads the gateway's
// settings from the environment its container gets, failing t on any
// setting the gateway would refuse.
func loadSettings(t *testing.T, dir string) settings {
	t.Helper()
	s := settings{manifest: findGateway(t, render(t, dir))}
	env, _ := gatewayEnvironment(t, s.manifest)
	e := config.NewEnv(func(name string) (string, bool) {
		v, ok := env[name]
		return v.value, ok
	})
	s.kvSync = config.LoadKVSync(e)
	s.discovery = config.LoadDiscovery(e)
	s.enginePort = templatePort(e, config.TokenizerEndpointTemplate)
	if err := e.Err(); err != nil {
		t.Fatalf("config/%s: the gateway would refuse its settings: %v", dir, err)
	}
	return s
}

// templatePort returns the port of the URL template v (with one %s for a
// host), recording a template without one in e.
func templatePort(e *config.Env, v config.Var) int {
	tmpl := e.String(v)
	u, err := url.Parse(fmt.Sprintf(tmpl, "10.0.0.1"))
	port := 0
	if err == nil {
		port, err = strconv.Atoi(u.Port())
	}
	if err != nil {
		e.Errorf("%s=%q: want a URL with a port", v.Name, tmpl)
	}
	return port
}

// TestGatewayDiscoversWhatItsRBACGrants checks that each installation
// watches the pods its RBAC lets it read: every namespace with the
// ClusterRole of config/default, its own namespace with the Role of
// config/namespaced.
func TestGatewayDiscoversWhatItsRBACGrants(t *testing.T) {
	tests := []struct {
		dir      string
		roleKind string
		// ownNamespace is true when the gateway must watch its own
		// namespace, false for every namespace.
		ownNamespace bool
	}{
		{"default", "ClusterRole", false},
		{"namespaced", "Role", true},
	}
	for _, tt := range tests {
		t.Run(tt.dir, func(t *testing.T) {
			s := loadSettings(t, tt.dir)
			want := ""
			if tt.ownNamespace {
				want = s.manifest.deployment.Namespace
			}
			if s.discovery.Mode != config.DiscoveryKubernetes || s.discovery.Namespace != want {
				t.Errorf("the gateway discovers %s; want kubernetes pods in namespace %q", s.discovery, want)
			}
			roles := only(render(t, tt.dir), tt.roleKind)
			if len(roles) != 1 {
				t.Fatalf("%d %ss, want 1", len(roles), tt.roleKind)
			}
			if tt.ownNamespace && roles[0].GetNamespace() != want {
				t.Errorf("the Role is in namespace %q, the gateway in %q", roles[0].GetNamespace(), want)
			}
		})
	}
}
