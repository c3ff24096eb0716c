# The Rust client library (clients/rust/, crate redis-idem-client), included
# by the main Makefile. Its tests with the module run in the workspace's
# own runs: `make test-rust` on Redis 7.0 (the 30-second heartbeat test
# with them), `make test-redis8` and `make test-valkey`. This runs them on
# the Functions edition (no module, functions/idem.lua loaded), on Redis
# 7.0 and on Valkey 9.1, through the workspace's features, so nothing is
# built again. tests/conformance.rs is among them: clients/conformance/.
RUST_CLIENT_TEST_FILES := $(patsubst clients/rust/tests/%.rs,--test %,$(wildcard clients/rust/tests/*.rs))

# Every feature set a user can build (json, tokio, cluster, cluster-async,
# sentinel, in every combination that cargo accepts) passes clippy with
# warnings as errors: `make lint` checks the workspace's one feature set
# only, and a lint can fire in one set alone (a unit `let` without
# `cluster`). --lib: what a user's build compiles.
RUST_CLIENT_FEATURE_SETS := $(foreach json,json _,$(foreach sentinel,sentinel _,$(foreach rest,_ tokio cluster tokio+cluster cluster-async,$(json)+$(sentinel)+$(rest))))
# streams adds no dependency: checked alone (sync, no cluster), with tokio,
# and with everything, not in every combination (each set is a clippy run).
RUST_CLIENT_FEATURE_SETS += _+_+streams _+_+tokio+streams json+sentinel+cluster-async+streams
.PHONY: lint-client-rust test-client-rust
lint-client-rust:
	@for set in $(RUST_CLIENT_FEATURE_SETS); do \
		features=$$(echo "$$set" | tr '+' '\n' | grep -vx _ | paste -sd, -); \
		echo "clippy redis-idem-client --features '$$features'"; \
		$(CARGO) clippy -q -p redis-idem-client --lib --no-default-features --features "$$features" -- -D warnings || exit 1; \
	done

test-client-rust: build valkey
	REDIS_SERVER="$(REDIS7_SERVER)" REDIS_IDEM_EDITION=functions $(WORKSPACE_TESTS) $(RUST_CLIENT_TEST_FILES) $(ON_ONE_SERVER_ONLY)
	REDIS_SERVER="$(VALKEY_SERVER)" REDIS_IDEM_EDITION=functions $(WORKSPACE_TESTS) $(RUST_CLIENT_TEST_FILES) $(ON_ONE_SERVER_ONLY)

# brokers/scenario.py's consumer program of the Streams adapter (clients/
# conformance/brokers.json's rust-streams row), in the tests' profile, so
# that it shares their build.
.PHONY: brokers-consumers-rust
BROKERS_CONSUMER_TARGETS += brokers-consumers-rust
brokers-consumers-rust:
	$(CARGO) build --profile test-release -p redis-idem-client --example brokers-streams --features streams
