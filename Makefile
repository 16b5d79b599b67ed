# glmflash — two commands on a fresh machine: `make run` and `make test`.
GO      ?= go
BIN     := bin/glmflash
PKGS    := ./...
# packages whose state is shared across goroutines: always run under -race
RACE_PKGS := ./core/... ./kernels/parallel/... ./tests/...

.PHONY: all build run test vet fmt-check lint race fuzz bench limits eval tools clean

all: build

build:
	CGO_ENABLED=0 $(GO) build -buildvcs=auto -ldflags "-X main.revision=$$(git describe --always --dirty 2>/dev/null)" -o $(BIN) ./cmd/glmflash

# The main job: serve the built-in default model (a random `small` checkpoint,
# written once into .cache/) over gRPC and the OpenAI-compatible HTTP API as
# the built-in configuration (configs/engine.yaml, configs/serve.yaml) says;
# it prints how to call it (bin/grpcurl, a streaming curl line). Ctrl-C (or
# SIGTERM) drains and stops.
run: build bin/grpcurl
	$(BIN) serve

vet:
	$(GO) vet $(PKGS)

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go') | grep -v '\.pb\.go$$' || true); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

race:
	$(GO) test -race -count=1 $(RACE_PKGS)

# golangci-lint (pinned, installed into bin/ by `go install`; .golangci.yml
# says which linters) and a go.mod that `go mod tidy` would not change.
GOLANGCI_LINT_VERSION := v2.15.0
bin/golangci-lint:
	GOBIN=$(CURDIR)/bin $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)

lint: bin/golangci-lint
	@v=$$(bin/golangci-lint version --short 2>/dev/null); if [ "v$$v" != "$(GOLANGCI_LINT_VERSION)" ] && [ "$$v" != "$(GOLANGCI_LINT_VERSION)" ]; then \
		echo "bin/golangci-lint is $$v, $(GOLANGCI_LINT_VERSION) wanted: reinstalling"; rm -f bin/golangci-lint; $(MAKE) --no-print-directory bin/golangci-lint; fi
	bin/golangci-lint run ./...
	$(GO) mod tidy -diff

test: fmt-check vet build
	$(GO) test -count=1 $(PKGS)
	$(MAKE) race
	$(MAKE) --no-print-directory test-impls
	$(MAKE) --no-print-directory test-emu-quick
	$(MAKE) --no-print-directory test-node

# Part of `make test`: the OpenAI API driven by the official Node `openai`
# package (tests/node/openai.test.mjs: chat, streaming, models, sampling
# fields, X-Request-Id) against a server on the tiny fixture
# (core/openai's TestNodeOpenAIPackage). The package is installed with
# `npm ci` from the committed package-lock.json (the npm registry, or
# npm's cache); GLMFLASH_NODE_TEST=1 makes a missing package a failure.
# Skipped, saying so, where node or npm is missing.
.PHONY: test-node
test-node:
	@if ! command -v node >/dev/null || ! command -v npm >/dev/null; then echo "SKIPPED: the Node openai script test needs node and npm (tests/node)"; exit 0; fi; \
	(cd tests/node && npm ci --no-audit --no-fund --loglevel=error) && \
	GLMFLASH_NODE_TEST=1 $(GO) test -count=1 -run '^TestNodeOpenAIPackage$$' -v ./core/openai/

# Part of `make test`: the kernels and the fixture parity suite once per
# other kernel implementation the CPU offers (AVX2 with AVX-512 masked,
# pure Go with -tags purego) and the arm64 vet and build
# (scripts/test-impls.sh says how).
.PHONY: test-impls test-haswell
test-impls:
	GO=$(GO) scripts/test-impls.sh

# The kernels' tests on an emulated AVX2-only CPU (qemu-user, -cpu Haswell:
# an AVX-512 instruction there is SIGILL, as on such a machine), which no
# GODEBUG mask can show. Slow (about 10 minutes on 2 cores): not part of
# `make test`. Installs qemu-user where it is missing (Debian).
# TestNoOverread is skipped there: it puts operands just before a PROT_NONE
# page, and QEMU 7.2's VMASKMOVPS faults on masked-out lanes past it, where
# the hardware does not (the SDM: only lanes the mask selects can fault);
# it runs natively in make test, per implementation. So is TestMeasureBriefly:
# it checks that the measured peaks are plausible for a CPU, and emulated
# FMAs run at 0.1 GFLOP/s (its kernels' stored results are still checked
# there, by TestKernelsStoreTheirWork).
# Haswell without the system features TCG cannot emulate (qemu warns of each)
HASWELL := Haswell,-pcid,-tsc-deadline,-x2apic,-hle,-invpcid,-rtm
# every package with assembly or with code that picks it
HASWELL_PKGS := kernels/gemm kernels/act kernels/kda kernels/mhc kernels/norm kernels/mla kernels/moe kernels/indexer kernels/conv internal/cpulimits tools/limits
test-haswell:
	@command -v qemu-x86_64 >/dev/null || { apt-get update -qq && apt-get install -y -qq qemu-user; }
	@mkdir -p bin/haswell
	@for p in $(HASWELL_PKGS); do \
		$(GO) test -c -o bin/haswell/$$(echo $$p | tr / _).test ./$$p || exit 1; done
	@cd kernels/gemm && qemu-x86_64 -cpu $(HASWELL) $(CURDIR)/bin/haswell/kernels_gemm.test -test.run '^TestImpls$$' -test.v | grep implementations
	@for p in $(HASWELL_PKGS); do \
		echo "== qemu-x86_64 -cpu Haswell $$p"; (cd $$p && qemu-x86_64 -cpu $(HASWELL) $(CURDIR)/bin/haswell/$$(echo $$p | tr / _).test -test.count=1 -test.skip '^(TestNoOverread|TestMeasureBriefly)$$') || exit 1; done

