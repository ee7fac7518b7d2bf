package simserver

import (
	"container/list"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
)

// DefaultResponsesStoreMax is the number of responses a server in store
// mode keeps when Config.ResponsesStoreMax is 0.
const DefaultResponsesStoreMax = 10000

// responseStore keeps the responses of a server in store mode, as vLLM
// with VLLM_ENABLE_RESPONSES_API_STORE keeps them in memory, each with
// the input items its request was rendered from. Unlike vLLM's, it is
// bounded: it keeps at most max responses and forgets the oldest stored
// first.
type responseStore struct {
	mu      sync.Mutex
	max     int
	entries map[string]*storedResponse
	order   list.List // of *storedResponse, the oldest stored first
}

// storedResponse is a kept response. Its members are read and written
// under the store's lock; resp is replaced, never changed in place, so
// that a response handed out may be written without the lock.
type storedResponse struct {
	elem *list.Element
	resp *responsesObject
	// input is the input items the request was rendered from: its
	// instructions as a system message, the conversation it continued,
	// then its own input.
	input []json.RawMessage
	// cancel stops the generation of a background response, which closes
	// done when it ends; both nil for other responses.
	cancel context.CancelFunc
	done   chan struct{}
	// streamed marks a background stream, whose events are kept, framed,
	// for its readers; wake is closed, and replaced, when events grow or
	// the generation ends.
	streamed bool
	events   [][]byte
	wake     chan struct{}
}

func newResponseStore(max int) *responseStore {
	return &responseStore{max: max, entries: make(map[string]*storedResponse)}
}

// responseNotFound is vLLM's answer for a response it does not hold.
func responseNotFound(id string) error {
	return &responsesFailure{status: http.StatusNotFound, kind: "invalid_request_error", param: "response_id",
		msg: fmt.Sprintf("Response with id '%s' not found.", id)}
}

// get returns the response kept under id and its input items; a nil
// store holds none.
func (st *responseStore) get(id string) (*responsesObject, []json.RawMessage, bool) {
	if st == nil {
		return nil, nil, false
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	e, ok := st.entries[id]
	if !ok {
		return nil, nil, false
	}
	return e.resp, e.input, true
}

// put keeps resp with its input items as the newest response, forgetting
// the oldest when the store is full.
func (st *responseStore) put(resp *responsesObject, input []json.RawMessage) *storedResponse {
	return st.putEntry(&storedResponse{resp: resp, input: input})
}

// putBackground keeps the queued response of a background generation,
// which cancel stops, as put does; streamed keeps its events too.
func (st *responseStore) putBackground(queued *responsesObject, input []json.RawMessage, cancel context.CancelFunc,
	streamed bool) *storedResponse {
	return st.putEntry(&storedResponse{resp: queued, input: input, cancel: cancel, done: make(chan struct{}),
		streamed: streamed, wake: make(chan struct{})})
}

// lookup returns the entry kept under id; a nil store holds none.
func (st *responseStore) lookup(id string) (*storedResponse, bool) {
	if st == nil {
		return nil, false
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	e, ok := st.entries[id]
	return e, ok
}

// addEvent keeps frame, the next event of background stream e, and wakes
// its readers.
func (st *responseStore) addEvent(e *storedResponse, frame []byte) {
	st.mu.Lock()
	defer st.mu.Unlock()
	e.events = append(e.events, frame)
	e.signal()
}

// eventsFrom returns the events of background stream e from the i-th on,
// whether its generation has ended (no event comes after those), and a
// channel closed when either changes.
func (st *responseStore) eventsFrom(e *storedResponse, i int) (frames [][]byte, ended bool, wake <-chan struct{}) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if i < len(e.events) {
		frames = e.events[i:len(e.events):len(e.events)]
	}
	select {
	case <-e.done:
		ended = true
	default:
	}
	return frames, ended, e.wake
}

// signal wakes the readers of e's events; under the store's lock.
func (e *storedResponse) signal() {
	if e.wake != nil {
		close(e.wake)
		e.wake = make(chan struct{})
	}
}

func (st *responseStore) putEntry(e *storedResponse) *storedResponse {
	resp := e.resp
	st.mu.Lock()
	defer st.mu.Unlock()
	if old, ok := st.entries[resp.ID]; ok {
		st.order.Remove(old.elem)
		delete(st.entries, resp.ID)
	}
	for st.order.Len() >= st.max {
		oldest := st.order.Remove(st.order.Front()).(*storedResponse)
		delete(st.entries, oldest.resp.ID)
	}
	e.elem = st.order.PushBack(e)
	st.entries[resp.ID] = e
	return e
}

// len returns the number of responses kept.
func (st *responseStore) len() int {
	st.mu.Lock()
	defer st.mu.Unlock()
	return len(st.entries)
}

// finish replaces the queued response of background generation e with
// resp, its end, unless e was cancelled or is no longer kept, and marks
// the generation ended.
func (st *responseStore) finish(e *storedResponse, resp *responsesObject) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.entries[resp.ID] == e && e.resp.Status != "cancelled" {
		e.resp = resp
	}
	close(e.done)
	e.signal()
}

// fail marks background generation e failed, as vLLM does, unless it
// completed or was cancelled, and marks it ended.
func (st *responseStore) fail(e *storedResponse) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if s := e.resp.Status; s != "completed" && s != "cancelled" {
		failed := *e.resp
		failed.Status = "failed"
		e.resp = &failed
	}
	close(e.done)
	e.signal()
}

// cancel cancels the background response kept under id, as vLLM does:
// the response, its status now "cancelled", once its generation has been
// aborted; 404 when none is kept under id, and 400 when it is neither
// queued nor in progress.
func (st *responseStore) cancel(id string) (*responsesObject, error) {
	if st == nil {
		return nil, responseNotFound(id)
	}
	st.mu.Lock()
	e, ok := st.entries[id]
	if !ok {
		st.mu.Unlock()
		return nil, responseNotFound(id)
	}
	if s := e.resp.Status; s != "queued" && s != "in_progress" {
		st.mu.Unlock()
		return nil, &responsesFailure{status: http.StatusBadRequest, kind: "invalid_request_error", param: "response_id",
			msg: "Cannot cancel a synchronous response."}
	}
	cancelled := *e.resp
	cancelled.Status = "cancelled"
	e.resp = &cancelled
	st.mu.Unlock()
	if e.cancel != nil {
		e.cancel()
		<-e.done
	}
	return &cancelled, nil
}
