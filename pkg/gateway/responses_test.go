package gateway

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
)

// responsesInstructions are the instructions of the test Responses
// requests.
const responsesInstructions = "You answer in three words."

// responsesBody is a /v1/responses body with the instructions
// responsesInstructions and the input user, plus extra members.
func responsesBody(user, extra string) string {
	u, _ := json.Marshal(user)
	return `{"model":"llama","max_output_tokens":16,"store":false,"instructions":"` + responsesInstructions +
		`","input":` + string(u) + extra + `}`
}

// responsesPromptTokens are the test engines' tokens of the chat vLLM
// converts responsesBody(user, ...) into: the instructions as a system
// message, then the user's input.
func responsesPromptTokens(user string) []uint32 {
	return toyTokens(responsesInstructions + "\n" + user + "\n")
}

// predictedTraces returns how many responses the model's output predictor
// has learned from.
func predictedTraces(t *testing.T, f *testFleet, model string) int32 {
	t.Helper()
	p, err := f.gw.predictors.GetOutputPredictor(model)
	if err != nil {
		t.Fatal(err)
	}
	var n int32
	for _, c := range p.Histogram() {
		n += c
	}
	return n
}

func TestResponsesReportTheirFirstTokenAndUsageToTheLedger(t *testing.T) {
	reportsFirstTokenAndUsageToTheLedger(t, responsesAPI)
}

// TestAResponsesStreamsFirstTokenIsItsFirstOutputEvent: vLLM sends
// response.created and response.in_progress before anything is generated;
// the first token is the event that follows them.
func TestAResponsesStreamsFirstTokenIsItsFirstOutputEvent(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{})
	seen := watchAttempts(f.gw)
	events := responsesEvents("llama", responsesUsage(5))
	release := make(chan struct{})
	f.engine("a").setAnswer(func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		for i, ev := range events {
			if i == 2 {
				select {
				case <-release:
				case <-r.Context().Done():
					return
				}
			}
			_, _ = w.Write([]byte(ev))
			w.(http.Flusher).Flush()
		}
	})
	resp := openStream(t, f.url+PathResponses, responsesBody("hello", `,"stream":true`))
	defer resp.Body.Close()
	// Both opening events reach the client before the engine generates.
	want := events[0] + events[1]
	got := make([]byte, len(want))
	if _, err := io.ReadFull(resp.Body, got); err != nil || string(got) != want {
		t.Fatalf("the stream began with %q, %v; want %q", got, err, want)
	}
	seen.mu.Lock()
	first := seen.first
	seen.mu.Unlock()
	if first != 0 {
		t.Fatal("a first token was reported before the engine generated one")
	}
	close(release)
	if rest, err := readStream(resp); err != nil || rest != strings.Join(events[2:], "") {
		t.Fatalf("the rest of the stream: %q, %v", rest, err)
	}
	if _, first := seen.wait(t, 1); first != 1 {
		t.Errorf("%d first tokens reported, want 1", first)
	}
}

func TestResponsesGoToThePodHoldingTheirConvertedPromptsPrefix(t *testing.T) {
	goesToThePodHoldingItsConvertedPromptsPrefix(t, responsesAPI)
}

func TestResponsesWhosePromptCannotBeReproducedAreRoutedOnLoadAloneAndCounted(t *testing.T) {
	// vLLM renders an image into the prompt in a way the gateway does not
	// reproduce: the conversion refuses it as unsupported.
	image := `{"model":"llama","input":[{"type":"message","role":"user","content":[` +
		`{"type":"input_image","image_url":"data:image/png;base64,iVBORw0KGgo="},{"type":"input_text","text":"what is this?"}]}]}`
	var bodies []string
	for _, extra := range []string{"", `,"stream":true`} {
		bodies = append(bodies, strings.Replace(image, `}]}]}`, `}]}]`+extra+`}`, 1))
	}
	routedOnLoadAloneAndCounted(t, PathResponses, bodies, map[string]float64{"unsupported": 2})
}

func TestResponsesBodiesAreCheckedAsChatsAre(t *testing.T) {
	asChat := func(body string) string {
		return strings.Replace(strings.Replace(body, `"max_output_tokens"`, `"max_tokens"`, 1), `"input":"hi"`, `"messages":[]`, 1)
	}
	bodiesAreCheckedAsChatsAre(t, responsesAPI, asChat, []refusedBody{
		{"no model", `{"input":"hi"}`, http.StatusBadRequest, codeMissingField},
		{"model of another type", `{"model":7,"input":"hi"}`, http.StatusBadRequest, codeInvalidJSON},
		{"stream of another type", `{"model":"llama","stream":"maybe","input":"hi"}`, http.StatusBadRequest, codeInvalidJSON},
		{"max_output_tokens of another type", `{"model":"llama","max_output_tokens":[16],"input":"hi"}`, http.StatusBadRequest, codeInvalidJSON},
		{"not an object", `["llama"]`, http.StatusBadRequest, codeInvalidJSON},
		{"unknown model", `{"model":"nope","input":"hi"}`, http.StatusNotFound, codeModelNotFound},
	})
}

