package routingbench

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/pkg/routing"
	"github.com/kvgate/kvgate/pkg/types"
)

// overloadConfig is a small fleet under an SLO the docs workload can meet
// when the fleet keeps up: 2 s to the first token. Its engines have room
// for the requests in flight, so that their queues are prefill work, which
// the time-to-first-token model predicts, rather than waits for KV-cache
// space, which it does not.
func overloadConfig() OverloadConfig {
	cfg := smallFleet()
	cfg.Engine.NumGPUBlocks = 8192
	cfg.SLO = types.SLO{TTFT: 2 * time.Second}
	cfg.Policies = []string{routing.KVAware, routing.SLOLeastLoadPulling, routing.SLOLeastLoad}
	cfg.Parallel = 3
	return OverloadConfig{Config: cfg, Loads: []float64{0.5, 3}}
}

func TestOverloadHoldsWhatTheFleetCannotServeInTimeAndNothingBelowCapacity(t *testing.T) {
	w := docsWorkload(600, 16, 2048, 64, 10, 7)
	rep, err := RunOverload(context.Background(), overloadConfig(), w)
	if err != nil {
		t.Fatal(err)
	}
	var table bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", table.String())
	if !rep.CapacityMeasured || rep.Capacity <= 0 {
		t.Fatalf("capacity %v (measured %v), want a measured positive rate", rep.Capacity, rep.CapacityMeasured)
	}
	low, high := &rep.Levels[0], &rep.Levels[1]
	kvLow, kvHigh := low.Result(routing.KVAware), high.Result(routing.KVAware)
	for _, name := range []string{routing.SLOLeastLoadPulling, routing.SLOLeastLoad} {
		res := low.Result(name)
		// Below capacity the SLO-aware policies decide as kv-aware does.
		if res.Queued+res.Refused+res.Expired != 0 || res.TTFT != kvLow.TTFT || res.SLOMet != kvLow.SLOMet {
			t.Errorf("%s at 0.5x: queued %d, refused %d, expired %d, TTFT %+v; kv-aware's TTFT %+v", name,
				res.Queued, res.Refused, res.Expired, res.TTFT, kvLow.TTFT)
		}
		// Above it they serve no fewer requests in time than kv-aware
		// (slo-least-load-pulling more), and every request either is
		// served or leaves counted. slo-least-load, which refuses rather
		// than waits, gives up the cache hits of what it refuses.
		res = high.Result(name)
		worse := res.Goodput < kvHigh.Goodput || (name == routing.SLOLeastLoadPulling && res.Goodput == kvHigh.Goodput)
		if worse || res.Refused+res.Expired == 0 {
			t.Errorf("%s at 3x: goodput %.2f (kv-aware %.2f), refused %d, expired %d; want more goodput (no less for slo-least-load), some refused",
				name, res.Goodput, kvHigh.Goodput, res.Refused, res.Expired)
		}
		if served := res.Completed + res.Rejected; served+res.Refused+res.Expired != res.Requests {
			t.Errorf("%s at 3x: %d completed + %d refused + %d expired != %d requests", name, res.Completed, res.Refused,
				res.Expired, res.Requests)
		}
	}
	if high.Result(routing.SLOLeastLoad).Queued != 0 || high.Result(routing.SLOLeastLoadPulling).Queued == 0 {
		t.Error("slo-least-load must refuse rather than queue, slo-least-load-pulling queue")
	}
	if n := len(rep.Targets()); n != 2*3 {
		t.Errorf("%d targets, want 3 per SLO-aware policy at 0.5x (none at 3x)", n)
	}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil || !json.Valid(js.Bytes()) {
		t.Fatalf("WriteJSON: %v", err)
	}
	var csv bytes.Buffer
	if err := rep.WriteCSV(&csv); err != nil || strings.Count(csv.String(), "\n") != 1+2*3 {
		t.Fatalf("WriteCSV: %v\n%s", err, csv.String())
	}
}

func TestOverloadNeedsAnSLO(t *testing.T) {
	cfg := overloadConfig()
	cfg.SLO = types.SLO{}
	if _, err := RunOverload(context.Background(), cfg, docsWorkload(10, 2, 64, 8, 10, 1)); err == nil {
		t.Fatal("an overload scenario without an SLO ran")
	}
	cfg = overloadConfig()
	cfg.Loads = []float64{0}
	if _, err := RunOverload(context.Background(), cfg, docsWorkload(10, 2, 64, 8, 10, 1)); err == nil {
		t.Fatal("a load of 0 was accepted")
	}
}
