package simserver

import (
	"fmt"
	"net/http"
	"sync"

	"github.com/kvgate/kvgate/pkg/sim"
)

// LoRAModule is a LoRA adapter a Server serves, as vLLM's --lora-modules
// names one (name=path).
type LoRAModule struct {
	// Name is the adapter's served name, which requests give as model.
	Name string
	// Path is where vLLM would load the adapter from. The simulated
	// engine has no weights: the path is only the adapter's root in
	// /v1/models. Empty means the name.
	Path string
}

// loadedLoRA is an adapter the server serves now.
type loadedLoRA struct {
	lora sim.LoRA
	path string
}

// loraRegistry holds the adapters a server serves, in load order. As in
// vLLM, each adapter loaded gets the next engine id, never reused.
type loraRegistry struct {
	mu     sync.RWMutex
	loaded []*loadedLoRA
	nextID int
}

// load adds an adapter; it fails for an empty name, the base model's name,
// or an adapter already loaded.
func (r *loraRegistry) load(base string, m LoRAModule) error {
	if m.Name == "" || m.Name == base {
		return badRequestf("a LoRA adapter name must be non-empty and differ from the model, got %q", m.Name)
	}
	if m.Path == "" {
		m.Path = m.Name
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range r.loaded {
		if l.lora.Name == m.Name {
			return badRequestf("The lora adapter '%s' has already been loaded.", m.Name)
		}
	}
	r.nextID++
	r.loaded = append(r.loaded, &loadedLoRA{lora: sim.LoRA{Name: m.Name, ID: r.nextID}, path: m.Path})
	return nil
}

// unload removes the adapter named name; it fails with notFound when none
// is loaded. Requests running with it finish with it.
func (r *loraRegistry) unload(name string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, l := range r.loaded {
		if l.lora.Name == name {
			r.loaded = append(r.loaded[:i:i], r.loaded[i+1:]...)
			return nil
		}
	}
	return &notFound{msg: fmt.Sprintf("The lora adapter '%s' cannot be found.", name)}
}

// find returns the adapter named name.
func (r *loraRegistry) find(name string) (*sim.LoRA, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, l := range r.loaded {
		if l.lora.Name == name {
			lora := l.lora
			return &lora, true
		}
	}
	return nil, false
}

// list returns the loaded adapters in load order.
func (r *loraRegistry) list() []loadedLoRA {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]loadedLoRA, len(r.loaded))
	for i, l := range r.loaded {
		out[i] = *l
	}
	return out
}

// loadLoRARequest is the body of POST /v1/load_lora_adapter.
type loadLoRARequest struct {
	LoraName string `json:"lora_name"`
	LoraPath string `json:"lora_path"`
}

// unloadLoRARequest is the body of POST /v1/unload_lora_adapter.
type unloadLoRARequest struct {
	LoraName  string `json:"lora_name"`
	LoraIntID *int   `json:"lora_int_id"`
}

// handleLoadLoRA loads an adapter at runtime, answering as vLLM does: 200
// with a plain-text confirmation, 400 without a name and a path or for an
// adapter already loaded.
func (s *Server) handleLoadLoRA(w http.ResponseWriter, r *http.Request) {
	var req loadLoRARequest
	if !s.readBody(w, r, &req) {
		return
	}
	if req.LoraName == "" || req.LoraPath == "" {
		s.writeError(w, badRequestf("Both 'lora_name' and 'lora_path' must be provided."))
		return
	}
	if err := s.loras.load(s.model, LoRAModule{Name: req.LoraName, Path: req.LoraPath}); err != nil {
		s.writeError(w, err)
		return
	}
	s.log.Info("Loaded a LoRA adapter", "adapter", req.LoraName, "path", req.LoraPath)
	writeText(w, fmt.Sprintf("Success: LoRA adapter '%s' added successfully.", req.LoraName))
}

// handleUnloadLoRA unloads an adapter at runtime, answering as vLLM does:
// 200 with a plain-text confirmation, 400 without a name or id, 404 for an
// adapter not loaded. Like vLLM, it finds the adapter by name only.
func (s *Server) handleUnloadLoRA(w http.ResponseWriter, r *http.Request) {
	var req unloadLoRARequest
	if !s.readBody(w, r, &req) {
		return
	}
	if req.LoraName == "" && req.LoraIntID == nil {
		s.writeError(w, badRequestf("either 'lora_name' and 'lora_int_id' needs to be provided."))
		return
	}
	if err := s.loras.unload(req.LoraName); err != nil {
		s.writeError(w, err)
		return
	}
	s.log.Info("Unloaded a LoRA adapter", "adapter", req.LoraName)
	writeText(w, fmt.Sprintf("Success: LoRA adapter '%s' removed successfully.", req.LoraName))
}

func writeText(w http.ResponseWriter, text string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte(text))
}
