package simserver

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"unicode"

	"github.com/kvgate/kvgate/pkg/internal/jsonscan"
)

// laxInt is an integer member of a request, read as vLLM's request
// validation (pydantic's lax mode) reads one: see jsonscan.LaxInt. An
// integer beyond int's range reads as the nearest int, and beyond records
// that it was. A value that reads as no integer is kept as err, for check
// to report under the member's name; a later copy of the member replaces
// it, as the last of a repeated name wins in vLLM.
type laxInt struct {
	n         int
	set, null bool
	beyond    bool
	err       error
}

// UnmarshalJSON reads value as jsonscan.LaxInt does. It never fails: a
// value that reads as no integer is kept for check.
func (v *laxInt) UnmarshalJSON(value []byte) error {
	n, null, err := jsonscan.LaxInt(value)
	*v = laxInt{n: n, set: true, null: null, err: err}
	if err == nil && !null && (n == math.MaxInt || n == math.MinInt) {
		v.beyond = !withinInt(value)
	}
	return nil
}

// check fails, naming the member, for a value vLLM refuses: one that
// reads as no integer, or null unless nullable.
func (v *laxInt) check(name string, nullable bool) error {
	return checkMember(name, v.err, v.null && !nullable, "an integer")
}

// or returns the value given, def when the member is absent or null.
func (v *laxInt) or(def int) int {
	if !v.set || v.null {
		return def
	}
	return v.n
}

// given reports whether the member holds a value (it is neither absent nor
// null).
func (v *laxInt) given() bool { return v.set && !v.null }

// withinInt reports whether value, which jsonscan.LaxInt read as one of
// int's bounds, holds exactly that bound rather than an integer beyond it.
// LaxInt accepted it, so it is a JSON integer or a string holding one,
// perhaps padded with white space, signed with +, with underscores between
// its digits or a fraction of zeros.
func withinInt(value []byte) bool {
	s := string(value)
	if value[0] == '"' {
		var err error
		if s, err = jsonscan.String(value); err != nil {
			return false
		}
		s = strings.ReplaceAll(strings.TrimFunc(s, unicode.IsSpace), "_", "")
		if i := strings.IndexByte(s, '.'); i >= 0 {
			s = s[:i]
		}
	}
	_, err := strconv.ParseInt(s, 10, strconv.IntSize)
	return err == nil
}

// laxBool is a boolean member of a request, read as vLLM's request
// validation reads one: see jsonscan.LaxBool. It keeps a value that reads
// as no boolean as laxInt does.
type laxBool struct {
	v, set, null bool
	err          error
}

// UnmarshalJSON reads value as jsonscan.LaxBool does. It never fails: a
// value that reads as no boolean is kept for check.
func (b *laxBool) UnmarshalJSON(value []byte) error {
	v, null, err := jsonscan.LaxBool(value)
	*b = laxBool{v: v, set: true, null: null, err: err}
	return nil
}

// check fails, naming the member, for a value vLLM refuses: one that
// reads as no boolean, or null unless nullable.
func (b *laxBool) check(name string, nullable bool) error {
	return checkMember(name, b.err, b.null && !nullable, "a boolean")
}

// or returns the value given, def when the member is absent or null.
func (b *laxBool) or(def bool) bool {
	if !b.set || b.null {
		return def
	}
	return b.v
}

func checkMember(name string, err error, null bool, want string) error {
	var je *jsonscan.Error
	switch {
	case errors.As(err, &je):
		return badRequestf("%s: %s", name, je.Msg)
	case err != nil:
		return badRequestf("%s: want %s: %v", name, want, err)
	case null:
		return badRequestf("%s: want %s, not null", name, want)
	}
	return nil
}

// checkAll returns the first error of errs, nil when there is none.
func checkAll(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
