package localfleet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testsupport"
)

// testTimeout bounds what a test waits for: far beyond what a loaded
// two-core machine needs.
const testTimeout = 2 * time.Minute

var binDir string

func TestMain(m *testing.M) {
	os.Exit(testsupport.RunInTempDir(m, "kvgate-localfleet-bin-", func(dir string) error {
		binDir = dir
		return Build(dir)
	}))
}

// startFleet starts a small fleet with cfg's other fields, closed when the
// test ends.
func startFleet(t *testing.T, cfg Config) (*Fleet, error) {
	t.Helper()
	cfg.BinDir = binDir
	if cfg.Engines == 0 {
		cfg.Engines = 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	f, err := Start(ctx, cfg)
	if err == nil {
		t.Cleanup(f.Close)
	}
	return f, err
}

// groupGone reports whether no process of group pgid is left.
func groupGone(pgid int) bool {
	return errors.Is(syscall.Kill(-pgid, 0), syscall.ESRCH)
}

func chat(t *testing.T, f *Fleet) (status int, pod string) {
	t.Helper()
	body := `{"model":"` + f.Model() + `","messages":[{"role":"user","content":"Which pod holds my prefix?"}],"max_tokens":4}`
	resp, err := http.Post(f.GatewayURL()+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get("target-pod-name")
}

func TestStartServesThroughTheGatewayAndCloseLeavesNothing(t *testing.T) {
	f, err := startFleet(t, Config{EngineArgs: []string{"-step-overhead", "1ms"}})
	if err != nil {
		t.Fatal(err)
	}
	pgid, dir := f.ProcessGroup(), f.Dir()
	if pgid != f.Engines()[0].PID {
		t.Errorf("process group %d, want the first engine's pid %d", pgid, f.Engines()[0].PID)
	}
	status, pod := chat(t, f)
	if status != http.StatusOK || (pod != f.Engines()[0].PodKey && pod != f.Engines()[1].PodKey) {
		t.Fatalf("chat through the gateway: %d from %q", status, pod)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	// The engine's events reach the index shortly after the request.
	if err := f.waitFor(ctx, f.Gateway(), "the index to hold the request's blocks", func(ctx context.Context) (bool, error) {
		n, err := indexedBlocks(ctx, f.GatewayURL())
		return n > 0, err
	}); err != nil {
		t.Fatal(err)
	}
	if err := f.ResetPrefixCaches(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := indexedBlocks(ctx, f.GatewayURL()); err != nil || n != 0 {
		t.Fatalf("index holds %d blocks (%v) after the reset, want none", n, err)
	}
	f.Close()
	if !groupGone(pgid) {
		t.Errorf("processes of group %d are left after Close", pgid)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temporary directory %s is left after Close (%v)", dir, err)
	}
	if f.Err() != nil {
		t.Errorf("Err after Close = %v, want nil: stopping is no failure", f.Err())
	}
}

func TestStartServesAGatewayWithoutKVEventSync(t *testing.T) {
	f, err := startFleet(t, Config{Engines: 1, GatewayEnv: []string{"AIBRIX_PREFIX_CACHE_KV_EVENT_SYNC_ENABLED=false"}})
	if err != nil {
		t.Fatal(err)
	}
	if status, pod := chat(t, f); status != http.StatusOK || pod != f.Engines()[0].PodKey {
		t.Fatalf("chat through the gateway: %d from %q", status, pod)
	}
}

func TestAnAdminAddressServesTheGatewaysDebugEndpointsApart(t *testing.T) {
	f, err := startFleet(t, Config{Engines: 1, AdminAddress: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	if f.AdminURL() == f.GatewayURL() || strings.HasSuffix(f.AdminURL(), ":0") {
		t.Fatalf("admin URL %s beside gateway URL %s", f.AdminURL(), f.GatewayURL())
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	for _, c := range []struct {
		url  string
		want int
	}{
		{f.AdminURL() + "/debug/kvcache", http.StatusOK},
		{f.AdminURL() + "/debug/pprof/", http.StatusOK},
		{f.GatewayURL() + "/debug/kvcache", http.StatusNotFound},
	} {
		resp, err := get(ctx, c.url)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("GET %s: %d, want %d", c.url, resp.StatusCode, c.want)
		}
	}
}

func TestStartFailsWithTheLogOfAnEngineThatExits(t *testing.T) {
	dir := t.TempDir()
	_, err := startFleet(t, Config{EngineArgs: []string{"-num-gpu-blocks", "1"}, Dir: dir})
	if !errors.Is(err, ErrExited) || !strings.Contains(err.Error(), "at least 2 KV-cache blocks") {
		t.Fatalf("Start = %v, want ErrExited quoting the engine's log", err)
	}
	// The directory was given: it is kept, with the logs.
	if _, err := os.Stat(filepath.Join(dir, "vllm-0.log")); err != nil {
		t.Errorf("the engine's log is gone from the given directory: %v", err)
	}
}

func TestStartRefusesAGatewayAddressInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, err = startFleet(t, Config{GatewayAddress: ln.Addr().String()})
	if err == nil || !strings.Contains(err.Error(), "gateway address "+ln.Addr().String()+" is not free") {
		t.Fatalf("Start = %v, want the address named as in use", err)
	}
}

func TestFailedReportsAnEngineThatDies(t *testing.T) {
	f, err := startFleet(t, Config{})
	if err != nil {
		t.Fatal(err)
	}
	victim := f.Engines()[1]
	if err := syscall.Kill(victim.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-f.Failed():
	case <-time.After(testTimeout):
		t.Fatal("Failed did not report the killed engine")
	}
	if err := f.Err(); !errors.Is(err, ErrExited) || !strings.Contains(err.Error(), "vllm-1") {
		t.Errorf("Err = %v, want ErrExited naming vllm-1", err)
	}
	pgid := f.ProcessGroup()
	f.Close()
	if !groupGone(pgid) {
		t.Errorf("processes of group %d are left after Close", pgid)
	}
}

func TestStartStopsWhatItStartedWhenCancelled(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		// Cancel once the first engine has been started.
		for ctx.Err() == nil {
			if _, err := os.Stat(filepath.Join(dir, "vllm-0.log")); err == nil {
				cancel()
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	_, err := Start(ctx, Config{BinDir: binDir, Engines: 2, Dir: dir})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Start cancelled while starting = %v, want context.Canceled", err)
	}
	if kids := children(t); len(kids) > 0 {
		t.Errorf("child processes left after a cancelled Start: %v", kids)
	}
}

// children lists the processes whose parent is the test process.
func children(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	ppid := fmt.Sprintf("PPid:\t%d\n", os.Getpid())
	var kids []string
	for _, e := range entries {
		status, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err == nil && strings.Contains(string(status), ppid) {
			name, _, _ := strings.Cut(string(status), "\n")
			kids = append(kids, e.Name()+" "+name)
		}
	}
	return kids
}

func TestReplicasShareStateThroughTheFleetsRedis(t *testing.T) {
	f, err := startFleet(t, Config{Dir: t.TempDir(), Gateways: 2, Redis: true, EngineArgs: []string{"-step-overhead", "1ms"},
		GatewayEnv: []string{"KVGATE_SHARED_STATE_INTERVAL_MS=50"}})
	if err != nil {
		t.Fatal(err)
	}
	urls := f.GatewayURLs()
	if len(urls) != 2 || urls[0] == urls[1] || len(f.Gateways()) != 2 || f.RedisAddress() == "" || f.Redis() == nil {
		t.Fatalf("gateways %v, redis %q: want two gateways on ports of their own and a Redis", urls, f.RedisAddress())
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	for _, url := range urls {
		if err := f.waitFor(ctx, f.Gateway(), url+" to count both replicas", func(ctx context.Context) (bool, error) {
			return metricIs(ctx, url, "kvgate_cache_shared_gateways 2")
		}); err != nil {
			t.Fatal(err)
		}
	}
	pgid := f.ProcessGroup()
	f.Close()
	if !groupGone(pgid) || !f.Redis().Exited() {
		t.Fatalf("processes of group %d, or redis-server, left after Close", pgid)
	}
	// The gateways drain against live engines and Redis: they exit first,
	// and withdraw what they shared.
	others := []*Process{f.Redis()}
	for _, e := range f.Engines() {
		others = append(others, e.Process)
	}
	for _, gw := range f.Gateways() {
		for _, p := range others {
			if gw.exitAt.After(p.exitAt) {
				t.Errorf("%s exited at %v, after %s at %v", gw.Name, gw.exitAt, p.Name, p.exitAt)
			}
		}
		if log, err := os.ReadFile(gw.LogPath); err != nil {
			t.Error(err)
		} else if bytes.Contains(log, []byte("through Redis failed")) || bytes.Contains(log, []byte("not withdrawn")) {
			t.Errorf("%s could not reach Redis while it shut down:\n%s", gw.Name, log)
		}
	}
}

func TestEachReplicaRunsTheGatewayBinaryAndEnvironmentNamedForIt(t *testing.T) {
	// A second name for the binary (a hard link, or a copy across file
	// systems): the process shows the name it was started by.
	other := filepath.Join(t.TempDir(), "gateway")
	if err := os.Link(filepath.Join(binDir, "gateway"), other); err != nil {
		data, err := os.ReadFile(filepath.Join(binDir, "gateway"))
		if err == nil {
			err = os.WriteFile(other, data, 0o755)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	const setting = "KVGATE_ROUTING_MIN_FLEET_QUEUE=0.25"
	f, err := startFleet(t, Config{Engines: 1, Gateways: 2, GatewayBinaries: []string{"", other},
		GatewayReplicaEnv: [][]string{nil, {setting}}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(binDir, "gateway"), other}
	for i, gw := range f.Gateways() {
		exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", gw.PID))
		if err != nil {
			t.Fatal(err)
		}
		if abs, _ := filepath.Abs(want[i]); exe != abs {
			t.Errorf("%s runs %s, want %s", gw.Name, exe, abs)
		}
		environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", gw.PID))
		if err != nil {
			t.Fatal(err)
		}
		if has := slices.Contains(strings.Split(string(environ), "\x00"), setting); has != (i == 1) {
			t.Errorf("%s has %s in its environment: %v, want %v", gw.Name, setting, has, i == 1)
		}
	}
}

// metricIs reports whether the /metrics of the gateway at url has the line
// want.
func metricIs(ctx context.Context, url, want string) (bool, error) {
	resp, err := get(ctx, url+"/metrics")
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return false, err
	}
	for _, line := range strings.Split(string(body), "\n") {
		if line == want {
			return true, nil
		}
	}
	return false, fmt.Errorf("no line %q in %s/metrics", want, url)
}
