package chatkwargs

import "testing"

func TestMergeGivesTheTemplateWhatVLLMsChatEndpointGivesIt(t *testing.T) {
	for _, tc := range []struct {
		name, kwargs, documents, effort string
		want                            string // "" for nil
	}{
		{name: "nothing to merge"},
		{name: "null kwargs", kwargs: `null`, documents: `null`},
		{name: "kwargs kept as sent", kwargs: `{"b": 1, "a": 2}`, want: `{"b": 1, "a": 2}`},
		{name: "documents", documents: `[{"text":"d"}]`, want: `{"documents":[{"text":"d"}]}`},
		{name: "documents over the kwargs' own", kwargs: `{"documents":[{"text":"old"}],"x":1}`, documents: `[{"text":"new"}]`,
			want: `{"documents":[{"text":"new"}],"x":1}`},
		{name: "effort enables thinking", effort: "high", want: `{"enable_thinking":true,"reasoning_effort":"high"}`},
		{name: "effort none disables thinking", effort: "none", want: `{"enable_thinking":false,"reasoning_effort":"none"}`},
		{name: "the kwargs' own enable_thinking wins", kwargs: `{"enable_thinking":true}`, effort: "none",
			want: `{"enable_thinking":true,"reasoning_effort":"none"}`},
		{name: "effort over the kwargs' own", kwargs: `{"reasoning_effort":"low"}`, effort: "high",
			want: `{"enable_thinking":true,"reasoning_effort":"high"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Merge(raw(tc.kwargs), raw(tc.documents), tc.effort)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want || (got == nil) != (tc.want == "") {
				t.Errorf("Merge = %s, want %s", got, tc.want)
			}
		})
	}
}

func TestMergeRefusesKwargsThatAreNoObject(t *testing.T) {
	if got, err := Merge(raw(`[1]`), raw(`[]`), ""); err == nil {
		t.Errorf("Merge of kwargs [1] = %s, want an error", got)
	}
	if got, err := Merge(raw(`[1]`), nil, ""); err != nil || string(got) != `[1]` {
		t.Errorf("Merge of kwargs [1] with nothing to merge = %s, %v; want them as sent", got, err)
	}
}

func raw(s string) []byte {
	if s == "" {
		return nil
	}
	return []byte(s)
}