# Longer fuzzing of every outside-input parser (their seed corpora run in
# `make test`): checkpoint headers and configs, engine YAML, serve YAML and
# requests, study files, and the graphs plugins return. FUZZTIME per target.
FUZZTIME ?= 30s
FUZZ_TARGETS := ./model/safetensors:FuzzParseHeader ./model:FuzzParseConfig ./model:FuzzParseGenerationConfig ./core/config:FuzzLoad \
	./core/serve:FuzzGenerateRequest ./core/access:FuzzParseKeys ./core/attrib:FuzzParseStudy ./tests:FuzzInstall ./tests:FuzzPluginAnswers \
	./model/tokenizer:FuzzEncodeDecode ./model/tokenizer:FuzzParse ./model/tokenizer:FuzzFastSplit ./core/openai:FuzzRequest ./core/openai:FuzzTokenize \
	./core/loadgen:FuzzParseJSONL ./core/loadgen:FuzzReadStream
fuzz:
	@for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; fn=$${t##*:}; echo "== $$pkg $$fn"; \
		$(GO) test $$pkg -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 5s || exit 1; \
	done

# Baseline throughput on the `bench` preset (several minutes on 2 cores).
bench: build
	$(BIN) bench --preset bench

# The CPU's limits (fp32 FMA and vdpbf16ps peaks, read bandwidth) that
# bench --limits compares with: configs/limits/<cpu>-<threads>t.json.
limits:
	$(GO) run ./tools/limits

# The transformers parity check on every shipped fixture.
eval: build
	@for f in testdata/glm5next-tiny-*; do \
		echo "== $$f"; $(BIN) eval --model $$f/checkpoint --reference $$f/reference.safetensors || exit 1; \
	done

clean:
	rm -rf bin .cache

# ---- serving: gRPC API, server, tools, load test ----------------------------
# Tool versions are pinned; `go install` puts them in ./bin (outside go.mod).
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
BUF_VERSION                := v1.75.0
GRPCURL_VERSION            := v1.9.4
GHZ_VERSION                := v0.120.0
GOBIN_DIR                  := $(CURDIR)/bin

.PHONY: proto proto-check loadtest

bin/protoc-gen-go:
	GOBIN=$(GOBIN_DIR) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)

bin/protoc-gen-go-grpc:
	GOBIN=$(GOBIN_DIR) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)

# buf compiles the .proto files itself (no protoc), lints them and checks
# changes against an earlier version for wire compatibility.
bin/buf:
	GOBIN=$(GOBIN_DIR) $(GO) install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)

bin/grpcurl:
	GOBIN=$(GOBIN_DIR) $(GO) install github.com/fullstorydev/grpcurl/cmd/grpcurl@$(GRPCURL_VERSION)

bin/ghz:
	GOBIN=$(GOBIN_DIR) $(GO) install github.com/bojand/ghz/cmd/ghz@$(GHZ_VERSION)

tools: bin/protoc-gen-go bin/protoc-gen-go-grpc bin/buf bin/grpcurl bin/ghz bin/golangci-lint

# Regenerate the committed Go code of proto/ (proto/buf.yaml, buf.gen.yaml);
# PROTO_OUT lets proto-check write elsewhere.
PROTO_OUT ?= .
proto: bin/buf bin/protoc-gen-go bin/protoc-gen-go-grpc
	bin/buf generate proto --template proto/buf.gen.yaml -o $(PROTO_OUT)

