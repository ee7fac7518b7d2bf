package sim

import (
	"slices"
	"strings"
	"testing"
)

func piecesIDs(pieces ...string) []uint32 {
	ids := make([]uint32, len(pieces))
	for i, p := range pieces {
		if id, n := matchSpecial(p); n == len(p) {
			ids[i] = id
			continue
		}
		ids[i] = pieceID(p)
	}
	return ids
}

func TestEncodeCutsTextIntoDocumentedPieces(t *testing.T) {
	for _, tc := range []struct {
		name   string
		text   string
		pieces []string
	}{
		{"words keep their leading space", "Hello, world", []string{"Hello", ",", " world"}},
		{"long words split every 8 letters", "internationalization", []string{"internat", "ionaliza", "tion"}},
		{"extra spaces stand alone", "a  b", []string{"a", " ", " b"}},
		{"newlines stand alone", "x\n y", []string{"x", "\n", " y"}},
		{"digits are single pieces", " 2026", []string{" 2", "0", "2", "6"}},
		{"non-ASCII letters form words", "héllo wörld", []string{"héllo", " wörld"}},
		{"special tokens anywhere", "hi <|im_end|>\n", []string{"hi", " ", "<|im_end|>", "\n"}},
		{"a bare angle bracket is punctuation", "a <b", []string{"a", " <", "b"}},
		{"trailing space", "end ", []string{"end", " "}},
		{"empty text", "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Tokenizer{}.Encode(tc.text, false)
			if want := piecesIDs(tc.pieces...); !slices.Equal(got, want) {
				t.Errorf("Encode(%q) = %v, want %v (%q)", tc.text, got, want, tc.pieces)
			}
		})
	}
}

func TestEncodeAddsBOSOnlyWhenAsked(t *testing.T) {
	with := Tokenizer{}.Encode("hello", true)
	without := Tokenizer{}.Encode("hello", false)
	if !slices.Equal(with, append([]uint32{BOSID}, without...)) {
		t.Errorf("with special tokens %v, without %v: want BOS prepended", with, without)
	}
}

func TestPieceIDsStayInTheOrdinaryVocabulary(t *testing.T) {
	for _, id := range (Tokenizer{}).Encode(strings.Repeat("The quick brown fox; 42 jumps! ", 50), false) {
		if id < FirstPieceID || id >= VocabSize {
			t.Fatalf("piece id %d outside [%d, %d)", id, FirstPieceID, VocabSize)
		}
	}
}

func TestOutputVocabularyRoundTrips(t *testing.T) {
	seen := map[uint32]string{}
	for i, w := range outputWords {
		ids := Tokenizer{}.Encode(w, false)
		if len(ids) != 1 || ids[0] != outputIDs[i] {
			t.Errorf("output word %q encodes to %v, want the single piece %d", w, ids, outputIDs[i])
		}
		if prev, dup := seen[outputIDs[i]]; dup {
			t.Errorf("output words %q and %q share id %d", prev, w, outputIDs[i])
		}
		seen[outputIDs[i]] = w
	}
	gen := make([]uint32, 200)
	for i := range gen {
		gen[i] = outputToken(12345, i)
	}
	text := Tokenizer{}.Decode(append(gen, EOSID))
	if back := (Tokenizer{}).Encode(text, false); !slices.Equal(back, gen) {
		t.Errorf("generated text %q re-encodes to other ids", text)
	}
}

func TestRenderChatUsesTheChatMLTemplate(t *testing.T) {
	msgs := []ChatMessage{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hi"}}
	want := "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
	if got := RenderChat(msgs, true); got != want {
		t.Errorf("RenderChat = %q, want %q", got, want)
	}
	if got := RenderChat(msgs, false); got != strings.TrimSuffix(want, "<|im_start|>assistant\n") {
		t.Errorf("without generation prompt: %q", got)
	}
	ids := Tokenizer{}.EncodeChat(msgs, true)
	prompt := piecesIDs("<|im_start|>", "assistan", "t", "\n")
	if ids[0] != IMStartID || !slices.Equal(ids[len(ids)-len(prompt):], prompt) {
		t.Errorf("chat ids %v: want <|im_start|> first and the generation prompt %v last", ids, prompt)
	}
}

// benchText is English-like text of about 4 KiB.
var benchText = strings.Repeat("KV-cache aware routing sends each request to the engine that "+
	"already holds the longest prefix of its prompt, without overloading anyone. ", 28)

func BenchmarkTokenizerEncode(b *testing.B) {
	b.SetBytes(int64(len(benchText)))
	b.ReportAllocs()
	for b.Loop() {
		Tokenizer{}.Encode(benchText, true)
	}
}

func BenchmarkTokenizerEncodeChat(b *testing.B) {
	msgs := []ChatMessage{
		{Role: "system", Content: benchText[:1024]},
		{Role: "user", Content: benchText[1024:]},
	}
	b.ReportAllocs()
	for b.Loop() {
		Tokenizer{}.EncodeChat(msgs, true)
	}
}

func TestTextEncodesBackToEveryOrdinaryID(t *testing.T) {
	ids := make([]uint32, 0, VocabSize-FirstPieceID)
	for id := FirstPieceID; id < VocabSize; id++ {
		ids = append(ids, id)
	}
	text, err := Tokenizer{}.Text(ids)
	if err != nil {
		t.Fatal(err)
	}
	if got := (Tokenizer{}).Encode(text, false); !slices.Equal(got, ids) {
		t.Fatal("Encode(Text(ids)) differs from ids")
	}
	for _, w := range strings.Fields(text) {
		if len(w) > 4 || strings.Trim(w, "abcdefghijklmnopqrstuvwxyz") != "" {
			t.Fatalf("word %q is not one to four lower-case letters", w)
		}
	}
}

func TestTextKeepsItsIDsInsideAChat(t *testing.T) {
	system, user := []uint32{300, 301, 31999}, []uint32{256, 256, 4000}
	st, err := Tokenizer{}.Text(system)
	if err != nil {
		t.Fatal(err)
	}
	ut, err := Tokenizer{}.Text(user)
	if err != nil {
		t.Fatal(err)
	}
	got := Tokenizer{}.EncodeChat([]ChatMessage{{Role: "system", Content: st}, {Role: "user", Content: ut}}, false)
	want := slices.Concat(piecesIDs("<|im_start|>", "system", "\n"), system, piecesIDs("<|im_end|>", "\n", "<|im_start|>", "user", "\n"),
		user, piecesIDs("<|im_end|>", "\n"))
	if !slices.Equal(got, want) {
		t.Errorf("chat of Text contents = %v, want %v", got, want)
	}
}

func TestTextRefusesIDsOutsideTheOrdinaryVocabulary(t *testing.T) {
	for _, id := range []uint32{EOSID, FirstPieceID - 1, VocabSize} {
		if _, err := (Tokenizer{}).Text([]uint32{300, id}); err == nil || !strings.Contains(err.Error(), "not an ordinary piece") {
			t.Errorf("Text with id %d: err %v, want it refused", id, err)
		}
	}
}

func BenchmarkText(b *testing.B) {
	ids := Tokenizer{}.Encode(strings.Repeat("The quick brown fox jumps over the lazy dog. ", 200), false)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := (Tokenizer{}).Text(ids); err != nil {
			b.Fatal(err)
		}
	}
}
