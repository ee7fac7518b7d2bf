package gateway

import (
	"crypto/rand"
	"encoding/hex"

	"github.com/kvgate/kvgate/pkg/cache"
)

// modelList is the answer of GET /v1/models, vLLM's ModelList.
type modelList struct {
	Object string      `json:"object"`
	Data   []modelCard `json:"data"`
}

// modelCard is a model of GET /v1/models in vLLM's shape (ModelCard).
type modelCard struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	// Root is the model's path or Hugging Face name, an adapter's path.
	Root string `json:"root"`
	// Parent is an adapter's base model, null for a base model.
	Parent *string `json:"parent"`
	// MaxModelLen is the context length, null when unknown (adapters).
	MaxModelLen *int              `json:"max_model_len"`
	Permission  []modelPermission `json:"permission"`
}

// modelPermission is the permission vLLM lists with every card, the same
// for all but its id.
type modelPermission struct {
	ID                 string  `json:"id"`
	Object             string  `json:"object"`
	Created            int64   `json:"created"`
	AllowCreateEngine  bool    `json:"allow_create_engine"`
	AllowSampling      bool    `json:"allow_sampling"`
	AllowLogprobs      bool    `json:"allow_logprobs"`
	AllowSearchIndices bool    `json:"allow_search_indices"`
	AllowView          bool    `json:"allow_view"`
	AllowFineTuning    bool    `json:"allow_fine_tuning"`
	Organization       string  `json:"organization"`
	Group              *string `json:"group"`
	IsBlocking         bool    `json:"is_blocking"`
}

// ownedByGateway is the owner of a card no engine listed.
const ownedByGateway = "kvgate"

// modelList lists the models served by at least one ready pod (see
// modelCards).
func (g *Gateway) modelList(b *backend) modelList { return modelCards(b.store, g.started.Unix()) }

// modelCards lists the models served by at least one ready pod, sorted,
// each with the card its pods' engines list (cache.Store.ModelCard): root,
// parent and owner of the first ready pod's card, the smallest
// max_model_len of them. A model no engine listed yet has root = its id,
// parent = the base model of an adapter (null for a base model),
// max_model_len null and owner "kvgate". created is when the gateway
// started; each card has vLLM's default permission.
func modelCards(store *cache.Store, created int64) modelList {
	list := modelList{Object: "list", Data: []modelCard{}}
	for _, m := range store.ListModels() {
		c, ok := store.ModelCard(m)
		if !ok {
			continue
		}
		card := modelCard{ID: m, Object: "model", Created: created, OwnedBy: c.OwnedBy, Root: c.Root,
			Permission: []modelPermission{newModelPermission(created)}}
		if card.OwnedBy == "" {
			card.OwnedBy = ownedByGateway
		}
		if card.Root == "" {
			card.Root = m
		}
		if c.Parent != "" {
			card.Parent = &c.Parent
		}
		if c.MaxModelLen > 0 {
			card.MaxModelLen = &c.MaxModelLen
		}
		list.Data = append(list.Data, card)
	}
	return list
}

// newModelPermission returns vLLM's default permission, with an id of its
// own as vLLM gives each.
func newModelPermission(created int64) modelPermission {
	var id [16]byte
	_, _ = rand.Read(id[:])
	return modelPermission{ID: "modelperm-" + hex.EncodeToString(id[:]), Object: "model_permission", Created: created,
		AllowSampling: true, AllowLogprobs: true, AllowView: true, Organization: "*"}
}