# The protocol is a contract: lint it, refuse breaking changes against
# BUF_AGAINST (by default where this branch left main, so that what main
# added since is not mistaken for a deletion; a release tag once there are
# some), and check that regeneration reproduces the committed files.
BUF_AGAINST ?= .git\#ref=$(shell git merge-base HEAD main 2>/dev/null || echo main),subdir=proto
proto-check: bin/buf bin/protoc-gen-go bin/protoc-gen-go-grpc
	bin/buf lint proto
	bin/buf breaking proto --against '$(BUF_AGAINST)'
	@tmp=$$(mktemp -d); $(MAKE) --no-print-directory proto PROTO_OUT=$$tmp >/dev/null && \
	for f in $$(cd $$tmp && find . -name '*.go'); do \
		cmp -s $$tmp/$$f $$f || { echo "$$f differs from a fresh generation (run make proto)"; rm -rf $$tmp; exit 1; }; \
	done; rm -rf $$tmp; echo "proto: lint clean, no breaking change, generated code up to date"

# Load test: glmflash serve on the bench preset, ghz at concurrency 1, 8, 32.
loadtest: build bin/ghz
	scripts/loadtest.sh

# Per-pass on/off benchmarks on the `bench` preset (prefill 512 and a decode step).
bench-passes:
	$(GO) test ./tests -run '^$$' -bench BenchmarkPasses -benchtime 3x -timeout 90m

# ---- pass plugins: protocol, example plugin ---------------------------------
# The plugin protocol is generated by the same `make proto` / `make proto-check`.
PLUGIN_DIR  := bin/plugins

.PHONY: plugins

# The example plugin (tests build the plugins they need themselves).
plugins:
	@mkdir -p $(PLUGIN_DIR)
	$(GO) build -o $(PLUGIN_DIR)/glmflash-pass-shared-expert-fusion ./plugins/examples/sharedexpert
	cd $(PLUGIN_DIR) && sha256sum glmflash-pass-* > SHA256SUMS

# ---- CUDA: PTX, the CPU emulator, GPU tests ------------------------------------
# The kernels' CUDA C sources (kernels/cuda/src) are compiled to PTX where
# nvcc exists (`make ptx`, on the GPU machine) and the PTX is committed; each
# file records the SHA-256 of its sources, and `make test` (no nvcc needed)
# fails when they differ. Targets: Hopper (sm_90) and a portable compute_75.
NVCC      ?= nvcc
CUDA_SRC  := kernels/cuda/src
PTX_DIR   := kernels/cuda/ptx
CUDA_EMU  := bin/libglmflash-cudaemu.so
# The emulator contracts a*b+c into fused multiply-adds as nvcc does, where
# the CPU has them, so its numbers stay close to a GPU's.
EMU_FMA   := $(shell grep -qw fma /proc/cpuinfo 2>/dev/null && echo -mfma -ffp-contract=fast)

.PHONY: ptx cuda-args cudaemu test-gpu test-emu test-emu-quick gpu-test-bins gpu-bundle gpu-campaign-bundle

ptx:
	NVCC=$(NVCC) scripts/ptx.sh

# The Go mirrors of the kernels' argument structs.
cuda-args:
	$(GO) run ./tools/cudaargs

