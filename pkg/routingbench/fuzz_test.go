package routingbench

import (
	"bytes"
	"testing"

	"github.com/kvgate/kvgate/pkg/sim"
)

// FuzzLoadMooncake feeds arbitrary bytes to the trace loader: it must
// return an error or a workload a simulation accepts, and never panic or
// allocate from a length the input does not back.
func FuzzLoadMooncake(f *testing.F) {
	f.Add([]byte(`{"timestamp": 0, "input_length": 700, "output_length": 3, "hash_ids": [1, 2]}`))
	f.Add([]byte("{\"timestamp\": 1.5, \"input_length\": 1, \"output_length\": 0, \"hash_ids\": [18446744073709551615]}\n\n" +
		`{"timestamp": 2, "input_length": 1025, "output_length": 9, "hash_ids": [1, 3, 4]}`))
	f.Add([]byte(`{"timestamp": 0, "input_length": 99999999999, "output_length": 3, "hash_ids": [1]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		w, err := LoadMooncake(bytes.NewReader(data), "fuzz")
		if err != nil {
			return
		}
		if err := w.validate(sim.VocabSize); err != nil {
			t.Fatalf("loaded a workload a simulation refuses: %v", err)
		}
	})
}
