// Package kvgate_test checks the image build without a container engine:
// the Dockerfile's stages, base images, user and packages, the one build
// line (hack/build.sh) it shares with make build, and, by running that line,
// that the binaries the image ships need only the libraries it installs.
package kvgate_test

import (
	"bufio"
	"debug/elf"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	cmd  string // FROM, RUN, COPY... in upper case
	args string
	line int
}

// stage is one FROM and the instructions that follow it.
type stage struct {
	image, name string // base image (ARGs expanded) and AS name
	insts       []instruction
}

// dockerfile is a parsed Dockerfile.
type dockerfile struct {
	stages []stage
}

// parseDockerfile parses text into stages, expanding the ARGs declared
// before the first FROM (the ones FROM may use) at their defaults.
func parseDockerfile(text string) (dockerfile, error) {
	var df dockerfile
	args := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(text))
	var cur strings.Builder
	start := 0
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") || (line == "" && cur.Len() == 0) {
			continue
		}
		if cur.Len() == 0 {
			start = n
		}
		if body, more := strings.CutSuffix(line, `\`); more {
			cur.WriteString(body + " ")
			continue
		}
		cur.WriteString(line)
		cmd, rest, _ := strings.Cut(cur.String(), " ")
		cur.Reset()
		in := instruction{cmd: strings.ToUpper(cmd), args: strings.TrimSpace(rest), line: start}
		switch {
		case in.cmd == "ARG" && len(df.stages) == 0:
			name, value, _ := strings.Cut(in.args, "=")
			args[name] = value
		case in.cmd == "FROM":
			image, name, _ := strings.Cut(in.args, " AS ")
			image = os.Expand(strings.TrimSpace(image), func(k string) string { return args[k] })
			df.stages = append(df.stages, stage{image: image, name: strings.TrimSpace(name)})
		case len(df.stages) == 0:
			return df, fmt.Errorf("line %d: %s before the first FROM", start, in.cmd)
		default:
			last := &df.stages[len(df.stages)-1]
			last.insts = append(last.insts, in)
		}
	}
	if cur.Len() > 0 {
		return df, fmt.Errorf("line %d: the last instruction ends with a continuation", start)
	}
	return df, sc.Err()
}

// all returns the arguments of the stage's instructions cmd.
func (s stage) all(cmd string) []string {
	var out []string
	for _, in := range s.insts {
		if in.cmd == cmd {
			out = append(out, in.args)
		}
	}
	return out
}

// aptInstalls returns the packages the stage installs with apt-get, failing
// t when an install pulls recommended packages or the stage keeps apt's
// package lists.
func (s stage) aptInstalls(t *testing.T) map[string]bool {
	t.Helper()
	pkgs := map[string]bool{}
	for _, run := range s.all("RUN") {
		for _, cmd := range strings.Split(run, "&&") {
			rest, ok := strings.CutPrefix(strings.TrimSpace(cmd), "apt-get install ")
			if !ok {
				continue
			}
			if !strings.Contains(rest, "--no-install-recommends") {
				t.Errorf("stage %s: %q installs recommended packages too", s.image, cmd)
			}
			if !strings.Contains(run, "rm -rf /var/lib/apt/lists/*") {
				t.Errorf("stage %s: %q keeps apt's package lists in the layer", s.image, run)
			}
			for _, w := range strings.Fields(rest) {
				if !strings.HasPrefix(w, "-") {
					pkgs[w] = true
				}
			}
		}
	}
	return pkgs
}

func readDockerfile(t *testing.T) dockerfile {
	t.Helper()
	text, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	df, err := parseDockerfile(string(text))
	if err != nil {
		t.Fatalf("Dockerfile: %v", err)
	}
	if len(df.stages) != 2 {
		t.Fatalf("Dockerfile has %d stages, want 2: a builder and a runtime image", len(df.stages))
	}
	return df
}

// movingReleases are Debian's names that move from release to release.
var movingReleases = map[string]bool{"latest": true, "stable": true, "testing": true, "unstable": true, "sid": true}

// imageRef is a base image reference, name:tag.
var imageRef = regexp.MustCompile(`^([a-z0-9./-]+):([A-Za-z0-9._-]+)$`)

// TestDockerfileBaseImages checks that both base images are named by an
// explicit tag, that the builder's Go is the go.mod's Go release, and that
// builder and runtime are the same Debian release, so that the libzmq the
// binaries link against is the one they run with.
func TestDockerfileBaseImages(t *testing.T) {
	df := readDockerfile(t)
	build, runtime := df.stages[0], df.stages[1]
	var tags [2]string
	for i, s := range df.stages {
		m := imageRef.FindStringSubmatch(s.image)
		if m == nil || m[2] == "latest" {
			t.Fatalf("base image %q: want name:tag with an explicit version", s.image)
		}
		tags[i] = m[2]
	}
	if !strings.HasPrefix(build.image, "golang:") || !strings.HasPrefix(runtime.image, "debian:") {
		t.Fatalf("stages from %s and %s; want golang then debian", build.image, runtime.image)
	}
	goVersion, buildRelease, _ := strings.Cut(tags[0], "-")
	runtimeRelease, _ := strings.CutSuffix(tags[1], "-slim")
	if buildRelease != runtimeRelease {
		t.Errorf("builder on Debian %q, runtime on %q: the same release keeps libzmq's ABI", buildRelease, runtimeRelease)
	}
	if !regexp.MustCompile(`^[a-z]+$`).MatchString(runtimeRelease) || movingReleases[runtimeRelease] {
		t.Errorf("Debian release %q: want a release's code name, such as bookworm", runtimeRelease)
	}
	gomod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
	if m == nil {
		t.Fatal("go.mod has no go directive")
	}
	if goVersion != string(m[1]) {
		t.Errorf("builder's Go %q; go.mod's go directive is %s", goVersion, m[1])
	}
}

// TestDockerfileRuntimeStage checks the image that ships: what it
// installs, that it runs as a numeric non-root user (so that Kubernetes can
// verify runAsNonRoot), and that its entrypoint needs no shell.
func TestDockerfileRuntimeStage(t *testing.T) {
	df := readDockerfile(t)
	build, runtime := df.stages[0], df.stages[1]
	for _, s := range df.stages {
		if add := s.all("ADD"); len(add) > 0 {
			t.Errorf("stage %s uses ADD %q: COPY says what it does (ADD also fetches URLs and unpacks archives)", s.image, add)
		}
	}
	for pkgs, want := range map[*stage][]string{&build: {"libzmq3-dev", "pkg-config"}, &runtime: {"libzmq5", "ca-certificates"}} {
		installed := pkgs.aptInstalls(t)
		for _, p := range want {
			if !installed[p] {
				t.Errorf("stage %s does not install %s", pkgs.image, p)
			}
		}
	}
	users := runtime.all("USER")
	if len(users) == 0 || !regexp.MustCompile(`^[1-9][0-9]*:[1-9][0-9]*$`).MatchString(users[len(users)-1]) {
		t.Errorf("runtime USER %q: want a numeric non-root uid:gid", users)
	}
	if len(runtime.insts) == 0 || runtime.insts[len(runtime.insts)-1].cmd != "ENTRYPOINT" {
		t.Errorf("the runtime stage must end with its ENTRYPOINT")
	}
	if _, err := entrypoint(runtime); err != nil {
		t.Error(err)
	}
	if _, err := imagePackages(build); err != nil {
		t.Error(err)
	}
	if copies := runtime.all("COPY"); len(copies) != 1 || copies[0] != "--from="+build.name+" /out/ /usr/local/bin/" {
		t.Errorf("runtime COPY %q; want the builder's /out/ into /usr/local/bin/", copies)
	}
}

// entrypoint returns the program the stage's exec-form ENTRYPOINT runs.
func entrypoint(s stage) (string, error) {
	eps := s.all("ENTRYPOINT")
	var argv []string
	if len(eps) != 1 || json.Unmarshal([]byte(eps[0]), &argv) != nil || len(argv) == 0 {
		return "", fmt.Errorf("ENTRYPOINT %q: want one, in exec form ([\"/usr/local/bin/...\"]), which needs no shell", eps)
	}
	return argv[0], nil
}

// TestDockerignoreAdmitsWhatTheDockerfileCopies checks that the build
// context is an allow-list holding exactly what the builder copies.
func TestDockerignoreAdmitsWhatTheDockerfileCopies(t *testing.T) {
	text, err := os.ReadFile(".dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	var rules []string
	for _, line := range strings.Split(string(text), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			rules = append(rules, line)
		}
	}
	if len(rules) == 0 || rules[0] != "*" {
		t.Fatalf(".dockerignore %q: want an allow-list, starting with *", rules)
	}
	admitted := map[string]bool{}
	for _, r := range rules[1:] {
		admitted[strings.TrimPrefix(r, "!")] = true
	}
	copied := map[string]bool{}
	for _, c := range readDockerfile(t).stages[0].all("COPY") {
		fields := strings.Fields(c)
		for _, src := range fields[:len(fields)-1] {
			copied[src] = true
			if !admitted[src] {
				t.Errorf("the Dockerfile copies %s, which .dockerignore leaves out", src)
			}
		}
	}
	for a := range admitted {
		if !copied[a] {
			t.Errorf(".dockerignore admits %s, which the Dockerfile does not copy", a)
		}
	}
}

// runtimeLibraries maps each shared library the binaries may need to the
// Debian package that provides it; "" is glibc, part of every Debian image.
var runtimeLibraries = map[string]string{
	"libzmq.so.5":     "libzmq5",
	"libc.so.6":       "",
	"libm.so.6":       "",
	"libpthread.so.0": "",
	"libdl.so.2":      "",
	"libresolv.so.2":  "",
}

// TestImageBinariesBuildAndFindTheirLibraries runs the image's build line
// (hack/build.sh with the Dockerfile's packages) outside a container, and
// checks that it builds the entrypoint and the simulator the samples run
// from the image, and that each binary needs only shared libraries the
// runtime stage installs (or glibc), and starts with them.
func TestImageBinariesBuildAndFindTheirLibraries(t *testing.T) {
	df := readDockerfile(t)
	runtime := df.stages[1]
	pkgs, err := imagePackages(df.stages[0])
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	buildImageBinaries(t, out, pkgs)

	ep, err := entrypoint(runtime)
	if err != nil {
		t.Fatal(err)
	}
	built := map[string]bool{}
	for _, p := range pkgs {
		built[filepath.Base(p)] = true
	}
	for _, want := range []string{ep, simulatorCommand(t)} {
		if filepath.Dir(want) != "/usr/local/bin" || !built[filepath.Base(want)] {
			t.Errorf("the image runs %s, but builds %q into /usr/local/bin", want, pkgs)
		}
	}
	installed := runtime.aptInstalls(t)
	for name := range built {
		bin := filepath.Join(out, name)
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		libs, err := f.ImportedLibraries()
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, lib := range libs {
			pkg, known := runtimeLibraries[lib]
			switch {
			case !known:
				t.Errorf("%s needs %s: add the Debian package providing it to the runtime stage and to runtimeLibraries", name, lib)
			case pkg != "" && !installed[pkg]:
				t.Errorf("%s needs %s from %s, which the runtime stage does not install", name, lib, pkg)
			}
		}
		startsWithItsLibraries(t, bin)
	}
}

// imagePackages returns the packages the builder stage's last RUN builds:
// hack/build.sh /out PACKAGE...
func imagePackages(build stage) ([]string, error) {
	runs := build.all("RUN")
	if len(runs) > 0 {
		if _, after, ok := strings.Cut(runs[len(runs)-1], "hack/build.sh /out "); ok && len(strings.Fields(after)) > 0 {
			return strings.Fields(after), nil
		}
	}
	return nil, fmt.Errorf("the builder's last RUN is %q; want the shared build line, hack/build.sh /out PACKAGE", runs)
}
