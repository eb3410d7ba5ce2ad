# Makefile - thin wrapper over CMake/CTest. `make run` and `make test` set everything up first.
BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc)
MODEL      ?= models/SmolLM2-135M-Instruct.Q4_1.gguf
PROMPT     ?= What is the capital of France? Answer in one sentence.
ARGS       ?=
CMAKE_ARGS ?=

.PHONY: all setup build run test test-unit test-asan test-py test-gpu bench clean

all: build

setup:
	@scripts/setup.sh

build: setup
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# Chats with the default model: the prompt is a user turn rendered with its ChatML template.
run: build
	@scripts/setup.sh --model
	$(BUILD)/pagoda run -m $(MODEL) -p "$(PROMPT)" --temperature 0 -n 128 $(ARGS)

test: build
	@scripts/setup.sh --test
	ctest --test-dir $(BUILD) -L unit --output-on-failure -j $(JOBS)
	@$(MAKE) --no-print-directory test-asan
	@$(MAKE) --no-print-directory test-py

test-asan:
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DPAGODA_SANITIZE=ON $(CMAKE_ARGS) >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)
	ctest --test-dir $(ASAN_BUILD) -L 'unit|fuzz' --output-on-failure -j $(JOBS)

test-py:
	@if ls tests/py/test_*.py >/dev/null 2>&1; then \
	  PAGODA_BIN=$(CURDIR)/$(BUILD)/pagoda .venv/bin/python -m pytest -q tests/py; \
	else echo "no Python tests"; fi

test-gpu: build
	ctest --test-dir $(BUILD) -L gpu --output-on-failure

bench: build
	bench/run.sh $(BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
