package hf

// byteLevelChars maps each byte to the character GPT-2's byte-level
// alphabet spells it with: printable Latin-1 bytes stand for themselves,
// the others are shifted to U+0100 and beyond, so that every byte string
// is a printable string. Byte-level vocabularies and merges are written in
// this alphabet.
var byteLevelChars = func() (chars [256]rune) {
	n := rune(0)
	for b := range 256 {
		if b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE {
			chars[b] = rune(b)
			continue
		}
		chars[b] = 256 + n
		n++
	}
	return chars
}()

// byteLevelBytes inverts byteLevelChars.
var byteLevelBytes = func() map[rune]byte {
	m := make(map[rune]byte, 256)
	for b, r := range byteLevelChars {
		m[r] = byte(b)
	}
	return m
}()

// fromByteLevel returns the bytes a byte-level string spells, false when it
// holds a character outside the alphabet.
func fromByteLevel(s string) (string, bool) {
	out := make([]byte, 0, len(s))
	for _, r := range s {
		b, ok := byteLevelBytes[r]
		if !ok {
			return "", false
		}
		out = append(out, b)
	}
	return string(out), true
}
