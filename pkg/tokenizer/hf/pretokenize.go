package hf

import (
	"unicode"
	"unicode/utf8"
)

// splitFunc returns the end of the piece that starts at s[i:], i < len(s).
// Each is a hand-written equivalent of one of the regular expressions
// tokenizer.json files split text with, which use look-ahead that Go's
// regexp package lacks. Letters are Unicode category L, numbers N, and
// white space Unicode's White_Space property, as Oniguruma (the regex
// engine of Hugging Face's tokenizers) reads \p{L}, \p{N} and \s.
type splitFunc func(s string, i int) int

// Patterns with a hand-written splitter, as they appear in tokenizer.json.
const (
	// patternQwen2 splits Qwen2, Qwen2.5 and Qwen3 text: numbers one digit
	// a piece.
	patternQwen2 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// patternLlama3 splits Llama 3 (and cl100k-style) text: numbers up to
	// three digits a piece.
	patternLlama3 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// patternGPT2 is GPT-2's, also the one ByteLevel applies with
	// use_regex.
	patternGPT2 = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
)

// splitters maps each supported pattern to its splitter.
var splitters = map[string]splitFunc{
	patternQwen2:  func(s string, i int) int { return splitCL100K(s, i, 1) },
	patternLlama3: func(s string, i int) int { return splitCL100K(s, i, 3) },
	patternGPT2:   splitGPT2,
}

// class is what the patterns tell characters apart by.
type class uint8

const (
	classOther class = iota // punctuation, symbols, controls, ...
	classLetter
	classNumber
	classSpace   // white space other than \r and \n
	classNewline // \r or \n
)

// asciiClass classifies the ASCII bytes.
var asciiClass = func() (c [utf8.RuneSelf]class) {
	for b := range utf8.RuneSelf {
		switch {
		case b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z':
			c[b] = classLetter
		case b >= '0' && b <= '9':
			c[b] = classNumber
		case b == '\r' || b == '\n':
			c[b] = classNewline
		case b == ' ' || b >= '\t' && b <= '\f':
			c[b] = classSpace
		}
	}
	return c
}()

// classAt returns the class of the character at s[i:] and its length.
func classAt(s string, i int) (class, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return asciiClass[c], 1
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	switch {
	case unicode.IsLetter(r):
		return classLetter, n
	case unicode.IsNumber(r):
		return classNumber, n
	case unicode.Is(unicode.White_Space, r):
		return classSpace, n
	}
	return classOther, n
}

func isSpace(c class) bool { return c == classSpace || c == classNewline }

// contraction returns the length of the contraction ('s, 't, 're, 've,
// 'm, 'll, 'd) at s[i:], 0 when there is none; foldCase matches letters of
// either case, as (?i:...) does, U+017F (long s) included.
func contraction(s string, i int, foldCase bool) int {
	if s[i] != '\'' || i+1 >= len(s) {
		return 0
	}
	lower := func(c byte) byte {
		if foldCase && c >= 'A' && c <= 'Z' {
			return c + 'a' - 'A'
		}
		return c
	}
	c := lower(s[i+1])
	switch c {
	case 's', 't', 'm', 'd':
		return 2
	case 'r', 'v', 'l':
		if i+2 < len(s) {
			want := byte('e')
			if c == 'l' {
				want = 'l'
			}
			if lower(s[i+2]) == want {
				return 3
			}
		}
	}
	if foldCase && len(s) >= i+3 && s[i+1:i+3] == "\u017f" {
		return 3
	}
	return 0
}

// runOf returns the end of the run of characters of class want from i.
func runOf(s string, i int, want class) int {
	for i < len(s) {
		c, n := classAt(s, i)
		if c != want {
			break
		}
		i += n
	}
	return i
}

// spaceRun returns the end of the white space from i and the start of its
// last character.
func spaceRun(s string, i int) (end, last int) {
	end, last = i, i
	for end < len(s) {
		c, n := classAt(s, end)
		if !isSpace(c) {
			break
		}
		last = end
		end += n
	}
	return end, last
}

// splitCL100K implements patternQwen2 (maxDigits 1) and patternLlama3
// (maxDigits 3), trying the alternatives in order as a regex engine does.
func splitCL100K(s string, i, maxDigits int) int {
	// The commonest piece by far, a space and ASCII letters, read at once:
	// [^\r\n\p{L}\p{N}]?\p{L}+ stops at the first character that is not a
	// letter.
	if s[i] == ' ' && i+1 < len(s) && asciiClass[s[i+1]&0x7f] == classLetter && s[i+1] < utf8.RuneSelf {
		j := i + 2
		for j < len(s) && s[j] < utf8.RuneSelf && asciiClass[s[j]] == classLetter {
			j++
		}
		if j < len(s) && s[j] >= utf8.RuneSelf {
			return runOf(s, j, classLetter)
		}
		return j
	}
	if n := contraction(s, i, true); n > 0 {
		return i + n
	}
	c, n := classAt(s, i)
	switch c {
	case classLetter: // [^\r\n\p{L}\p{N}]?\p{L}+ without the optional character
		return runOf(s, i+n, classLetter)
	case classNumber: // \p{N}{1,maxDigits}
		end := i + n
		for d := 1; d < maxDigits && end < len(s); d++ {
			c, m := classAt(s, end)
			if c != classNumber {
				break
			}
			end += m
		}
		return end
	case classOther, classSpace:
		// [^\r\n\p{L}\p{N}]?\p{L}+ with the optional character.
		if i+n < len(s) {
			if next, m := classAt(s, i+n); next == classLetter {
				return runOf(s, i+n+m, classLetter)
			}
		}
	}
	// ' ?[^\s\p{L}\p{N}]+[\r\n]*'
	j := i
	if s[j] == ' ' {
		j++
	}
	if end := runOf(s, j, classOther); end > j {
		return runOf(s, end, classNewline)
	}
	// \s*[\r\n]+, \s+(?!\S), \s+
	end, last := spaceRun(s, i)
	for k := end; k > i; {
		r, m := utf8.DecodeLastRuneInString(s[:k])
		if r == '\r' || r == '\n' {
			return k
		}
		k -= m
	}
	if end == len(s) || last == i {
		return end
	}
	return last
}

// splitGPT2 implements patternGPT2.
func splitGPT2(s string, i int) int {
	if n := contraction(s, i, false); n > 0 {
		return i + n
	}
	j := i
	if s[j] == ' ' && j+1 < len(s) {
		j++
	}
	c, n := classAt(s, j)
	switch c {
	case classLetter, classNumber: // ' ?\p{L}+', ' ?\p{N}+'
		return runOf(s, j+n, c)
	case classOther: // ' ?[^\s\p{L}\p{N}]+'
		return runOf(s, j+n, classOther)
	}
	// \s+(?!\S), \s+
	end, last := spaceRun(s, i)
	if end == len(s) || last == i {
		return end
	}
	return last
}
