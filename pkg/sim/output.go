package sim

// outputWords is the vocabulary the simulated model generates from: short
// words (one piece each, with their leading space) and two punctuation
// marks. Generated text therefore tokenizes back to exactly the generated
// ids, so a conversation that quotes a previous answer shares its tokens.
var outputWords = []string{
	" the", " a", " cache", " block", " token", " prefix", " request", " engine",
	" model", " memory", " page", " batch", " queue", " route", " gateway", " pod",
	" is", " was", " will", " can", " may", " must", " should", " would",
	" of", " to", " in", " on", " for", " with", " from", " by",
	" and", " or", " but", " so", " then", " when", " while", " because",
	" fast", " slow", " warm", " cold", " full", " empty", " shared", " local",
	" first", " last", " next", " every", " each", " some", " many", " few",
	" keeps", " stores", " evicts", " reuses", " serves", " sends", " reads", " writes",
	" time", " step", " decode", " prefill", " latency", " load", " hit", " miss",
	" here", " there", " now", " again", " still", " only", " also", " never",
	".", ",",
}

// outputIDs holds the id of each output word; outputText maps those ids and
// the special tokens to their text ("" for special tokens, which vLLM skips
// when it detokenizes).
var outputIDs, outputText = buildOutputVocab()

func buildOutputVocab() ([]uint32, map[uint32]string) {
	ids := make([]uint32, len(outputWords))
	text := make(map[uint32]string, len(outputWords)+len(specialTokens))
	for _, s := range specialTokens {
		text[s.id] = ""
	}
	for i, w := range outputWords {
		ids[i] = pieceID(w)
		text[ids[i]] = w
	}
	return ids, text
}

// generationKey keys the tokens an engine with output seed outputSeed
// generates for a request with prompt and seed.
func generationKey(outputSeed uint64, prompt []uint32, seed uint64) uint64 {
	return splitmix64(outputSeed^fnv64(prompt)) + splitmix64(seed)
}

// GeneratedTokens returns the first n tokens an engine whose
// EngineConfig.OutputSeed is outputSeed generates for a request with prompt
// and RequestSpec.Seed seed and MaxTokens of at least n (which ignores
// EOS). Every engine with that output seed generates them, so a client can
// know a conversation's answers before it runs, as a chat workload that
// carries each answer into the next turn needs.
func GeneratedTokens(outputSeed uint64, prompt []uint32, seed uint64, n int) []uint32 {
	key := generationKey(outputSeed, prompt, seed)
	out := make([]uint32, n)
	for i := range out {
		out[i] = outputToken(key, i)
	}
	return out
}

// outputToken returns the i-th token (from 0) the simulated model generates
// for a request whose generation is keyed by key: a fixed pseudo-random
// choice from the output vocabulary.
func outputToken(key uint64, i int) uint32 {
	x := splitmix64(key + uint64(i)*0x9e3779b97f4a7c15)
	return outputIDs[x%uint64(len(outputIDs))]
}

// splitmix64 is the finaliser of the SplitMix64 generator: a cheap, well
// mixed bijection of 64-bit values.
func splitmix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// fnv64 hashes tokens with 64-bit FNV-1a over their little-endian bytes.
func fnv64(tokens []uint32) uint64 {
	h := uint64(14695981039346656037)
	for _, t := range tokens {
		for range 4 {
			h ^= uint64(t & 0xff)
			h *= 1099511628211
			t >>= 8
		}
	}
	return h
}