// TestAResponsesStreamCutByThePodEndsWithAnErrorEvent: a Responses stream
// the engine cuts ends with an event named error whose data is an OpenAI
// error object, which OpenAI's SDKs raise, and a whole response cut
// before its end is answered 502 with an OpenAI error.
func TestAResponsesStreamCutByThePodEndsWithAnErrorEvent(t *testing.T) {
	f := startFleet(t, []string{"a"}, fleetOptions{})
	e := f.engine("a")
	events := responsesEvents("llama", responsesUsage(5))
	first := events[0] + events[1] + events[2]
	cutAfter(e, http.Header{"Content-Type": {"text/event-stream"}}, first+"event: response.content_part.added\ndata: {\"ty")
	data, err := readStream(openStream(t, f.url+PathResponses, responsesBody("hi", `,"stream":true`)))
	_, payload, isError := strings.Cut(data, "\n\nevent: error\ndata: ")
	if err == nil || !strings.HasPrefix(data, first) || !isError || !strings.HasSuffix(payload, "\n\n") {
		t.Fatalf("cut stream: %q, %v; want its first events, an error event and a broken end", data, err)
	}
	if ev := decodeError(t, []byte(payload)); ev.Type != typeUpstream || ev.Code != codeUpstreamFailed {
		t.Errorf("the stream's error event is %+v, want an OpenAI error of type %q", ev, typeUpstream)
	}

	cutAfter(e, http.Header{"Content-Type": {"application/json"}, "Content-Length": {"500"}}, `{"id":"resp_1","output":[`)
	resp, body := post(t, f.url+PathResponses, responsesBody("hi", ""), nil)
	if ev := decodeError(t, body); resp.StatusCode != http.StatusBadGateway || ev.Type != typeUpstream {
		t.Errorf("cut response: %d %s; want 502 %s in OpenAI's shape", resp.StatusCode, body, typeUpstream)
	}
}

// TestThePickerReadsResponsesInTheResponsesAPIShapes feeds the Picker's
// Response the bodies vLLM answers Responses requests with, in pieces
// that cut the events apart, as a front end relays them.
func TestThePickerReadsResponsesInTheResponsesAPIShapes(t *testing.T) {
	events := responsesEvents("llama", responsesUsage(41))
	pickerReadsShapes(t, responsesAPI, responsesObject("llama", "completed", responsesOutput, responsesUsage(41)),
		strings.Join(events, ""), len(events[0]+events[1]), "")
}

func TestThePickerHoldsResponsesInTheSLOQueueAsChats(t *testing.T) {
	holdsInTheSLOQueue(t, PathResponses, responsesBody(simPrompt(99, 20), ""))
}

func TestResponsesUsageIsReadOnlyWhenAnEngineCouldMeanIt(t *testing.T) {
	readsUsage(t, kindResponses, `"object":"response"`, []usageCase{
		{responsesUsage(12), usage{PromptTokens: 12, CompletionTokens: 3, CachedTokens: responsesCached, CachedReported: true}, true},
		{`{"input_tokens":12,"output_tokens":3,"input_tokens_details":null}`, usage{PromptTokens: 12, CompletionTokens: 3}, true},
		{`{"input_tokens":12,"output_tokens":3,"input_tokens_details":{"cached_tokens":null}}`,
			usage{PromptTokens: 12, CompletionTokens: 3}, true},
		{`{"output_tokens":3}`, usage{CompletionTokens: 3}, true},
		{`{}`, usage{}, false},
		{`null`, usage{}, false},
		{`{"input_tokens":-1,"output_tokens":3}`, usage{}, false},
		{`{"input_tokens":12,"output_tokens":1.5}`, usage{}, false},
		{`{"input_tokens":12,"output_tokens":3,"input_tokens_details":{"cached_tokens":-2}}`, usage{}, false},
		// OpenAI's chat names are no Responses usage.
		{`{"prompt_tokens":12,"completion_tokens":3}`, usage{}, false},
	})
}

func TestDecodeReadsMaxOutputTokensAsAResponsesBound(t *testing.T) {
	var in inference
	for _, c := range []struct {
		body   string
		max    int
		stream bool
	}{
		{`{"model":"llama","input":"hi","max_output_tokens":"12","stream":1}`, 12, true},
		// max_tokens is no member of a Responses body.
		{`{"model":"llama","input":"hi","max_tokens":12}`, 0, false},
		{`{"model":"llama","input":"hi","max_output_tokens":null}`, 0, false},
	} {
		if err := in.decode(kindResponses, []byte(c.body)); err != nil {
			t.Fatalf("decode(%s): %v", c.body, err)
		}
		if in.model() != "llama" || in.maxTokens() != c.max || in.stream().Stream != c.stream {
			t.Errorf("decode(%s): model %q, max tokens %d, stream %v; want llama, %d, %v", c.body, in.model(), in.maxTokens(),
				in.stream().Stream, c.max, c.stream)
		}
	}
}

func TestDecodeReadsTheStoredResponseARequestContinuesAndWhetherItsOwnIsStored(t *testing.T) {
	var in inference
	for _, c := range []struct {
		body      string
		previous  string
		notStored bool
	}{
		{`{"model":"llama","input":"hi"}`, "", false},
		{`{"model":"llama","input":"hi","previous_response_id":"resp_1","store":true}`, "resp_1", false},
		{`{"model":"llama","input":"hi","previous_response_id":null,"store":"off"}`, "", true},
		// vLLM reads a null store as false: nothing is kept.
		{`{"model":"llama","input":"hi","store":null}`, "", true},
		{`{"model":"llama","input":"hi","store":0,"store":1}`, "", false},
	} {
		if err := in.decode(kindResponses, []byte(c.body)); err != nil {
			t.Fatalf("decode(%s): %v", c.body, err)
		}
		if in.conv.PreviousResponseID != c.previous || in.conv.NotStored != c.notStored {
			t.Errorf("decode(%s): previous %q, not stored %v; want %q, %v", c.body, in.conv.PreviousResponseID,
				in.conv.NotStored, c.previous, c.notStored)
		}
	}
	for _, body := range []string{`{"model":"llama","previous_response_id":7}`, `{"model":"llama","store":"maybe"}`} {
		var te *typeError
		if err := in.decode(kindResponses, []byte(body)); !errors.As(err, &te) {
			t.Errorf("decode(%s) = %v; want a type error, as vLLM refuses it", body, err)
		}
	}
}
