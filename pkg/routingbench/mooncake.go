package routingbench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/kvgate/kvgate/pkg/sim"
)

// MooncakeBlockTokens is the number of prompt tokens one hash id of a
// Mooncake trace stands for.
const MooncakeBlockTokens = 512

// maxTraceLine bounds one line of a trace, a request of some 2 million
// hash ids.
const maxTraceLine = 16 << 20

// maxTimestampMillis is the latest arrival a time.Duration holds.
const maxTimestampMillis = float64(math.MaxInt64 / int64(time.Millisecond))

// mooncakeRecord is one line of a Mooncake trace.
type mooncakeRecord struct {
	// Timestamp is the arrival in milliseconds from the trace's start.
	Timestamp    *float64 `json:"timestamp"`
	InputLength  int      `json:"input_length"`
	OutputLength int      `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
}

// LoadMooncake reads a trace in the Mooncake format, one JSON object per
// line: timestamp (arrival in milliseconds), input_length and output_length
// (tokens), and hash_ids, one id per 512-token block of the prompt, equal
// ids standing for equal blocks with equal prefixes. Each hash id becomes
// the 512 token ids MooncakeBlock returns and the last block is cut to
// input_length, so prompts share exactly the prefixes their hash ids share.
// Requests are named "<name>-<line>" and arrive at their timestamps; an
// output_length of 0 is served as 1 token, the least a request generates.
//
// Blank lines are skipped. LoadMooncake fails, naming the line, on a line
// that is not such an object, a missing timestamp, timestamps going
// backwards, a non-positive input_length, a negative output_length, or a
// number of hash ids other than the number of blocks input_length spans.
func LoadMooncake(r io.Reader, name string) (Workload, error) {
	w := Workload{Name: name}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxTraceLine)
	line := 0
	for sc.Scan() {
		line++
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		req, err := parseMooncakeLine(sc.Bytes(), fmt.Sprintf("%s-%d", name, line))
		if err == nil && len(w.Requests) > 0 && req.Arrival < w.Requests[len(w.Requests)-1].Arrival {
			err = fmt.Errorf("timestamp %v is before the previous request's %v", req.Arrival, w.Requests[len(w.Requests)-1].Arrival)
		}
		if err != nil {
			return Workload{}, fmt.Errorf("mooncake trace %s line %d: %w", name, line, err)
		}
		w.Requests = append(w.Requests, req)
	}
	if err := sc.Err(); err != nil {
		return Workload{}, fmt.Errorf("mooncake trace %s after line %d: %w", name, line, err)
	}
	if len(w.Requests) == 0 {
		return Workload{}, fmt.Errorf("mooncake trace %s has no requests", name)
	}
	return w, nil
}

// parseMooncakeLine decodes one record and expands its prompt.
func parseMooncakeLine(b []byte, id string) (Request, error) {
	var rec mooncakeRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return Request{}, err
	}
	switch blocks := (rec.InputLength + MooncakeBlockTokens - 1) / MooncakeBlockTokens; {
	case rec.Timestamp == nil:
		return Request{}, errors.New("no timestamp")
	case *rec.Timestamp < 0:
		return Request{}, fmt.Errorf("negative timestamp %v", *rec.Timestamp)
	case *rec.Timestamp > maxTimestampMillis:
		return Request{}, fmt.Errorf("timestamp %v ms is beyond %v", *rec.Timestamp, time.Duration(math.MaxInt64))
	case rec.InputLength <= 0:
		return Request{}, fmt.Errorf("input_length %d is not positive", rec.InputLength)
	case rec.OutputLength < 0:
		return Request{}, fmt.Errorf("output_length %d is negative", rec.OutputLength)
	case len(rec.HashIDs) != blocks:
		return Request{}, fmt.Errorf("%d hash ids for input_length %d, which spans %d blocks of %d tokens",
			len(rec.HashIDs), rec.InputLength, blocks, MooncakeBlockTokens)
	}
	prompt := make([]uint32, 0, len(rec.HashIDs)*MooncakeBlockTokens)
	for _, h := range rec.HashIDs {
		prompt = appendMooncakeBlock(prompt, h)
	}
	return Request{
		ID:           id,
		Arrival:      time.Duration(*rec.Timestamp * float64(time.Millisecond)),
		Prompt:       prompt[:rec.InputLength],
		OutputTokens: max(rec.OutputLength, 1),
	}, nil
}

// MooncakeBlock returns the 512 token ids that hash id stands for: a
// pseudo-random sequence of ordinary token ids (sim.FirstPieceID up to
// sim.VocabSize-1) drawn by splitmix64 seeded with the id, the same in
// every process.
func MooncakeBlock(id uint64) []uint32 {
	return appendMooncakeBlock(make([]uint32, 0, MooncakeBlockTokens), id)
}

func appendMooncakeBlock(dst []uint32, id uint64) []uint32 {
	const pieces = uint64(sim.VocabSize - sim.FirstPieceID)
	state := id
	for range MooncakeBlockTokens {
		var v uint64
		state, v = splitmix64(state)
		dst = append(dst, sim.FirstPieceID+uint32(v%pieces))
	}
	return dst
}

// splitmix64 advances state and returns it with the next output of Vigna's
// SplitMix64 generator.
func splitmix64(state uint64) (next, out uint64) {
	next = state + 0x9e3779b97f4a7c15
	z := next
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return next, z ^ (z >> 31)
}
