# qvirt: virtual machines as Kubernetes workloads, without libvirt.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c

GO          ?= go
BIN         ?= bin
CONTROLLER_GEN := $(GO) tool controller-gen
# Binaries that exist so far; each is a thin main under cmd/.
CMDS        := $(notdir $(wildcard cmd/*))
# Fuzz time per fuzz target inside `make test`; longer runs: make fuzz FUZZTIME=10m.
FUZZTIME    ?= 10s
# Where `make profile` writes its CPU profiles.
PROFILE_DIR ?= $(BIN)/profiles

.DEFAULT_GOAL := build

deps: ## Install the Debian packages the tests and the demo need (QEMU, busybox, ...).
	@hack/install-deps.sh

.PHONY: all deps build generate manifests fmt vet lint test test-unit fuzz bench profile tools node-tools run clean verify-generated install-plugin images push images-lock images-check

all: build

# The launcher runs once per VM, so it is built static: it then maps neither libc nor ld.so,
# 1.4 MiB of resident memory per launcher (the tests and benchmarks build it with this target). cgo
# would serve only package net's host name resolver, and the pure Go one does as well for it.
STATIC_CMDS := $(filter qvirt-launcher,$(CMDS))

build: ## Build every binary into bin/.
	@mkdir -p $(BIN)
	@if [ -n "$(filter-out $(STATIC_CMDS),$(CMDS))" ]; then $(GO) build -trimpath -o $(BIN)/ $(addprefix ./cmd/,$(filter-out $(STATIC_CMDS),$(CMDS))); fi
	@if [ -n "$(STATIC_CMDS)" ]; then CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/ $(addprefix ./cmd/,$(STATIC_CMDS)); fi

# The component images, built without a container engine (internal/images): an OCI layout in
# $(BIN)/images. The launcher's and the node agent's QEMU comes from the Debian packages pinned in
# hack/images/debs.lock, fetched with apt into ~/.cache/qvirt/debs. Same sources, same lock:
# same digests.
images: ## Build the component images into bin/images; prints each one's digest and sizes.
	$(GO) run ./cmd/qvirt-images build --out $(BIN)/images

push: images ## Push the images to REGISTRY=host:port (plain HTTP for a loopback registry).
	@if [ -z "$(REGISTRY)" ]; then echo "usage: make push REGISTRY=host:port" >&2; exit 2; fi
	$(GO) run ./cmd/qvirt-images push --out $(BIN)/images --registry $(REGISTRY)

images-lock: ## Re-resolve hack/images/debs.lock from apt's current package index.
	$(GO) run ./cmd/qvirt-images lock

images-check: ## Fail, naming the package, when apt can no longer fetch the locked packages.
	$(GO) run ./cmd/qvirt-images check

generate: ## Generate deepcopy functions.
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/...

manifests: ## Generate CRDs and RBAC into config/.
	$(CONTROLLER_GEN) crd:generateEmbeddedObjectMeta=true paths=./api/... output:crd:artifacts:config=config/crd/bases
	$(CONTROLLER_GEN) rbac:roleName=qvirt-controller paths="./controllers;./internal/config/...;./internal/metricsauth/...;./controllers/vm/...;./controllers/vmi/...;./controllers/migration/...;./controllers/nodehealth/...;./controllers/admission/...;./controllers/certs/...;./controllers/uninstall/..." output:rbac:artifacts:config=config/rbac
	$(CONTROLLER_GEN) rbac:roleName=qvirt-handler paths="./internal/config/...;./internal/metricsauth/...;./handler/..." output:rbac:artifacts:config=config/handler
	$(CONTROLLER_GEN) webhook paths=./controllers/... output:webhook:artifacts:config=config/webhook

verify-generated: generate manifests ## Fail when generated files differ from what is checked in.
	@if [ -n "$$(git status --porcelain -- api config)" ]; then \
	  echo "generated files are out of date; run 'make generate manifests' and commit:"; \
	  git status --porcelain -- api config; git --no-pager diff --stat -- api config; exit 1; fi

fmt:
	gofmt -s -w $$(git ls-files '*.go')

vet:
	$(GO) vet ./...

lint: vet ## gofmt, go vet and staticcheck.
	@out=$$(gofmt -s -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

tools: ## Build the control-plane binaries (etcd, kube-apiserver, ...) into the cache; prints where.
	@hack/build-tools.sh

node-tools: ## Build the kubelet and containerd (real nodes, local/kubenode) into the cache; prints where.
	@hack/build-node.sh

# Test packages run one at a time (-p 1) in each group below: several of them boot guests under TCG and run control
# planes, and on 2 cores they starve each other's timing. Their binaries are compiled in parallel
# first (-exec true runs none of them).
# The cloud image (test/guest/cloud) is built before any package runs, so its cold build (minutes
# of package downloads and dpkg) counts against no package's timeout; it runs beside the
# control-plane build and the test compilation, which are CPU-bound where it mostly waits on the
# mirror and the disk. Its log is printed only when it fails.
# The packages that talk only to their own envtest control plane (no guest, no local cluster, no
# image build) run as a second group beside the rest (hack/test-packages.sh): they mostly wait on
# their API servers and timeouts, so side by side they take about 7 minutes off the run.
ENVTEST_PKGS := ./controllers/... ./apiserver/... ./cli/... ./handler/streams ./handler/metrics ./test/crd ./internal/patch ./internal/config
test: deps verify-generated ## Unit, integration and end-to-end tests, then bounded fuzzing.
	log=$$(mktemp); test/guest/cloud/build.sh >/dev/null 2>"$$log" & cloud=$$!; \
	  hack/build-tools.sh >/dev/null && hack/build-node.sh >/dev/null && $(GO) test -count=1 -exec true ./... >/dev/null || { wait $$cloud; rm -f "$$log"; exit 1; }; \
	  if ! wait $$cloud; then cat "$$log"; rm -f "$$log"; echo "test/guest/cloud/build.sh failed" >&2; exit 1; fi; \
	  rm -f "$$log"
	KUBEBUILDER_ASSETS=$$(hack/build-tools.sh) ENVTEST_PKGS="$(ENVTEST_PKGS)" LIGHT_THEN="hack/fuzz.sh $(FUZZTIME)" FUZZ_WORKERS=1 GO=$(GO) \
	  hack/test-packages.sh -p 1 -count=1 -timeout 30m

test-unit: ## Tests that need no API server, QEMU or root.
	$(GO) test -short ./...

fuzz: ## Run every fuzz target for FUZZTIME.
	@hack/fuzz.sh $(FUZZTIME)

# Benchmark packages run one at a time (-p 1), as in `make test`: their figures are timings, and
# the end-to-end ones start local clusters that wait on each other's host network lock, which
# would count against their timeout. The cloud image is built first, as in `make test`, so its cold
# build counts against no package's timeout (BenchmarkCloudImageSSH reports what that build took);
# -timeout covers test/e2ecloud's cluster start and its boots, and test/e2e's BenchmarkStartup.
bench: tools ## Benchmarks with their figures (not pass/fail).
	test/guest/cloud/build.sh >/dev/null
	KUBEBUILDER_ASSETS=$$(hack/build-tools.sh) $(GO) test -p 1 -timeout 90m -run '^$$' -bench . -benchmem ./...

profile: tools ## CPU profiles over BenchmarkStartup's 100 starts and idle minute: each qvirt-controller replica and qvirt-handler, and every launcher's start, into PROFILE_DIR.
	KUBEBUILDER_ASSETS=$$(hack/build-tools.sh) $(GO) test ./test/e2e -run '^$$' -bench '^BenchmarkStartup$$' -benchtime=1x -timeout 30m -startup.profile=$(abspath $(PROFILE_DIR))
	@echo "profiles in $(PROFILE_DIR); read one with: go tool pprof -top $(PROFILE_DIR)/qvirt-controller-startup.pprof (all launchers at once: $(PROFILE_DIR)/launchers/*.pprof)"

install-plugin: build ## Link bin/qvirtctl as kubectl-qvirt into PLUGIN_DIR (default ~/.local/bin) for `kubectl qvirt`.
	@d=$${PLUGIN_DIR:-$$HOME/.local/bin}; mkdir -p $$d; ln -sf $(abspath $(BIN))/qvirtctl $$d/kubectl-qvirt; echo "kubectl qvirt -> $$d/kubectl-qvirt"

run: deps build tools ## The demo on this machine.
	@hack/run.sh

clean:
	rm -rf $(BIN)
