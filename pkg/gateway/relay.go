package gateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
)

// usage is the token usage an engine reports in a response.
type usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
}

// responseUsage reads the usage of a whole (not streamed) response body.
func responseUsage(body []byte) (usage, bool) {
	var r struct {
		Usage *usage `json:"usage"`
	}
	if json.Unmarshal(body, &r) != nil || r.Usage == nil {
		return usage{}, false
	}
	return *r.Usage, true
}

// errClientGone reports that writing to the client failed: it went away.
var errClientGone = errors.New("client went away")

// relayWhole copies a response body to dst, keeping its first max bytes in
// keep so that its usage can be read afterwards. It returns errClientGone
// when dst fails and the body's error when reading fails; keep overflowed
// reports a body longer than max.
func relayWhole(dst io.Writer, src io.Reader, buf []byte, keep *bytes.Buffer, max int) (overflowed bool, err error) {
	for {
		n, rerr := src.Read(buf)
		if n > 0 {
			if !overflowed && keep.Len()+n <= max {
				keep.Write(buf[:n])
			} else {
				overflowed = true
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return overflowed, errClientGone
			}
		}
		switch {
		case rerr == io.EOF:
			return overflowed, nil
		case rerr != nil:
			return overflowed, rerr
		}
	}
}

// sseRelay copies an engine's server-sent events to the client one event
// at a time, byte for byte, flushing whenever it has relayed everything the
// engine sent so far. On the way it reads what the gateway needs from the
// events: the first generated token, and the usage chunk (a chunk with no
// choices and a usage object), which it withholds from the client when
// dropUsage is set because the gateway asked for it on the client's behalf.
//
// Only events with a single data line holding a JSON object are read;
// every other event (comments, [DONE], errors) is relayed untouched.
type sseRelay struct {
	dst   io.Writer
	flush func() error
	src   *bufio.Reader
	eventReader

	event []byte
}

// eventReader reads what the gateway needs from an engine's server-sent
// events, one complete event at a time: the first generated token, and the
// usage chunk (a chunk with no choices and a usage object).
type eventReader struct {
	// dropUsage withholds the usage chunk; firstToken is called once, at
	// the first event carrying generated output.
	dropUsage  bool
	firstToken func()

	seenToken bool
	usage     usage
	hasUsage  bool
}

// run relays until the engine ends the stream. It returns errClientGone
// when the client cannot be written to, and the engine's read error when
// the stream broke off; what was read of a final incomplete event is
// relayed first.
func (s *sseRelay) run() error {
	s.event = s.event[:0]
	for {
		line, err := s.src.ReadSlice('\n')
		s.event = append(s.event, line...)
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err != nil:
			if werr := s.write(s.event); werr != nil {
				return werr
			}
			if err == io.EOF {
				return nil
			}
			return err
		}
		if !isBlankLine(line) {
			continue
		}
		if err := s.endEvent(); err != nil {
			return err
		}
	}
}

// endEvent relays the complete event in s.event, unless it is a withheld
// usage chunk, and flushes when the engine has sent nothing more yet.
func (s *sseRelay) endEvent() error {
	if !s.inspect(s.event) {
		if err := s.write(s.event); err != nil {
			return err
		}
	}
	s.event = s.event[:0]
	if s.src.Buffered() == 0 {
		if err := s.flush(); err != nil {
			return errClientGone
		}
	}
	return nil
}

func (s *sseRelay) write(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if _, err := s.dst.Write(b); err != nil {
		return errClientGone
	}
	return nil
}

// usageKey is what a chunk must contain to be decoded once the first token
// was seen.
var usageKey = []byte(`"usage"`)

// inspect reads an event and reports whether it is to be withheld.
func (s *eventReader) inspect(event []byte) (withhold bool) {
	payload, ok := dataPayload(event)
	if !ok || len(payload) == 0 || payload[0] != '{' {
		return false
	}
	if s.seenToken && !bytes.Contains(payload, usageKey) {
		return false
	}
	var c streamChunk
	if json.Unmarshal(payload, &c) != nil {
		return false
	}
	if !s.seenToken && c.hasOutput() {
		s.seenToken = true
		s.firstToken()
	}
	if c.Usage != nil && c.Choices != nil && len(c.Choices) == 0 {
		s.usage, s.hasUsage = *c.Usage, true
		return s.dropUsage
	}
	return false
}

// streamChunk is what the relay reads of a completion or chat chunk.
type streamChunk struct {
	Choices []chunkChoice `json:"choices"`
	Usage   *usage        `json:"usage"`
}

type chunkChoice struct {
	Text         string     `json:"text"`
	Delta        chunkDelta `json:"delta"`
	FinishReason *string    `json:"finish_reason"`
}

type chunkDelta struct {
	Content          string          `json:"content"`
	ReasoningContent string          `json:"reasoning_content"`
	Reasoning        string          `json:"reasoning"`
	ToolCalls        json.RawMessage `json:"tool_calls"`
}

// hasOutput reports whether the chunk carries generated output: text, a
// chat delta other than the opening role, or a finish reason. vLLM opens a
// chat stream with a delta holding only the role.
func (c *streamChunk) hasOutput() bool {
	for i := range c.Choices {
		ch := &c.Choices[i]
		d := &ch.Delta
		if ch.Text != "" || ch.FinishReason != nil || d.Content != "" || d.ReasoningContent != "" ||
			d.Reasoning != "" || (len(d.ToolCalls) > 0 && string(d.ToolCalls) != "null") {
			return true
		}
	}
	return false
}

// dataPayload returns the value of the event's only data line, without the
// optional space after the colon and the line ending; false when the event
// has no data line or several.
func dataPayload(event []byte) ([]byte, bool) {
	var payload []byte
	found := false
	for len(event) > 0 {
		line := event
		if i := bytes.IndexByte(event, '\n'); i >= 0 {
			line, event = event[:i], event[i+1:]
		} else {
			event = nil
		}
		line = bytes.TrimSuffix(line, []byte{'\r'})
		v, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue
		}
		if found {
			return nil, false
		}
		payload, found = bytes.TrimPrefix(v, []byte{' '}), true
	}
	return payload, found
}

// isBlankLine reports whether line, with its ending, is empty: the end of
// an event.
func isBlankLine(line []byte) bool {
	return len(line) == 1 || (len(line) == 2 && line[0] == '\r')
}
