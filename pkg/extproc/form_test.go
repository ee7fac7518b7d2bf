package extproc

import (
	"bytes"
	"mime/multipart"
	"net/http"
	"testing"
)

// speechForm is a multipart/form-data body as OpenAI's SDKs send to vLLM's
// audio endpoints, naming model in its model field unless model is empty,
// and its Content-Type.
func speechForm(t *testing.T, model string) (string, string) {
	t.Helper()
	var buf bytes.Buffer
	w := multipart.NewWriter(&buf)
	fw, err := w.CreateFormFile("file", "speech.wav")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = fw.Write(bytes.Repeat([]byte{0, 1, 2, 0xff, '\r', '\n', '-'}, 4096))
	if model != "" {
		_ = w.WriteField("model", model)
	}
	_ = w.WriteField("language", "en")
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.String(), w.FormDataContentType()
}

func TestAnAudioFormIsPickedByItsModelField(t *testing.T) {
	f := start(t, 2, options{})
	body, contentType := speechForm(t, simModel)
	noModel, noModelType := speechForm(t, "")
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			x := f.envoy.start(t, mode, request{method: http.MethodPost, path: "/v1/audio/transcriptions", body: body,
				headers: map[string]string{"content-type": contentType}, pieces: 3})
			if x.immediate != nil {
				t.Fatalf("refused: %d %s", x.immediate.GetStatus().GetCode(), x.immediate.GetBody())
			}
			if f.engine(x.destination()) == nil {
				t.Fatalf("picked %q, no engine of the model", x.destination())
			}
			if string(x.body) != body {
				t.Errorf("the form was forwarded as %d bytes, not as the %d sent", len(x.body), len(body))
			}
			x.forward(512) // the simulator serves no audio: its 404 is relayed

			x = f.envoy.start(t, mode, request{method: http.MethodPost, path: "/v1/audio/translations", body: noModel,
				headers: map[string]string{"content-type": noModelType}})
			if x.immediate == nil || x.immediate.GetStatus().GetCode() != http.StatusBadRequest {
				t.Fatalf("a form without a model field went to %q", x.destination())
			}
			if _, code := errorOf(t, x.immediate.GetBody()); code != "missing_field" {
				t.Errorf("error code %q, want missing_field", code)
			}

			// A path the gateway does not name is routed by its model too,
			// and counted as "other".
			x = f.envoy.start(t, mode, request{method: http.MethodPost, path: "/v1/somewhere-else?x=1",
				body: `{"model":"` + simModel + `"}`})
			if x.immediate != nil {
				t.Fatalf("refused: %d %s", x.immediate.GetStatus().GetCode(), x.immediate.GetBody())
			}
			x.forward(512)
		})
	}
	if n := f.metric(t, "kvgate_cache_tracked_requests", nil); n != 0 {
		t.Errorf("%v requests still tracked", n)
	}
	// Each request is counted under its endpoint; paths clients make up
	// share one series.
	for endpoint, want := range map[string]int{"/v1/audio/transcriptions": len(modes), "/v1/audio/translations": len(modes), "other": len(modes)} {
		if n := f.metric(t, "kvgate_extproc_requests_total", map[string]string{"endpoint": endpoint}); n != float64(want) {
			t.Errorf("kvgate_extproc_requests_total{endpoint=%q} = %v, want %d", endpoint, n, want)
		}
	}
}
