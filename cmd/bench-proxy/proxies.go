package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"text/template"
	"time"

	"github.com/kvgate/kvgate/internal/freeport"
)

// proxySpec is a reverse proxy the benchmark compares the gateway with.
type proxySpec struct {
	name string
	// bin is the command looked up in PATH and in /usr/sbin.
	bin string
	// config is the template's file name in the configuration directory.
	config string
	// args returns the command line running the configuration at path.
	args func(path, dir string) []string
	// self marks a reference forwarder this command runs (see forward.go).
	self bool
}

var proxySpecs = []proxySpec{
	{name: "nginx", bin: "nginx", config: "nginx.conf", args: func(path, dir string) []string {
		return []string{"-c", path, "-p", dir, "-e", filepath.Join(dir, "nginx-error.log")}
	}},
	{name: "haproxy", bin: "haproxy", config: "haproxy.cfg", args: func(path, _ string) []string {
		return []string{"-f", path, "-db"}
	}},
	{name: "go-raw", self: true, config: "go-forward.conf", args: func(path, _ string) []string {
		return []string{"forward", forwardRaw, path}
	}},
	{name: "go-nethttp", self: true, config: "go-forward.conf", args: func(path, _ string) []string {
		return []string{"forward", forwardNetHTTP, path}
	}},
}

// proxyConfig fills in a proxy's configuration template.
type proxyConfig struct {
	Listen    string
	Upstreams []string
	Workers   int
	Dir       string
}

// runningProxy is a proxy process the benchmark started.
type runningProxy struct {
	name string
	addr string
	cmd  *exec.Cmd
	// pids are the proxy's processes (nginx's master and workers).
	pids []int
	done chan struct{}
}

// proxyBinary returns the path of the binary running spec: this command's
// own for a reference forwarder, else the proxy's, "" when it is not
// installed.
func proxyBinary(spec proxySpec) string {
	if spec.self {
		p, _ := os.Executable()
		return p
	}
	return findBinary(spec.bin)
}

// findBinary returns the path of bin, "" when it is not installed.
func findBinary(bin string) string {
	if p, err := exec.LookPath(bin); err == nil {
		return p
	}
	p := filepath.Join("/usr/sbin", bin)
	if _, err := os.Stat(p); err == nil {
		return p
	}
	return ""
}

// startProxy renders spec's configuration from configDir into a directory
// of its own under workDir and starts the proxy in front of upstreams,
// returning once it accepts connections.
func startProxy(ctx context.Context, spec proxySpec, binary, configDir, workDir string, upstreams []string, workers int) (*runningProxy, error) {
	tmpl, err := template.ParseFiles(filepath.Join(configDir, spec.config))
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(workDir, spec.name)
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return nil, err
	}
	// nginx run by root serves as nobody, which writes its temporary files
	// here.
	_ = os.Chmod(dir, 0o777)
	addr, err := freeport.Address("127.0.0.1")
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, spec.config)
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	err = tmpl.Execute(f, proxyConfig{Listen: addr, Upstreams: upstreams, Workers: workers, Dir: dir})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("render %s: %w", path, err)
	}
	log, err := os.Create(filepath.Join(dir, spec.name+".log"))
	if err != nil {
		return nil, err
	}
	defer log.Close()
	cmd := exec.Command(binary, spec.args(path, dir)...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &runningProxy{name: spec.name, addr: addr, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			break
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("%s exited at start; see %s", spec.name, log.Name())
		case <-ctx.Done():
			p.stop()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, fmt.Errorf("%s does not accept connections on %s; see %s", spec.name, addr, log.Name())
		}
	}
	// nginx's workers start with the master; wait until they all have.
	for range 100 {
		if p.pids = withChildren(cmd.Process.Pid); len(p.pids) > workers || spec.name != "nginx" {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return p, nil
}

// stop ends the proxy's process group and waits for it.
func (p *runningProxy) stop() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// errNoProxy marks a proxy that is not installed.
var errNoProxy = errors.New("not installed")
