package simserver

import (
	"encoding/json"
	"net/http"

	"github.com/kvgate/kvgate/pkg/sim"
)

// format shapes the choices of completions or chat completions.
type format struct {
	// object and chunkObject name a whole response and a stream chunk.
	object, chunkObject string
	// fullChoice builds choice i of a whole response.
	fullChoice func(i int, text string, finish *string) any
	// chunkChoice builds the choice of a stream chunk carrying text for
	// choice i.
	chunkChoice func(i int, text string, finish *string) any
	// firstChunk, when set, builds the chunk that opens choice i's stream
	// before any token.
	firstChunk func(i int) any
}

// completionChoiceOf builds a completion choice, the same whole or streamed.
func completionChoiceOf(i int, text string, finish *string) any {
	return completionChoice{Index: i, Text: text, FinishReason: finish}
}

var completionFormat = &format{
	object:      "text_completion",
	chunkObject: "text_completion",
	fullChoice:  completionChoiceOf,
	chunkChoice: completionChoiceOf,
}

var chatFormat = &format{
	object:      "chat.completion",
	chunkObject: "chat.completion.chunk",
	fullChoice: func(i int, text string, finish *string) any {
		return chatChoice{Index: i, Message: assistantMsg{Role: "assistant", Content: text}, FinishReason: finish}
	},
	chunkChoice: func(i int, text string, finish *string) any {
		return chatChunkChoice{Index: i, Delta: assistantMsg{Content: text}, FinishReason: finish}
	},
	firstChunk: func(i int) any {
		return chatChunkChoice{Index: i, Delta: assistantMsg{Role: "assistant"}}
	},
}

// stream answers with server-sent events as vLLM does: a "data: {json}"
// event per token and choice, a usage chunk with no choices when asked for,
// then "data: [DONE]". If the client goes away the generation is aborted.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, g *generation, f *format, includeUsage bool) {
	sse := startEvents(w)
	chunk := func(choices []any, u *usage) response {
		return response{ID: g.id, Object: f.chunkObject, Created: g.created, Model: g.model, Choices: choices, Usage: u}
	}
	if f.firstChunk != nil {
		for i := range g.choices {
			sse.send(chunk([]any{f.firstChunk(i)}, nil))
		}
	}
	for g.pending > 0 && sse.err == nil {
		outs, err := g.next(r.Context())
		if err != nil {
			if r.Context().Err() == nil {
				sse.send(apiError{Error: apiErrorBody{Message: err.Error(), Type: "ServiceUnavailableError", Code: http.StatusServiceUnavailable}})
				sse.done()
			}
			return
		}
		for _, out := range outs {
			text := sim.Tokenizer{}.Decode([]uint32{out.Token})
			sse.send(chunk([]any{f.chunkChoice(g.choiceOf(out), text, finishReason(out.FinishReason))}, nil))
		}
	}
	if sse.err != nil {
		g.abort()
		return
	}
	if includeUsage {
		sse.send(chunk([]any{}, g.usage()))
	}
	sse.done()
}

// startEvents answers 200 with an event stream and returns its writer.
func startEvents(w http.ResponseWriter) *sseWriter {
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	return &sseWriter{w: w, rc: http.NewResponseController(w)}
}

// sseWriter writes server-sent events, flushing each, and remembers the
// first write error.
type sseWriter struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	buf []byte
	err error
}

func (s *sseWriter) send(v any) {
	data, err := json.Marshal(v)
	if err != nil {
		s.err = err
		return
	}
	s.buf = append(append(append(s.buf[:0], "data: "...), data...), "\n\n"...)
	s.write()
}

// event writes v as an event named name, as Anthropic's streams frame
// them: "event: <name>", then "data: <json>".
func (s *sseWriter) event(name string, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		s.err = err
		return
	}
	s.buf = appendEvent(s.buf[:0], name, data)
	s.write()
}

// frame writes an event already framed.
func (s *sseWriter) frame(frame []byte) {
	s.buf = append(s.buf[:0], frame...)
	s.write()
}

// eventFrame returns v as an event named name: "event: <name>", then
// "data: <json>" and a blank line.
func eventFrame(name string, v any) ([]byte, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return appendEvent(nil, name, data), nil
}

// appendEvent appends to dst the event named name of JSON data.
func appendEvent(dst []byte, name string, data []byte) []byte {
	return append(append(append(append(append(dst, "event: "...), name...), "\ndata: "...), data...), "\n\n"...)
}

func (s *sseWriter) done() {
	s.buf = append(s.buf[:0], "data: [DONE]\n\n"...)
	s.write()
}

func (s *sseWriter) write() {
	if s.err != nil {
		return
	}
	if _, err := s.w.Write(s.buf); err != nil {
		s.err = err
		return
	}
	s.err = s.rc.Flush()
}
