package gateway

import (
	"encoding/json"
	"testing"
)

func TestWithModelRenamesEveryTopLevelModelMember(t *testing.T) {
	tests := []struct {
		name, body, model, want string
	}{
		{"one member", `{"model":"alias","prompt":"hi"}`, "base", `{"model":"base","prompt":"hi"}`},
		{"spaces kept", "{ \"model\" : \"alias\" ,\n \"n\":1}", "base", "{ \"model\" : \"base\" ,\n \"n\":1}"},
		{"a repeated member, each", `{"model":"a","model":"b"}`, "base", `{"model":"base","model":"base"}`},
		{"an escaped name", `{"mod\u0065l":"alias"}`, "base", `{"mod\u0065l":"base"}`},
		{"a nested model untouched", `{"tools":[{"model":"x"}],"model":"alias"}`, "base", `{"tools":[{"model":"x"}],"model":"base"}`},
		{"a name needing escapes", `{"model":"alias"}`, "a\"b<", `{"model":"a\"b\u003c"}`},
		{"a null model", `{"model":null}`, "base", `{"model":"base"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := withModel([]byte(tt.body), tt.model)
			if err != nil || string(got) != tt.want {
				t.Fatalf("withModel(%s, %q) = %s, %v; want %s", tt.body, tt.model, got, err, tt.want)
			}
			var v map[string]any
			if err := json.Unmarshal(got, &v); err != nil || v["model"] != tt.model {
				t.Fatalf("the body reads as %v (%v); want model %q", v, err, tt.model)
			}
		})
	}
	if _, err := withModel([]byte(`{"model":`), "base"); err == nil {
		t.Fatal("a truncated body was rewritten")
	}
}
