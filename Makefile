# glmflash — two commands on a fresh machine: `make run` and `make test`.
GO      ?= go
BIN     := bin/glmflash
PKGS    := ./...
# packages whose state is shared across goroutines: always run under -race
RACE_PKGS := ./core/... ./kernels/parallel/... ./tests/...

.PHONY: all build run test vet fmt-check race fuzz bench eval tools clean

all: build

build:
	$(GO) build -o $(BIN) ./cmd/glmflash

# The main job on the built-in default model: a random `small` checkpoint
# (written once into .cache/), greedy generation, tokens/s and the graph summary.
run: build
	$(BIN) generate --preset small --prompt-ids 1,2,3,4,5,6,7,8 --max-tokens 32 --dump-graph summary

vet:
	$(GO) vet $(PKGS)

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go') | grep -v '\.pb\.go$$' || true); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

race:
	$(GO) test -race -count=1 $(RACE_PKGS)

test: fmt-check vet build
	$(GO) test -count=1 $(PKGS)
	$(MAKE) race

# Longer fuzzing of the outside-input parsers (the seed corpora run in `make test`).
fuzz:
	$(GO) test ./model/safetensors -run '^$$' -fuzz FuzzParseHeader -fuzztime 30s
	$(GO) test ./model -run '^$$' -fuzz FuzzParseConfig -fuzztime 30s

# Baseline throughput on the `bench` preset (several minutes on 2 cores).
bench: build
	$(BIN) bench --preset bench

# The transformers parity check on every shipped fixture.
eval: build
	@for f in testdata/glm5next-tiny-*; do \
		echo "== $$f"; $(BIN) eval --model $$f/checkpoint --reference $$f/reference.safetensors || exit 1; \
	done

clean:
	rm -rf bin .cache
