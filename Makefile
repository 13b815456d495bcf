# Quick start:  make run   (one MoE layer forward, verified against the fp64 oracle)
#               make test  (unit + ref tests, then the ref tests under ThreadSanitizer)
# Both install their own dependencies (scripts/setup.sh) and are safe to repeat.

BUILD      ?= build
TSAN_BUILD ?= build-tsan
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=
RUN_ARGS   ?= --model mixtral-8x7b --ep 8

.PHONY: setup build build-tsan run test test-tsan clean

setup:
	@bash scripts/setup.sh

build: setup
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

build-tsan: setup
	@cmake -S . -B $(TSAN_BUILD) -G Ninja -DCOMET_TSAN=ON -DCOMET_BUILD_TOOLS=OFF >/dev/null
	@cmake --build $(TSAN_BUILD) -j $(JOBS)

run: build
	./$(BUILD)/tools/comet run $(RUN_ARGS)

test: build build-tsan
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)
	$(MAKE) --no-print-directory test-tsan

test-tsan:
	TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
	  ctest --test-dir $(TSAN_BUILD) --output-on-failure -L ref -j $(JOBS)

clean:
	rm -rf $(BUILD) $(TSAN_BUILD)
