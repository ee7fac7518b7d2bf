// Package config reads kvgate's settings from environment variables at the
// edge of the program and hands typed values to the packages that use them.
//
// Every variable the gateway reads is declared once, as a Var in Vars, with
// its default and a sentence of documentation; the configuration reference in
// README.md is generated from those declarations and a test keeps the two
// equal. Values are
// read only through an Env, which records every malformed value so that a
// misconfigured gateway fails at start with one error listing all of them.
package config

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Var declares one environment variable.
type Var struct {
	// Name is the variable's name, e.g. AIBRIX_SYNC_MAX_CONTEXTS.
	Name string
	// Aliases are other names of the variable (AIBrix's older ones), read
	// when Name is unset, in order. Setting two of the names to different
	// values is an error.
	Aliases []string
	// Default is the value used when neither Name nor an alias is set, in
	// the variable's own syntax ("" means empty).
	Default string
	// Doc says what the variable controls, in one or two sentences.
	Doc string
	// Section groups the variable in the configuration reference.
	Section string
	// Flag is the name, without dashes, of the gateway's command-line flag
	// that overrides the variable; "" when it has none.
	Flag string
	// Secret marks a password or key: its values are never put in errors,
	// and its names must agree exactly, case included.
	Secret bool
}

// LookupFunc reports the value of an environment variable and whether it is
// set; os.LookupEnv is one.
type LookupFunc func(name string) (string, bool)

// Env reads declared variables from a LookupFunc and collects the errors of
// malformed values. The zero value is not usable; call NewEnv.
type Env struct {
	lookup LookupFunc
	errs   []error
}

// NewEnv returns an Env reading from lookup.
func NewEnv(lookup LookupFunc) *Env {
	return &Env{lookup: lookup}
}

// Err returns every error recorded so far joined into one, or nil.
func (e *Env) Err() error {
	return errors.Join(e.errs...)
}

// Errorf records a validation error found by the caller, for example a
// combination of settings that cannot work together.
func (e *Env) Errorf(format string, args ...any) {
	e.record(fmt.Errorf(format, args...))
}

// raw returns the value of v, the name it was read from, and whether it was
// set at all. Surrounding white space is ignored. When several names of v
// are set, the first in declaration order is read, and an error is recorded
// unless they all agree (ignoring case, but for a Secret; a Secret's error
// names the variables, never their values).
func (e *Env) raw(v Var) (value, name string, set bool) {
	value, name = v.Default, v.Name
	for _, n := range append([]string{v.Name}, v.Aliases...) {
		s, ok := e.lookup(n)
		if !ok {
			continue
		}
		s = strings.TrimSpace(s)
		switch {
		case !set:
			value, name, set = s, n, true
		case v.Secret && s != value:
			e.record(fmt.Errorf("%s and %s set the same secret to different values: set only one of them", name, n))
		case !v.Secret && !strings.EqualFold(s, value):
			e.record(fmt.Errorf("%s=%q and %s=%q set the same setting to different values: set only one of them", name, value, n, s))
		}
	}
	return value, name, set
}

func (e *Env) fail(name, value, want string) {
	e.record(fmt.Errorf("%s=%q: want %s", name, value, want))
}

// record adds err unless an error with the same message was recorded
// already, as when two settings read the same malformed variable.
func (e *Env) record(err error) {
	for _, old := range e.errs {
		if old.Error() == err.Error() {
			return
		}
	}
	e.errs = append(e.errs, err)
}

// IsSet reports whether v or one of its aliases is set, so that a caller
// can tell a value chosen by the operator from a default.
func (e *Env) IsSet(v Var) bool {
	_, _, set := e.raw(v)
	return set
}

// String returns the value of v, or its default.
func (e *Env) String(v Var) string {
	s, _, _ := e.raw(v)
	return s
}

// Bool returns the value of v parsed by strconv.ParseBool.
func (e *Env) Bool(v Var) bool {
	s, name, _ := e.raw(v)
	b, err := strconv.ParseBool(s)
	if err != nil {
		e.fail(name, s, "true or false")
	}
	return b
}

// Int returns the value of v, which must be an integer of at least min.
func (e *Env) Int(v Var, min int) int {
	s, name, _ := e.raw(v)
	n, err := strconv.Atoi(s)
	if err != nil || n < min {
		e.fail(name, s, fmt.Sprintf("an integer >= %d", min))
		return max(n, min)
	}
	return n
}

// Float returns the value of v, which must be a finite number of at least
// min: NaN, infinities and values beyond the range of a float64 are
// refused, and min is returned in their place.
func (e *Env) Float(v Var, min float64) float64 {
	s, name, _ := e.raw(v)
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < min {
		e.fail(name, s, fmt.Sprintf("a finite number >= %g", min))
		return min
	}
	return f
}

// Duration returns the value of v as a positive duration. A bare integer is
// read in unit (AIBrix variables carry their unit in their name, e.g. _MS or
// _SECONDS); a value with a unit suffix ("1.5s", "200ms") is read as such.
func (e *Env) Duration(v Var, unit time.Duration) time.Duration {
	return e.duration(v, unit, false)
}

// DurationOrZero is Duration for settings that zero turns off: it also
// accepts 0.
func (e *Env) DurationOrZero(v Var, unit time.Duration) time.Duration {
	return e.duration(v, unit, true)
}

func (e *Env) duration(v Var, unit time.Duration, zeroOK bool) time.Duration {
	s, name, _ := e.raw(v)
	if n, err := strconv.ParseInt(s, 10, 64); err == nil && (n > 0 || (n == 0 && zeroOK)) {
		if n > math.MaxInt64/int64(unit) {
			e.fail(name, s, fmt.Sprintf("at most %d %s (%v)", math.MaxInt64/int64(unit), unitName(unit), time.Duration(math.MaxInt64).Truncate(unit)))
			return 0
		}
		return time.Duration(n) * unit
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 || (d == 0 && !zeroOK) {
		want := "a positive duration"
		if zeroOK {
			want = "a duration of 0 or more"
		}
		e.fail(name, s, want+" (an integer in "+unitName(unit)+", or e.g. \"1.5s\")")
		return 0
	}
	return d
}

func unitName(unit time.Duration) string {
	switch unit {
	case time.Millisecond:
		return "milliseconds"
	case time.Second:
		return "seconds"
	case time.Minute:
		return "minutes"
	}
	return unit.String() + " units"
}
