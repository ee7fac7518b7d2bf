package localfleet

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// Process is a child process of a fleet: an engine or the gateway.
type Process struct {
	// Name is the process's name in the fleet: the engine's pod name
	// (vllm-0, vllm-1, ...) or "gateway".
	Name string
	// PID is its process id.
	PID int
	// LogPath is the file its standard output and error go to.
	LogPath string

	cmd    *exec.Cmd
	done   chan struct{} // closed once Wait returned
	err    error         // Wait's error, set before done is closed
	exitAt time.Time     // when Wait returned, set before done is closed
}

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// exitError describes how the process ended; call it once p.done is
// closed.
func (p *Process) exitError() error {
	if p.err != nil {
		return fmt.Errorf("%s (pid %d) exited: %w", p.Name, p.PID, p.err)
	}
	return fmt.Errorf("%s (pid %d) exited with status 0", p.Name, p.PID)
}

// LogTail returns the last lines of the process's log, at most n.
func (p *Process) LogTail(n int) string {
	return tailFile(p.LogPath, n)
}

// group starts processes in one process group of their own, so that a
// terminal's Ctrl-C reaches only the parent, which stops them in order, and
// one signal to the group reaches them all.
type group struct {
	mu    sync.Mutex
	pgid  int // 0 until the first process started
	procs []*Process
	// onExit is called, from a goroutine of its own, with each process
	// that exits.
	onExit func(*Process)
}

// start runs bin with args in the group, its output to dir/<name>.log.
// The child is killed if the parent dies without stopping it: Linux sends
// Pdeathsig when the thread that started the child exits, and the Go
// runtime ends a thread only when a goroutine locked to it exits, which
// this package never does.
func (g *group) start(dir, name, bin string, args []string, env []string) (*Process, error) {
	logPath := filepath.Join(dir, name+".log")
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	defer log.Close() // the child holds its own descriptor
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append(os.Environ(), env...)
	g.mu.Lock()
	defer g.mu.Unlock()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pgid: g.pgid, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s (%s): %w", name, bin, err)
	}
	if g.pgid == 0 {
		g.pgid = cmd.Process.Pid
	}
	p := &Process{Name: name, PID: cmd.Process.Pid, LogPath: logPath, cmd: cmd, done: make(chan struct{})}
	g.procs = append(g.procs, p)
	go func() {
		p.err = cmd.Wait()
		p.exitAt = time.Now()
		close(p.done)
		g.onExit(p)
	}()
	return p, nil
}

// stop stops the group's processes in two steps, so that the processes in
// first can still reach the others while they shut down: SIGTERM to each
// process in first, then, once they exited, SIGTERM to the whole group.
// Each step waits up to grace before it kills the group. stop returns when
// every process has exited and been reaped. The group is signalled only
// while a process of it is running, so that its id cannot have been reused.
func (g *group) stop(grace time.Duration, first []*Process) {
	g.mu.Lock()
	pgid, procs := g.pgid, g.procs
	g.mu.Unlock()
	if pgid == 0 {
		return
	}
	for _, p := range first {
		if !p.Exited() {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	if !waitExited(first, grace) {
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		waitExited(procs, -1)
		return
	}
	if waitExited(procs, 0) {
		return
	}
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	if !waitExited(procs, grace) {
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		waitExited(procs, -1)
	}
}

// waitExited waits up to grace for every process in procs to exit, with
// no bound when grace is negative, and reports whether they all did.
func waitExited(procs []*Process, grace time.Duration) bool {
	var deadline <-chan time.Time
	if grace >= 0 {
		t := time.NewTimer(grace)
		defer t.Stop()
		deadline = t.C
	}
	for _, p := range procs {
		if grace == 0 {
			if !p.Exited() {
				return false
			}
			continue
		}
		select {
		case <-p.done:
		case <-deadline:
			return false
		}
	}
	return true
}

// tailFile returns the last n lines of the file at path, or a note saying
// why it cannot be read.
func tailFile(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(log unavailable: %v)", err)
	}
	defer f.Close()
	const maxTail = 64 << 10
	if st, err := f.Stat(); err == nil && st.Size() > maxTail {
		if _, err := f.Seek(-maxTail, io.SeekEnd); err != nil {
			return fmt.Sprintf("(log unavailable: %v)", err)
		}
	}
	data, err := io.ReadAll(f)
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Sprintf("(log unavailable: %v)", err)
	}
	data = bytes.TrimRight(data, "\n")
	lines := bytes.Split(data, []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}
