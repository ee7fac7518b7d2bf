package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestBenchRoutingPrintsAndWritesAReportPerWorkload(t *testing.T) {
	out := filepath.Join(t.TempDir(), "reports")
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{
		"-workload", "mooncake,shared-prefix,conversation", "-trace", "testdata/tiny_trace.jsonl", "-engines", "2",
		"-cache-blocks", "1024", "-seeds", "3",
		"-sp-groups", "2", "-sp-system-tokens", "256", "-sp-conversations", "6", "-sp-turns", "2",
		"-conv-conversations", "6", "-conv-context-tokens", "300", "-policies", "least-request,kv-aware,ttft-oracle",
		"-out", out,
	}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	for _, workload := range []string{"mooncake", "shared-prefix", "conversation"} {
		table, err := os.ReadFile(filepath.Join(out, workload+"-e2-s3.txt"))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(string(table), "workload "+workload+":") || !strings.Contains(stdout.String(), string(table)) {
			t.Errorf("%s: table file and standard output disagree:\n%s\nprinted:\n%s", workload, table, stdout.String())
		}
		for _, ext := range []string{".csv", ".json", ".png"} {
			if fi, err := os.Stat(filepath.Join(out, workload+"-e2-s3"+ext)); err != nil || fi.Size() == 0 {
				t.Errorf("%s%s: %v", workload, ext, err)
			}
		}
	}
	if !strings.Contains(stdout.String(), "ttft-oracle") || !strings.Contains(stdout.String(), "pooled bound") ||
		!strings.Contains(stderr.String(), "reports written to "+out) {
		t.Errorf("output lacks the policies, the bound or where the reports went:\n%s\n%s", stdout.String(), stderr.String())
	}
	summary, err := os.ReadFile(filepath.Join(out, "summary.md"))
	if err != nil || !strings.Contains(string(summary), "**conversation at its own rate on 2 engines, seeds 3**") {
		t.Errorf("summary.md %q (%v), want a table per workload", summary, err)
	}
}

func TestBenchRoutingSweepsLoadsFleetsAndSeeds(t *testing.T) {
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{
		"-workload", "conversation", "-engines", "2,3", "-loads", "0.5,1", "-seeds", "1,2", "-cache-blocks", "1024",
		"-conv-conversations", "8", "-conv-context-tokens", "300", "-policies", "least-request,kv-aware", "-out", out,
	}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	for _, engines := range []string{"2", "3"} {
		for _, load := range []string{"0.5", "1"} {
			for _, seed := range []string{"1", "2"} {
				name := "conversation@" + load + "x-e" + engines + "-s" + seed + ".json"
				if _, err := os.Stat(filepath.Join(out, name)); err != nil {
					t.Errorf("no report %s: %v", name, err)
				}
			}
		}
	}
	summary, err := os.ReadFile(filepath.Join(out, "summary.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"conversation at 0.5x the fleet's capacity on 2 engines, seeds 1, 2",
		"conversation at 1x the fleet's capacity on 3 engines, seeds 1, 2", "target kv-aware hit ratio >= 0.9 x pooled bound"} {
		if !strings.Contains(string(summary), want) {
			t.Errorf("summary lacks %q:\n%s", want, summary)
		}
	}
}

func TestBenchRoutingRejectsBadFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"unknown workload", []string{"-workload", "chat"}, `unknown workload "chat"`},
		{"unknown policy", []string{"-workload", "shared-prefix", "-policies", "ttft-oracle,fastest"}, `unknown policy "fastest"`},
		{"bad load", []string{"-loads", "1,x"}, "-loads: invalid value"},
		{"bad speed", []string{"-workload", "shared-prefix", "-speeds", "1,-2"}, "engine speed"},
		{"missing tokenizer", []string{"-tokenizer", "no-such-dir"}, "-tokenizer"},
		{"missing trace", []string{"-workload", "mooncake", "-trace", "no-such-file"}, "no-such-file"},
		{"stray argument", []string{"mooncake"}, "unexpected arguments"},
		{"bad number", []string{"-engines", "many"}, "invalid value"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			args := append([]string{"-out", t.TempDir(), "-sp-conversations", "2"}, tt.args...)
			err := run(context.Background(), args, &stdout, &stderr)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one about %q", err, tt.want)
			}
		})
	}
	var stderr bytes.Buffer
	if err := run(context.Background(), []string{"-h"}, &bytes.Buffer{}, &stderr); !errors.Is(err, flag.ErrHelp) || !strings.Contains(stderr.String(), "-cache-blocks") {
		t.Errorf("-h: error %v and usage %q, want flag.ErrHelp and the flags", err, stderr.String())
	}
}

func TestBenchRoutingOverloadReportsEachSeedAndTheTargetsMet(t *testing.T) {
	if testing.Short() {
		t.Skip("simulates the capacity search and two loads twice")
	}
	out := filepath.Join(t.TempDir(), "reports")
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{
		"-overload", "-workload", "shared-prefix", "-engines", "2", "-cache-blocks", "4096", "-seeds", "1,2",
		"-sp-groups", "2", "-sp-system-tokens", "256", "-sp-conversations", "40", "-sp-turns", "2",
		"-loads", "0.5,2", "-policies", "kv-aware,slo", "-slo", "ttft:1s", "-out", out,
	}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	for _, seed := range []string{"1", "2"} {
		for _, ext := range []string{".txt", ".csv", ".json"} {
			if fi, err := os.Stat(filepath.Join(out, "overload-shared-prefix-seed"+seed+ext)); err != nil || fi.Size() == 0 {
				t.Errorf("seed %s %s: %v", seed, ext, err)
			}
		}
	}
	if !strings.Contains(stdout.String(), "targets met, over 2 seeds:") || !strings.Contains(stdout.String(), "/2  shared-prefix: slo at 0.5x") {
		t.Errorf("no summary of the targets:\n%s", stdout.String())
	}
}
