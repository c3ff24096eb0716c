# The Rust client library (clients/rust/, crate redis-idem-client), included
# by the main Makefile. Its tests with the module run in the workspace's
# own runs: `make test-rust` on Redis 7.0 (the 30-second heartbeat test
# with them), `make test-redis8` and `make test-valkey`. This runs them on
# the Functions edition (no module, functions/idem.lua loaded), on Redis
# 7.0 and on Valkey 9.1, through the workspace's features, so nothing is
# built again. tests/conformance.rs is among them: clients/conformance/.
RUST_CLIENT_TEST_FILES := $(patsubst clients/rust/tests/%.rs,--test %,$(wildcard clients/rust/tests/*.rs))

.PHONY: test-client-rust
test-client-rust: build valkey
	REDIS_SERVER="$(REDIS7_SERVER)" REDIS_IDEM_EDITION=functions $(WORKSPACE_TESTS) $(RUST_CLIENT_TEST_FILES) $(ON_ONE_SERVER_ONLY)
	REDIS_SERVER="$(VALKEY_SERVER)" REDIS_IDEM_EDITION=functions $(WORKSPACE_TESTS) $(RUST_CLIENT_TEST_FILES) $(ON_ONE_SERVER_ONLY)