# The CPU emulation of the driver + cuBLAS with the kernels compiled as C++
# (tests of the CUDA backend where there is no GPU).
$(CUDA_EMU): kernels/cuda/emu/emu.cpp kernels/cuda/emu/emu.h $(wildcard $(CUDA_SRC)/*.cu) $(wildcard $(CUDA_SRC)/*.cuh)
	@mkdir -p bin
	$(CXX) -O2 -std=c++17 $(EMU_FMA) -shared -fPIC -o $@ kernels/cuda/emu/emu.cpp
cudaemu: $(CUDA_EMU)

# The CUDA tests as binaries (a GPU machine needs no Go to run them).
GPU_TEST_PKGS := kernels/cuda core/backend/cuda tests/gpu
gpu-test-bins:
	@mkdir -p bin/gpu-tests
	@for p in $(GPU_TEST_PKGS); do \
		CGO_ENABLED=0 $(GO) test -c -ldflags "-s -w" -o bin/gpu-tests/$$(echo $$p | tr / _).test ./$$p || exit 1; done

# Where a GPU exists: every CUDA test, a missing GPU being a failure. The
# tests package runs only its CUDA tests there (GPU_TEST_RUN).
test-gpu:
	@if command -v $(GO) >/dev/null; then $(MAKE) --no-print-directory gpu-test-bins; fi
	GPU_TEST_RUN='$(GPU_TEST_RUN)' scripts/test-gpu.sh
GPU_TEST_RUN ?= .

# The same tests on the CPU emulator of the driver (no GPU needed; slow):
# the CUDA backend's logic, its kernels and its parity with transformers.
test-emu: $(CUDA_EMU)
	GLMFLASH_CUDA_EMULATOR=$(CURDIR)/$(CUDA_EMU) GLMFLASH_REQUIRE_GPU=1 $(GO) test -count=1 -timeout 60m ./kernels/cuda/ ./core/backend/cuda/
	GLMFLASH_CUDA_EMULATOR=$(CURDIR)/$(CUDA_EMU) GLMFLASH_REQUIRE_GPU=1 $(GO) test -count=1 -timeout 60m ./tests/gpu/

# Part of `make test`: the CUDA kernels and backend on the CPU emulator
# (kernel tests, the backend's unit tests, CPU agreement on the small
# preset, the MTP graph, speculative decoding's rollback, greedy identity
# and MTP drafting, the DFlash drafter (its forward, store and target-layer
# capture against the CPU, greedy identity, block rollback), length syncs,
# the passes' mechanisms, prefill-autotune,
# the pass micro-benchmark and a device study, logits processing (edits
# and masks, eager and in graphs; the gRPC server's processed streams),
# one fixture's parity without
# passes and with every built-in pass). Skipped, saying so, where no C++
# compiler exists to build the emulator.
EMU_QUICK_RUN := TestCUDAMatchesCPUOnSmallPreset|TestCUDADFlashDraftMatchesCPU|TestCUDADFlashForwardMatchesCPU|TestCUDATargetHiddenCapture|TestCUDASpecGreedyIdentityDFlash|TestCUDADFlashDrafterMatchesCPU|TestCUDADFlashBlockVerifyRollsBack|TestCUDAStoreCopy|TestCUDAMTPMatchesCPU|TestCUDASpecRollback|TestCUDASpecGreedyIdentity|TestCUDAMTPDrafterMatchesCPU|TestCUDASpecSampling|TestCUDALengthSyncs|TestCUDAPassMechanisms|TestCUDAPrefillAutotune|TestCUDAPassBench|TestCUDAStudy|TestCUDALogitsProcessing|TestCUDAServeProcessing|TestCUDATransformersParity/glm5next-tiny-a/(baseline|all)$$
test-emu-quick:
	@if ! command -v $(CXX) >/dev/null || [ "$$(uname -m)" != x86_64 ]; then echo "SKIPPED: the emulated CUDA tests need an x86-64 machine with a C++ compiler ($(CXX)) to build $(CUDA_EMU)"; exit 0; fi; \
	$(MAKE) --no-print-directory $(CUDA_EMU) && \
	GLMFLASH_CUDA_EMULATOR=$(CURDIR)/$(CUDA_EMU) GLMFLASH_REQUIRE_GPU=1 $(GO) test -count=1 ./kernels/cuda/ ./core/backend/cuda/ && \
	GLMFLASH_CUDA_EMULATOR=$(CURDIR)/$(CUDA_EMU) GLMFLASH_REQUIRE_GPU=1 $(GO) test -count=1 -run '$(EMU_QUICK_RUN)' ./tests/gpu/

# What scripts/gpu-campaign.sh needs on the GPU machine, in one file to carry
# (bin/gpu-campaign.tgz: the stripped binary and the CUDA test binaries; the
# script unpacks it).
gpu-campaign-bundle: gpu-test-bins
	@rm -rf bin/campaign && mkdir -p bin/campaign/gpu-tests
	CGO_ENABLED=0 $(GO) build -ldflags "-s -w -X main.revision=$$(git describe --always --dirty 2>/dev/null)" -o bin/campaign/glmflash ./cmd/glmflash
	cp bin/gpu-tests/*.test bin/campaign/gpu-tests/
	tar czf bin/gpu-campaign.tgz -C bin/campaign glmflash gpu-tests
	@ls -l bin/gpu-campaign.tgz

# Everything a GPU machine without Go needs, in one file to carry
# (bin/gpu-bundle.tgz: the binary, the CUDA test binaries, ghz and the
# example plugin, stripped); scripts/gpu-run.sh unpacks it there.
gpu-bundle: gpu-test-bins
	@rm -rf bin/bundle && mkdir -p bin/bundle/plugins bin/bundle/gpu-tests
	CGO_ENABLED=0 $(GO) build -ldflags "-s -w -X main.revision=$$(git describe --always --dirty 2>/dev/null)" -o bin/bundle/glmflash ./cmd/glmflash
	CGO_ENABLED=0 GOBIN=$(CURDIR)/bin/bundle $(GO) install -ldflags "-s -w" github.com/bojand/ghz/cmd/ghz@$(GHZ_VERSION)
	CGO_ENABLED=0 $(GO) build -ldflags "-s -w" -o bin/bundle/plugins/glmflash-pass-shared-expert-fusion ./plugins/examples/sharedexpert
	cd bin/bundle/plugins && sha256sum glmflash-pass-* > SHA256SUMS
	cp bin/gpu-tests/*.test bin/bundle/gpu-tests/
	tar czf bin/gpu-bundle.tgz -C bin/bundle glmflash $(if $(NO_GHZ),,ghz) gpu-tests plugins
	@ls -l bin/gpu-bundle.tgz
