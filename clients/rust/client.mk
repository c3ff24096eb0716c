# The Rust client library (clients/rust/, crate redis-idem-client), included
# by the main Makefile. `cargo test --workspace` (make test) already runs its
# tests on Redis 7.0 with the module; this runs them again on Redis 8.2 and
# Valkey 9.1 with the module, and on the Functions edition (no module,
# functions/idem.lua loaded) on Redis 8.2. The 30-second heartbeat test runs
# in the Redis 7.0 run only: it sends the same EXTEND on every server.
RUST_CLIENT_TESTS = $(CARGO) test --profile test-release --no-fail-fast -p redis-idem-client
RUST_CLIENT_SKIP  = -- --skip heartbeat_keeps_a_30_second_job_alive

.PHONY: test-client-rust
test-client-rust: build redis8 valkey
	REDIS_SERVER="$(REDIS8_SERVER)" $(RUST_CLIENT_TESTS) $(RUST_CLIENT_SKIP)
	REDIS_SERVER="$(VALKEY_SERVER)" $(RUST_CLIENT_TESTS) $(RUST_CLIENT_SKIP)
	REDIS_SERVER="$(REDIS8_SERVER)" REDIS_IDEM_EDITION=functions $(RUST_CLIENT_TESTS) $(RUST_CLIENT_SKIP)
