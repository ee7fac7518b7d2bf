package kvevent

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// golden is one payload produced by vLLM's own publisher, with vLLM's
// decoding of it (testdata/vllm-events).
type golden struct {
	Name    string // file name without extension
	Variant string // "current", "legacy" or "v0_9"
	Payload []byte
	Untyped any // vLLM's decoded value, numbers as json.Number
	// Fields lists each event type's fields in declaration order for the
	// vLLM version that produced the payload.
	Fields map[string][]string
}

func (g golden) layout() Layout {
	switch g.Variant {
	case "legacy":
		return LayoutPositional
	case "v0_9":
		return LayoutV09
	}
	return LayoutCurrent
}

// hasDigestHashes reports whether vLLM sent the payload's block hashes as
// digests (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0).
func (g golden) hasDigestHashes() bool { return strings.Contains(g.Name, "stored_bytes") }

const goldenDir = "testdata/vllm-events"

func loadGoldens(t testing.TB) []golden {
	t.Helper()
	var index []struct{ File, Variant string }
	readJSON(t, filepath.Join(goldenDir, "INDEX.json"), &index)
	if len(index) == 0 {
		t.Fatal("no golden payloads")
	}
	var out []golden
	for _, e := range index {
		name := strings.TrimSuffix(e.File, ".bin")
		payload, err := os.ReadFile(filepath.Join(goldenDir, e.File))
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			PayloadHex     string              `json:"payload_hex"`
			DecodedUntyped any                 `json:"decoded_untyped"`
			Fields         map[string][]string `json:"variant_struct_fields"`
		}
		readJSON(t, filepath.Join(goldenDir, name+".json"), &doc)
		if doc.PayloadHex != hex.EncodeToString(payload) {
			t.Fatalf("%s: payload_hex does not match the .bin file", name)
		}
		out = append(out, golden{name, e.Variant, payload, doc.DecodedUntyped, doc.Fields})
	}
	return out
}

func readJSON(t testing.TB, path string, v any) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := json.NewDecoder(f)
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func TestGoldenFieldOrdersMatchThisPackage(t *testing.T) {
	for _, g := range loadGoldens(t) {
		for tag, fields := range g.Fields {
			if tag == "EventBatch" {
				continue
			}
			known := positionalOrders[tag]
			n := min(len(known), len(fields))
			if !slices.Equal(fields[:n], known[:n]) {
				t.Errorf("%s: %s fields %v, positional order here %v", g.Name, tag, fields, known)
			}
		}
	}
}

func TestDecodeGoldenPayloadsYieldVLLMsValues(t *testing.T) {
	for _, g := range loadGoldens(t) {
		t.Run(g.Name, func(t *testing.T) {
			b, stats, err := DecodeEventBatchStats(g.Payload)
			if err != nil {
				t.Fatal(err)
			}
			if stats != (DecodeStats{}) {
				t.Errorf("stats %+v, want nothing skipped", stats)
			}
			if err := checkUntyped(b, g.Untyped); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestEncodeReproducesGoldenBytes(t *testing.T) {
	for _, g := range loadGoldens(t) {
		if g.hasDigestHashes() {
			continue // digests become 64-bit hashes: TestDigestHashesEqualTheirIntForm
		}
		t.Run(g.Name, func(t *testing.T) {
			want := g.Payload
			if g.layout() == LayoutV09 {
				want = pythonHashForm(t, g)
			}
			b, err := DecodeEventBatch(g.Payload)
			if err != nil {
				t.Fatal(err)
			}
			got, err := AppendEventBatch(nil, b, g.layout())
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("encoded\n%x\nwant\n%x", got, want)
			}
		})
	}
}

// pythonHashForm returns a v0.9 golden payload as vLLM v0.9 would have sent
// it: its block hashes as the signed integers of Python's hash(). The golden
// files hold v0.9-layout payloads with today's unsigned hashes too; a hash of
// 2^63 or more becomes negative. The reference encoder writes the result,
// after showing it reproduces the golden bytes when no hash changes.
func pythonHashForm(t *testing.T, g golden) []byte {
	t.Helper()
	changed := false
	signed := func(v any) any {
		n := v.(json.Number)
		i, _ := new(big.Int).SetString(string(n), 10)
		if i.Sign() >= 0 && i.BitLen() == 64 {
			changed = true
			return new(big.Int).Sub(i, two64).Int64()
		}
		return n
	}
	env := g.Untyped.([]any)
	for _, ev := range env[1].([]any) {
		ev := ev.([]any)
		if len(ev) > 1 {
			for i, h := range ev[1].([]any) {
				ev[1].([]any)[i] = signed(h)
			}
		}
		if ev[0] == "BlockStored" && len(ev) > 2 && ev[2] != nil {
			ev[2] = signed(ev[2])
		}
	}
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.UseCompactInts(true)
	if err := enc.Encode(goValue(env)); err != nil {
		t.Fatal(err)
	}
	if !changed && !bytes.Equal(buf.Bytes(), g.Payload) {
		t.Fatalf("reference encoding\n%x\ndiffers from the golden\n%x", buf.Bytes(), g.Payload)
	}
	return buf.Bytes()
}

// goValue turns JSON numbers into the Go numbers msgpack writes them as.
func goValue(v any) any {
	switch v := v.(type) {
	case json.Number:
		if i, err := v.Int64(); err == nil {
			return i
		}
		if i, ok := new(big.Int).SetString(string(v), 10); ok {
			return i.Uint64()
		}
		f, _ := v.Float64()
		return f
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = goValue(e)
		}
		return out
	}
	return v
}

func TestDigestHashesEqualTheirIntForm(t *testing.T) {
	for _, g := range loadGoldens(t) {
		if !g.hasDigestHashes() {
			continue
		}
		t.Run(g.Name, func(t *testing.T) {
			b, err := DecodeEventBatch(g.Payload)
			if err != nil {
				t.Fatal(err)
			}
			// checkUntyped applies int.from_bytes(digest, "big") & (2**64-1)
			// to the digests vLLM sent.
			if err := checkUntyped(b, g.Untyped); err != nil {
				t.Fatal(err)
			}
			s := b.Events[0].(*BlockStoredEvent)
			if len(s.BlockHashes) == 0 || !s.HasParent {
				t.Fatalf("golden has no digest hashes to check: %+v", s)
			}
			enc, err := AppendEventBatch(nil, b, g.layout())
			if err != nil {
				t.Fatal(err)
			}
			again, err := DecodeEventBatch(enc)
			if err != nil {
				t.Fatal(err)
			}
			if d := diffBatch(again, b); d != "" {
				t.Errorf("int form decodes differently: %s", d)
			}
		})
	}
}
