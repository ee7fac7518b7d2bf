package indexer

import (
	"testing"
)

func TestBlockKeysDependOnEveryInput(t *testing.T) {
	k := newKeyer(7)
	blockKey := k.block
	base := blockKey(42, []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9}, 0)
	for _, tc := range []struct {
		name string
		key  uint64
	}{
		{"parent", blockKey(43, []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9}, 0)},
		{"swapped tokens", blockKey(42, []uint32{2, 1, 3, 4, 5, 6, 7, 8, 9}, 0)},
		{"last token", blockKey(42, []uint32{1, 2, 3, 4, 5, 6, 7, 8, 10}, 0)},
		{"one token fewer", blockKey(42, []uint32{1, 2, 3, 4, 5, 6, 7, 8}, 0)},
		{"extra keys", blockKey(42, []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9}, 1)},
		{"secret", func() uint64 { k := newKeyer(8); return k.block(42, []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9}, 0) }()},
	} {
		if tc.key == base {
			t.Errorf("changing the %s kept the key", tc.name)
		}
		if tc.key == 0 {
			t.Errorf("changing the %s gave key 0", tc.name)
		}
	}
}

func TestRootKeysSeparateModelsAndAdapters(t *testing.T) {
	seen := map[uint64]string{}
	for _, tc := range []struct {
		name, model, lora string
	}{
		{"base", "llama", ""},
		{"other model", "mistral", ""},
		{"adapter", "llama", "sql"},
		{"adapter named like a number", "llama", "3"},
		{"model and adapter concatenations differ", "llamasql", ""},
	} {
		kr := newKeyer(99)
		k := kr.root(tc.model, tc.lora)
		if prev, ok := seen[k]; ok {
			t.Errorf("%s has the root of %s", tc.name, prev)
		}
		seen[k] = tc.name
	}
	k1, k2 := newKeyer(1), newKeyer(2)
	if k1.root("llama", "") == k2.root("llama", "") {
		t.Error("the seed does not change roots")
	}
}

func TestExtraDigest(t *testing.T) {
	img := msgpackExtras("", "img-1")
	for _, tc := range []struct {
		name string
		raw  []byte
		lora string
		zero bool
	}{
		{"no extras", nil, "", true},
		{"msgpack nil", []byte{0xc0}, "", true},
		{"empty array", []byte{0x90}, "", true},
		{"only the adapter name", msgpackExtras("sql", ""), "sql", true},
		{"a name that is not the adapter", msgpackExtras("salt", ""), "sql", false},
		{"an image", img, "", false},
		{"adapter and image", msgpackExtras("sql", "img-1"), "sql", false},
		{"truncated string header", []byte{0x91, 0xd9}, "sql", false},
		{"not an array", []byte{0xa3, 'a', 'b', 'c'}, "", false},
	} {
		if got := extraDigest(tc.raw, tc.lora); (got == 0) != tc.zero {
			t.Errorf("%s: digest %x, want zero=%v", tc.name, got, tc.zero)
		}
	}
	if extraDigest(msgpackExtras("sql", "img-1"), "sql") != extraDigest(img, "") {
		t.Error("an adapter's image block digests differently from the same image without the adapter name")
	}
	if extraDigest(img, "") == extraDigest(msgpackExtras("", "img-2"), "") {
		t.Error("two images digest alike")
	}
}

// FuzzExtraDigest checks that any bytes digest without panicking, and to 0
// only when they carry nothing beyond the adapter name.
func FuzzExtraDigest(f *testing.F) {
	f.Add(msgpackExtras("sql", "img-1"), "sql")
	f.Add([]byte{0xdc, 0x00, 0x01, 0xdb, 0xff, 0xff, 0xff, 0xff}, "x")
	f.Add([]byte{0x91, 0xa3, 's', 'q', 'l'}, "sql")
	f.Fuzz(func(t *testing.T, raw []byte, lora string) {
		if extraDigest(raw, lora) != 0 {
			return
		}
		if len(raw) == 0 || raw[0] == 0xc0 {
			return
		}
		count, rest, ok := msgpackArrayHeader(raw)
		if !ok {
			t.Fatalf("malformed %x digested to 0", raw)
		}
		if count == 0 {
			return
		}
		s, _, ok := msgpackString(rest)
		if count != 1 || !ok || string(s) != lora || lora == "" {
			t.Fatalf("%x with adapter %q digested to 0", raw, lora)
		}
	})
}
