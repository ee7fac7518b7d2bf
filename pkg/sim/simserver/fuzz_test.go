package simserver

import (
	"encoding/json"
	"testing"
)

func FuzzParsePrompts(f *testing.F) {
	for _, s := range []string{`"hi"`, `["a","b"]`, `[1,2,3]`, `[[1],[2,3]]`, `[]`, `null`, `[1,"a"]`, `[-1]`, `[1e3]`, `[[1],"x"]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		prompts, err := parsePrompts(simTokenizer{}, json.RawMessage(raw), true)
		if err != nil {
			if _, ok := err.(*badRequest); !ok {
				t.Fatalf("error %T %v is not a bad request", err, err)
			}
			return
		}
		if len(prompts) == 0 {
			t.Fatal("no prompts and no error")
		}
	})
}
