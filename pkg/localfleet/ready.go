package localfleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// pollInterval is how often the fleet polls a process while it waits.
const pollInterval = 50 * time.Millisecond

// waitFor polls cond until it holds. It fails with the log of the process
// when any process of the fleet exits, with p's log and the last poll's
// error when ctx's deadline passes, and with ctx's cause when ctx is
// cancelled.
func (f *Fleet) waitFor(ctx context.Context, p *Process, what string, cond func(context.Context) (bool, error)) error {
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	var last error
	for {
		ok, err := cond(ctx)
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		select {
		case <-f.failed:
			return f.failErr
		case <-ctx.Done():
			if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("waiting for %s: %w", what, context.Cause(ctx))
			}
			msg := fmt.Sprintf("timed out waiting for %s", what)
			if last != nil {
				msg += fmt.Sprintf(" (last: %v)", last)
			}
			return fmt.Errorf("%s; the end of %s's log (%s):\n%s", msg, p.Name, p.LogPath, p.LogTail(logTailLines))
		case <-tick.C:
		}
	}
}

// httpOK reports whether GET url answers 200.
func httpOK(ctx context.Context, url string) (bool, error) {
	resp, err := get(ctx, url)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return true, nil
}

func get(ctx context.Context, url string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	return http.DefaultClient.Do(req)
}

// kvCacheView is what the fleet reads of the gateway's GET /debug/kvcache.
type kvCacheView struct {
	KVEventSync bool `json:"kvEventSync"`
	Models      []struct {
		Model   string `json:"model"`
		Entries int    `json:"entries"`
		Pods    []struct {
			Pod    string         `json:"pod"`
			State  string         `json:"state"`
			Blocks map[string]int `json:"blocks"`
			Ranks  []struct {
				Client *struct {
					Connected bool `json:"connected"`
				} `json:"client"`
			} `json:"ranks"`
		} `json:"pods"`
	} `json:"models"`
}

// kvCache reads the view of the gateway at url of the prefix index and its
// streams.
func kvCache(ctx context.Context, url string) (kvCacheView, error) {
	var v kvCacheView
	resp, err := get(ctx, url+"/debug/kvcache")
	if err != nil {
		return v, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return v, fmt.Errorf("GET /debug/kvcache: %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return v, fmt.Errorf("GET /debug/kvcache: %w", err)
	}
	return v, nil
}

// allFollowed reports whether the gateway at url follows every engine's KV
// event stream with a connected client, or runs without KV event sync.
func (f *Fleet) allFollowed(ctx context.Context, url string) (bool, error) {
	v, err := kvCache(ctx, url)
	if err != nil || !v.KVEventSync {
		return err == nil, err
	}
	connected := map[string]bool{}
	for _, m := range v.Models {
		for _, p := range m.Pods {
			ok := p.State == "followed" && len(p.Ranks) > 0
			for _, r := range p.Ranks {
				ok = ok && r.Client != nil && r.Client.Connected
			}
			connected[p.Pod] = ok
		}
	}
	for _, e := range f.engines {
		if !connected[e.PodKey] {
			return false, fmt.Errorf("the gateway at %s does not follow %s yet", url, e.PodKey)
		}
	}
	return true, nil
}

// indexedBlocks returns how many blocks the index of the gateway at url
// holds over all pods and media.
func indexedBlocks(ctx context.Context, url string) (int, error) {
	v, err := kvCache(ctx, url)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, m := range v.Models {
		for _, p := range m.Pods {
			for _, b := range p.Blocks {
				n += b
			}
		}
	}
	return n, nil
}

// ResetPrefixCaches empties every engine's prefix cache (POST
// /reset_prefix_cache, retried while an engine refuses because requests
// still hold blocks) and waits until every gateway's index holds no block
// of any engine. Requests must have stopped; ctx bounds the wait.
func (f *Fleet) ResetPrefixCaches(ctx context.Context) error {
	for _, e := range f.engines {
		if err := f.waitFor(ctx, e.Process, e.Name+" to reset its prefix cache", func(ctx context.Context) (bool, error) {
			return post(ctx, e.URL+"/reset_prefix_cache")
		}); err != nil {
			return err
		}
	}
	for i, p := range f.gateways {
		url := f.gwURLs[i]
		if err := f.waitFor(ctx, p, "the index of "+p.Name+" to drop every block", func(ctx context.Context) (bool, error) {
			n, err := indexedBlocks(ctx, url)
			if err == nil && n > 0 {
				err = fmt.Errorf("the index still holds %d blocks", n)
			}
			return err == nil, err
		}); err != nil {
			return err
		}
	}
	return nil
}

// post reports whether POST url answers 200.
func post(ctx context.Context, url string) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	if err != nil {
		return false, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Errorf("POST %s: %s %s", url, resp.Status, body)
	}
	return true, nil
}

// Metrics reads and parses the /metrics of a gateway, url being its base
// URL for them (Fleet.AdminURL for the first).
func Metrics(ctx context.Context, client *http.Client, url string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("read the gateway's metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("read the gateway's metrics: %s", resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("parse the gateway's metrics: %w", err)
	}
	return families, nil
}

// Sum returns the sum of the values of the metric name in families (what
// Metrics returns) over its series, counters, gauges and untyped alike; 0
// when there is none.
func Sum(families map[string]*dto.MetricFamily, name string) float64 {
	total := 0.0
	for _, m := range families[name].GetMetric() {
		total += m.GetCounter().GetValue() + m.GetGauge().GetValue() + m.GetUntyped().GetValue()
	}
	return total
}
