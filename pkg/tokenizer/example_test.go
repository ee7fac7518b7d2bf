package tokenizer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/pkg/tokenizer"
)

// A gateway decodes the client's body into a struct that embeds the
// request type, asks a ready pod of the model, and routes on load alone
// when tokenization fails, counting the reason.
func Example() {
	pod := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// vLLM's answer to POST /tokenize.
		fmt.Fprint(w, `{"count":4,"max_model_len":8192,"tokens":[128000,9906,1917,0],"token_strs":null}`)
	}))
	defer pod.Close()

	tk, err := tokenizer.New(tokenizer.Config{Timeout: 2 * time.Second}, prometheus.NewRegistry())
	if err != nil {
		panic(err)
	}
	defer tk.Close()

	var body struct {
		tokenizer.ChatRequest
		Stream bool `json:"stream"`
	}
	raw := `{"model":"llama","messages":[{"role":"user","content":"Hello world!"}],"stream":true}`
	if err := json.Unmarshal([]byte(raw), &body); err != nil {
		panic(err)
	}
	for range 2 {
		ids, err := tk.TokenizeChat(context.Background(), pod.URL, &body.ChatRequest)
		var terr *tokenizer.Error
		if errors.As(err, &terr) {
			fmt.Println("route on load alone:", terr.Reason)
			continue
		}
		fmt.Println(ids)
	}
	// Output:
	// [128000 9906 1917 0]
	// [128000 9906 1917 0]
}
