# The Go library (clients/go, module github.com/redis-idem/redis-idem/clients/go)
# and its tests; included by the top Makefile, whose test-clients runs
# test-client-go.
#
#   make test-client-go   gofmt and go vet (the library, its consumer
#       example, examples/clients/go, and its bench program,
#       bench/clients/go), then one `go test -race` run: the conformance
#       cases and the library's own tests with the module on Redis 7.0,
#       Redis 8.2 and Valkey 9.1, the Functions edition (functions/idem.lua,
#       no module) on Redis 7.0 and Valkey 9.1, each config also as a
#       primary with a replica and under a Sentinel (the server's own binary
#       with --sentinel), and a 3-node cluster; the server configs run side
#       by side (t.Parallel).
#       Dependencies come from the Go module proxy, pinned by go.sum.
#
# REDIS_IDEM_MODULE=<path.so> tests that build of the module instead of
# building target/release/libredis_idem.so first; REDIS_SERVER=<binary>
# replaces Debian's redis-server (7.0) in the Redis 7.0 configs.

# Go is on the machine image (/usr/local/go); elsewhere Debian's golang-go,
# which fetches the toolchain go.mod names from the module proxy itself.
GO_CLIENT_GO = $(or $(shell command -v go 2>/dev/null),$(wildcard /usr/local/go/bin/go),go)
GO_CLIENT_MODULE := $(if $(REDIS_IDEM_MODULE),$(abspath $(REDIS_IDEM_MODULE)),$(abspath $(MODULE)))

.PHONY: test-client-go client-go-toolchain

client-go-toolchain:
	@command -v go >/dev/null 2>&1 || test -x /usr/local/go/bin/go || { \
		echo "go is not installed: installing Debian's golang-go"; \
		apt-get update -q && apt-get install -y -q golang-go; }

# From the checkout's root (go -C), so that REDIS8_SERVER and VALKEY_SERVER,
# which ask the venv's python, find it.
test-client-go: $(if $(REDIS_IDEM_MODULE),,build) redis8 valkey client-go-toolchain
	@echo "== clients/go: gofmt, go vet"
	@out="$$($$(GOTOOLCHAIN=auto $(GO_CLIENT_GO) env GOROOT)/bin/gofmt -l clients/go examples/clients/go bench/clients/go)" && \
		if [ -n "$$out" ]; then echo "gofmt would change: $$out"; exit 1; fi
	GOTOOLCHAIN=auto $(GO_CLIENT_GO) -C clients/go vet ./...
	GOTOOLCHAIN=auto $(GO_CLIENT_GO) -C examples/clients/go vet ./...
	GOTOOLCHAIN=auto $(GO_CLIENT_GO) -C bench/clients/go vet ./...
	@echo "== clients/go: Redis 7.0, 8.2, Valkey 9.1 (module), Redis 7.0, Valkey 9.1 (Functions edition), a cluster"
	GOTOOLCHAIN=auto REDIS_IDEM_MODULE="$(GO_CLIENT_MODULE)" \
		REDIS_SERVER="$(or $(REDIS_SERVER),$(REDIS7_SERVER))" \
		REDIS8_SERVER="$(REDIS8_SERVER)" VALKEY_SERVER="$(VALKEY_SERVER)" \
		$(GO_CLIENT_GO) -C clients/go test -race -count=1 ./...

# The broker adapters (idemkafka, idemamqp, idemnats, idemstreams: a module
# each, under clients/go) and the consumer programs brokers/scenario.py runs
# for them (clients/go/tests/brokers, one per adapter), built into
# target/brokers/go/. `make test-brokers` runs the scenario
# (brokers/brokers.mk); the adapters' own tests against the real brokers
# run in test-client-go-adapters.
GO_ADAPTERS := idemkafka idemamqp idemnats idemstreams
# The adapters' examples, vetted with them (each its own module).
GO_ADAPTER_EXAMPLES := examples/kafka/go examples/rabbitmq/go examples/nats/go examples/streams/go

.PHONY: brokers-consumers-go test-client-go-adapters
BROKERS_CONSUMER_TARGETS += brokers-consumers-go
BROKERS_LIBRARY_TESTS += test-client-go-adapters

brokers-consumers-go: client-go-toolchain
	@out="$$($$(GOTOOLCHAIN=auto $(GO_CLIENT_GO) env GOROOT)/bin/gofmt -l $(addprefix clients/go/,$(GO_ADAPTERS)) clients/go/tests/brokers $(GO_ADAPTER_EXAMPLES))" && \
		if [ -n "$$out" ]; then echo "gofmt would change: $$out"; exit 1; fi
	for m in $(addprefix clients/go/,$(GO_ADAPTERS) tests/brokers) $(GO_ADAPTER_EXAMPLES); do GOTOOLCHAIN=auto $(GO_CLIENT_GO) -C $$m vet ./... || exit 1; done
	GOTOOLCHAIN=auto $(GO_CLIENT_GO) -C clients/go/tests/brokers build -o $(abspath target/brokers/go)/ ./...

# The adapters' own tests: against the real brokers (brokers/launch.py,
# started once per adapter's test binary) and Redis with the module and the
# Functions edition, what the scenario cannot tell apart.
test-client-go-adapters: $(if $(REDIS_IDEM_MODULE),,build) brokers brokers-consumers-go
	@echo "== clients/go adapters: Kafka, RabbitMQ, NATS JetStream, Redis Streams"
	for m in $(GO_ADAPTERS); do \
		GOTOOLCHAIN=auto REDIS_IDEM_MODULE="$(GO_CLIENT_MODULE)" REDIS_SERVER="$(or $(REDIS_SERVER),$(REDIS7_SERVER))" \
			$(GO_CLIENT_GO) -C clients/go/$$m test -race -count=1 ./... || exit 1; done
