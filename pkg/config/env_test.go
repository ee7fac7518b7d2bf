package config

import (
	"math"
	"strings"
	"testing"
	"time"
)

func lookupFrom(m map[string]string) LookupFunc {
	return func(name string) (string, bool) {
		v, ok := m[name]
		return v, ok
	}
}

func TestEnvReadsValuesAliasesAndDefaults(t *testing.T) {
	v := Var{Name: "NEW", Aliases: []string{"OLD"}, Default: "7"}
	tests := []struct {
		name string
		env  map[string]string
		want int
	}{
		{"default when unset", nil, 7},
		{"alias when only the alias is set", map[string]string{"OLD": "3"}, 3},
		{"name and alias agreeing", map[string]string{"NEW": "5", "OLD": "5"}, 5},
		{"white space ignored", map[string]string{"NEW": " 9 "}, 9},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := NewEnv(lookupFrom(tt.env))
			if got := e.Int(v, 0); got != tt.want || e.Err() != nil {
				t.Fatalf("Int = %d, err %v; want %d, nil", got, e.Err(), tt.want)
			}
		})
	}
}

func TestEnvRefusesNamesOfOneSettingThatDisagree(t *testing.T) {
	v := Var{Name: "NEW", Aliases: []string{"OLD"}, Default: "true"}
	e := NewEnv(lookupFrom(map[string]string{"NEW": "false", "OLD": "true"}))
	if got := e.Bool(v); got {
		t.Errorf("Bool = true, want the value of NEW")
	}
	err := e.Err()
	if err == nil || !strings.Contains(err.Error(), `NEW="false" and OLD="true"`) {
		t.Fatalf("Err() = %v, want the disagreement named", err)
	}
	if e := NewEnv(lookupFrom(map[string]string{"NEW": "TRUE", "OLD": "true"})); e.Bool(v) != true || e.Err() != nil {
		t.Errorf("names agreeing but for case: err %v", e.Err())
	}
}

func TestEnvDurationRefusesValuesThatOverflow(t *testing.T) {
	v := Var{Name: "D", Default: "1"}
	for _, tt := range []struct {
		value string
		unit  time.Duration
	}{
		{"18446744073710", time.Millisecond},
		{"9223372036855", time.Millisecond},
		{"153722867281", time.Minute},
	} {
		e := NewEnv(lookupFrom(map[string]string{"D": tt.value}))
		if got := e.Duration(v, tt.unit); e.Err() == nil {
			t.Errorf("Duration(%q, %v) = %v, accepted", tt.value, tt.unit, got)
		}
	}
	e := NewEnv(lookupFrom(map[string]string{"D": "9223372036854"}))
	if got := e.Duration(v, time.Millisecond); got != 9223372036854*time.Millisecond || e.Err() != nil {
		t.Errorf("largest millisecond count = %v, err %v", got, e.Err())
	}
}

func TestEnvDurationUnits(t *testing.T) {
	v := Var{Name: "D", Default: "5"}
	tests := []struct {
		value string
		unit  time.Duration
		want  time.Duration
	}{
		{"5", time.Second, 5 * time.Second},
		{"50", time.Millisecond, 50 * time.Millisecond},
		{"20", time.Minute, 20 * time.Minute},
		{"1.5s", time.Second, 1500 * time.Millisecond},
		{"200ms", time.Minute, 200 * time.Millisecond},
	}
	for _, tt := range tests {
		e := NewEnv(lookupFrom(map[string]string{"D": tt.value}))
		if got := e.Duration(v, tt.unit); got != tt.want || e.Err() != nil {
			t.Errorf("Duration(%q, %v) = %v, err %v; want %v", tt.value, tt.unit, got, e.Err(), tt.want)
		}
	}
}

func TestEnvDurationOrZeroAcceptsZero(t *testing.T) {
	v := Var{Name: "D", Default: "0"}
	for value, want := range map[string]time.Duration{"0": 0, "0s": 0, "3": 3 * time.Second, "250ms": 250 * time.Millisecond} {
		e := NewEnv(lookupFrom(map[string]string{"D": value}))
		if got := e.DurationOrZero(v, time.Second); got != want || e.Err() != nil {
			t.Errorf("DurationOrZero(%q) = %v, err %v; want %v", value, got, e.Err(), want)
		}
	}
	for _, value := range []string{"-1", "-2s", "soon"} {
		e := NewEnv(lookupFrom(map[string]string{"D": value}))
		if e.DurationOrZero(v, time.Second); e.Err() == nil {
			t.Errorf("DurationOrZero(%q) accepted", value)
		}
	}
	if e := NewEnv(lookupFrom(map[string]string{"D": "0"})); e.Duration(v, time.Second) != 0 || e.Err() == nil {
		t.Error("Duration accepted 0")
	}
}

