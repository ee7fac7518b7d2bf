package cache

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// MaxModelCardStringBytes bounds each string of a model card taken from a
// pod's /v1/models (root, parent, owned_by): a longer value is dropped, as
// if the engine had not listed it, and the card is kept.
const MaxModelCardStringBytes = 1 << 10

// ModelCard is what a pod's engine lists of one model it serves on GET
// /v1/models (vLLM's model card), within MaxModelCardStringBytes.
type ModelCard struct {
	// ID is the model's name, which requests give.
	ID string
	// Root is the model's path or Hugging Face name, an adapter's path;
	// "" when not listed.
	Root string
	// Parent is the base model an adapter applies to; "" for a base model,
	// or when not listed.
	Parent string
	// MaxModelLen is the model's context length in tokens; 0 when not
	// listed (vLLM lists none for adapters).
	MaxModelLen int
	// OwnedBy is the card's owner ("vllm"); "" when not listed.
	OwnedBy string
}

// listedCard is a card of a model list as decoded: the fields of other
// types than vLLM's are ignored rather than failing the list.
type listedCard struct {
	ID          string          `json:"id"`
	Parent      *string         `json:"parent"`
	Root        json.RawMessage `json:"root"`
	MaxModelLen json.RawMessage `json:"max_model_len"`
	OwnedBy     json.RawMessage `json:"owned_by"`
}

// cardsOfModelList returns the model cards a vLLM server lists in its
// answer to GET /v1/models, sorted by ID and without duplicates (the first
// of an ID is taken) nor nameless cards, and the LoRA adapters among them:
// the IDs of the cards that name a parent (the base model the adapter
// applies to), sorted. Cards without a parent are base models. Strings
// beyond MaxModelCardStringBytes are dropped. It fails when body is not a
// JSON object with a "data" list of cards.
func cardsOfModelList(body []byte) (cards []ModelCard, adapters []string, err error) {
	var list struct {
		Data *[]listedCard `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, nil, fmt.Errorf("decode model list: %w", err)
	}
	if list.Data == nil {
		return nil, nil, errors.New(`decode model list: no "data" list of models`)
	}
	for _, c := range *list.Data {
		if c.ID == "" {
			continue
		}
		card := ModelCard{ID: c.ID, Root: cardString(c.Root), MaxModelLen: cardLength(c.MaxModelLen), OwnedBy: cardString(c.OwnedBy)}
		if c.Parent != nil && *c.Parent != "" {
			adapters = append(adapters, c.ID)
			if len(*c.Parent) <= MaxModelCardStringBytes {
				card.Parent = *c.Parent
			}
		}
		cards = append(cards, card)
	}
	slices.SortStableFunc(cards, func(a, b ModelCard) int { return strings.Compare(a.ID, b.ID) })
	cards = slices.CompactFunc(cards, func(a, b ModelCard) bool { return a.ID == b.ID })
	slices.Sort(adapters)
	return cards, slices.Compact(adapters), nil
}

// cardString returns the JSON string raw holds when it is one of at most
// MaxModelCardStringBytes, "" otherwise.
func cardString(raw json.RawMessage) string {
	if len(raw) == 0 || raw[0] != '"' || len(raw) > 6*MaxModelCardStringBytes+2 {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) != nil || len(s) > MaxModelCardStringBytes {
		return ""
	}
	return s
}

// cardLength returns the positive integer raw holds, 0 for anything else.
func cardLength(raw json.RawMessage) int {
	n, err := strconv.ParseInt(string(bytes.TrimSpace(raw)), 10, 0)
	if err != nil || n <= 0 {
		return 0
	}
	return int(n)
}

// podCards returns the cards of listed the pod serves: the one of its base
// model, then those of adapters, which the caller bounded; listed and
// adapters are sorted. Other base models the engine lists (more served
// names) are left out, as the pod is routed to for its base model alone.
func podCards(listed []ModelCard, model string, adapters []string) []ModelCard {
	out := make([]ModelCard, 0, len(adapters)+1)
	for _, c := range listed {
		if c.ID == model {
			out = append(out, c)
		} else if _, ok := slices.BinarySearch(adapters, c.ID); ok {
			out = append(out, c)
		}
	}
	return out
}

// card returns the card the pod's engine listed for model, if any.
func (st *podState) card(model string) (ModelCard, bool) {
	p := st.cards.Load()
	if p == nil {
		return ModelCard{}, false
	}
	i, ok := slices.BinarySearchFunc(*p, model, func(c ModelCard, id string) int { return strings.Compare(c.ID, id) })
	if !ok {
		return ModelCard{}, false
	}
	return (*p)[i], true
}

// setCards records the cards the pod's engine lists, sorted by ID.
func (st *podState) setCards(cards []ModelCard) {
	if p := st.cards.Load(); p != nil && slices.Equal(*p, cards) {
		return
	}
	st.cards.Store(&cards)
}

// ModelCard returns the card of a model served by at least one ready pod
// (see ListPodsByModel), and false when none is. Its fields come from the
// card the engine of the first of those pods to list one lists (by
// namespace and name), but for MaxModelLen, the smallest any of them lists:
// a request may be routed to any of them, and fits all only within the
// smallest. When no engine lists a card for the model (not read yet, or
// adapter listing disabled), only ID is set and, for a model that is an
// adapter on the first pod, Parent: that pod's base model, as it is when
// the card lists none.
func (s *Store) ModelCard(model string) (ModelCard, bool) {
	states, eps := s.reg.routableStates(model)
	if len(eps) == 0 {
		return ModelCard{ID: model}, false
	}
	card, from := ModelCard{ID: model}, 0
	listed := false
	for i, st := range states {
		c, ok := st.card(model)
		if !ok {
			continue
		}
		if !listed {
			listed, from = true, i
			card.Root, card.Parent, card.OwnedBy = c.Root, c.Parent, c.OwnedBy
		}
		if c.MaxModelLen > 0 && (card.MaxModelLen == 0 || c.MaxModelLen < card.MaxModelLen) {
			card.MaxModelLen = c.MaxModelLen
		}
	}
	if base := eps[from].Model; card.Parent == "" && base != "" && base != model {
		card.Parent = base
	}
	return card, true
}
