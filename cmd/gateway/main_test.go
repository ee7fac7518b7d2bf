package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/pkg/config"
)

func lookupFrom(m map[string]string) config.LookupFunc {
	return func(name string) (string, bool) {
		v, ok := m[name]
		return v, ok
	}
}

func TestFlagsOverrideTheirVariables(t *testing.T) {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	env := lookupFrom(map[string]string{"KVGATE_POD_DISCOVERY": "kubernetes", "KVGATE_LISTEN_ADDRESS": ":9000",
		"AIBRIX_SYNC_MAX_CONTEXTS": "7"})
	lookup, err := parseArgs(fs, []string{"--discovery", "static", "-v", "0", "--routing-algorithm=random"}, env)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"KVGATE_POD_DISCOVERY":     "static", // flag over variable
		"KVGATE_ROUTING_ALGORITHM": "random", // flag over default
		"KVGATE_LISTEN_ADDRESS":    ":9000",  // variable without its flag
		"AIBRIX_SYNC_MAX_CONTEXTS": "7",      // variable without a flag
	} {
		if got, ok := lookup(name); !ok || got != want {
			t.Errorf("%s = %q, %v; want %q", name, got, ok, want)
		}
	}
	if _, ok := lookup("KVGATE_POD_NAMESPACE"); ok {
		t.Error("a variable neither set nor flagged reads as set")
	}
}

func TestBadArgumentsExit2AndHelpExits0(t *testing.T) {
	for args, want := range map[string]int{"--no-such-flag": 2, "positional": 2, "-help": 0} {
		var stderr bytes.Buffer
		if code := run(context.Background(), strings.Fields(args), lookupFrom(nil), &stderr); code != want {
			t.Errorf("%s: exit %d, want %d (%s)", args, code, want, stderr.String())
		}
	}
}

func TestInvalidConfigurationIsRefusedWithEveryProblem(t *testing.T) {
	var stderr bytes.Buffer
	env := lookupFrom(map[string]string{
		"AIBRIX_PREFIX_CACHE_USE_REMOTE_TOKENIZER": "false",
		"KVGATE_MAX_REQUEST_BODY_BYTES":            "lots",
	})
	code := run(context.Background(), []string{"--discovery", "consul", "--routing-algorithm", "fastest"}, env, &stderr)
	if code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	for _, want := range []string{"refusing to start", `KVGATE_POD_DISCOVERY="consul"`, `KVGATE_ROUTING_ALGORITHM="fastest"`,
		`KVGATE_MAX_REQUEST_BODY_BYTES="lots"`, "KV event sync needs the engines' own tokenizer"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr does not mention %s:\n%s", want, stderr.String())
		}
	}
}

func TestKubernetesDiscoveryOutsideAClusterNeedsAKubeconfig(t *testing.T) {
	if _, ok := os.LookupEnv("KUBERNETES_SERVICE_HOST"); ok {
		t.Skip("running in a cluster: the in-cluster configuration would be found")
	}
	var stderr bytes.Buffer
	if code := run(context.Background(), nil, lookupFrom(nil), &stderr); code != 1 ||
		!strings.Contains(stderr.String(), "needs a kubeconfig") {
		t.Errorf("exit %d, stderr %q; want 1 asking for a kubeconfig", code, stderr.String())
	}
}