func TestEnvCollectsEveryMalformedValue(t *testing.T) {
	e := NewEnv(lookupFrom(map[string]string{
		"B": "yes please", "I": "-3", "F": "abc", "D": "0", "OLD": "x",
	}))
	e.Bool(Var{Name: "B", Default: "false"})
	e.Int(Var{Name: "I", Default: "1"}, 0)
	e.Float(Var{Name: "F", Default: "1"}, 0)
	e.Duration(Var{Name: "D", Default: "1"}, time.Second)
	e.Int(Var{Name: "NEW", Aliases: []string{"OLD"}, Default: "1"}, 0)
	e.Errorf("combination: %s", "cannot work")

	err := e.Err()
	if err == nil {
		t.Fatal("Err() = nil, want every malformed value reported")
	}
	for _, want := range []string{`B="yes please"`, `I="-3"`, `F="abc"`, `D="0"`, `OLD="x"`, "combination: cannot work"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
}

func TestEnvFloatRefusesValuesThatAreNotFiniteNumbers(t *testing.T) {
	v := Var{Name: "F", Default: "1"}
	for _, value := range []string{"NaN", "nan", "Inf", "+Inf", "-Inf", "infinity", "1e400"} {
		e := NewEnv(lookupFrom(map[string]string{"F": value}))
		got := e.Float(v, 0)
		if err := e.Err(); err == nil || !strings.Contains(err.Error(), `F="`+value+`"`) || !strings.Contains(err.Error(), "finite") {
			t.Errorf("Float(%q) = %v, err %v; want an error naming F and asking for a finite number", value, got, err)
		}
		if math.IsNaN(got) || math.IsInf(got, 0) {
			t.Errorf("Float(%q) returned %v with its error, want a finite value", value, got)
		}
	}
	e := NewEnv(lookupFrom(map[string]string{"F": "1e300"}))
	if got := e.Float(v, 0); got != 1e300 || e.Err() != nil {
		t.Errorf("Float(1e300) = %v, err %v", got, e.Err())
	}
}

func TestEnvIsSetTellsChoicesFromDefaults(t *testing.T) {
	v := Var{Name: "NEW", Aliases: []string{"OLD"}, Default: "true"}
	for env, want := range map[string]bool{"": false, "NEW": true, "OLD": true} {
		m := map[string]string{}
		if env != "" {
			m[env] = "true"
		}
		if got := NewEnv(lookupFrom(m)).IsSet(v); got != want {
			t.Errorf("IsSet with %v = %v, want %v", m, got, want)
		}
	}
}

func TestEnvReportsAMalformedVariableOnce(t *testing.T) {
	e := NewEnv(lookupFrom(map[string]string{"B": "maybe"}))
	v := Var{Name: "B", Default: "false"}
	e.Bool(v)
	e.Bool(v)
	if err := e.Err(); err == nil || strings.Count(err.Error(), `B="maybe"`) != 1 {
		t.Fatalf("Err() = %v, want B reported once", err)
	}
}

func TestDeclaredVarsAreWellFormed(t *testing.T) {
	sections := map[string]bool{}
	for _, s := range Sections {
		sections[s] = true
	}
	seen, flags := map[string]bool{}, map[string]bool{}
	for _, v := range Vars {
		if v.Flag != "" {
			if flags[v.Flag] {
				t.Errorf("flag --%s declared twice", v.Flag)
			}
			flags[v.Flag] = true
		}
		for _, n := range append([]string{v.Name}, v.Aliases...) {
			if seen[n] {
				t.Errorf("%s declared twice", n)
			}
			seen[n] = true
		}
		if !sections[v.Section] {
			t.Errorf("%s: section %q is not in Sections", v.Name, v.Section)
		}
		if strings.TrimSpace(v.Doc) == "" {
			t.Errorf("%s has no documentation", v.Name)
		}
	}
}

func TestMarkdownListsEveryVariableWithItsDefault(t *testing.T) {
	md := Markdown(Vars)
	for _, v := range Vars {
		if !strings.Contains(md, "`"+v.Name+"`") {
			t.Errorf("reference lacks %s", v.Name)
		}
		for _, a := range v.Aliases {
			if !strings.Contains(md, "`"+a+"`") {
				t.Errorf("reference lacks alias %s of %s", a, v.Name)
			}
		}
	}
	if !strings.Contains(md, "| `AIBRIX_SYNC_MAX_CONTEXTS` |  | `1000` |") ||
		!strings.Contains(md, "| `KVGATE_POD_DISCOVERY` | `--discovery` | `kubernetes` |") {
		t.Errorf("reference does not show flags and defaults:\n%s", md)
	}
}

func TestEnvNeverPrintsASecretsValuesAndComparesThemExactly(t *testing.T) {
	v := Var{Name: "NEW_PASSWORD", Aliases: []string{"OLD_PASSWORD"}, Secret: true}
	e := NewEnv(lookupFrom(map[string]string{"NEW_PASSWORD": "hunter2", "OLD_PASSWORD": "correct-horse"}))
	if got := e.String(v); got != "hunter2" {
		t.Errorf("String = %q, want the value of NEW_PASSWORD", got)
	}
	err := e.Err()
	if err == nil || !strings.Contains(err.Error(), "NEW_PASSWORD and OLD_PASSWORD") {
		t.Fatalf("Err() = %v, want the disagreement named", err)
	}
	if strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "correct-horse") {
		t.Errorf("Err() = %v: prints a secret", err)
	}
	// Secrets differing only in case are different secrets.
	e = NewEnv(lookupFrom(map[string]string{"NEW_PASSWORD": "Secret", "OLD_PASSWORD": "secret"}))
	if e.String(v); e.Err() == nil {
		t.Error("two names set to secrets that differ in case: no error")
	}
}

func TestSecretsAreDeclaredSecret(t *testing.T) {
	for _, v := range []Var{RedisPassword, EngineAPIKey} {
		if !v.Secret {
			t.Errorf("%s is not declared Secret", v.Name)
		}
	}
}
