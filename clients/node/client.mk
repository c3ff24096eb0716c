# clients/node: the redis-idem npm package (TypeScript, ESM + CJS), included
# by the Makefile's test-clients. `make test-client-node` installs Node.js
# and npm if missing, `npm ci` in clients/node (its `prepare` builds dist/
# with tsc), then runs the package's tests (node --test) on each server:
# - Redis 7.0: the conformance cases (clients/conformance/cases.json) on the
#   module and the Functions edition, each standalone, as a primary with a
#   replica and under a Sentinel, and on a 3-node cluster (side by side,
#   each on its own servers), the other tests, and the 30-second heartbeat
#   test (it proves the library's timer, which no server changes: once);
# - Redis 8.2: the conformance cases on the module (standalone, replicated,
#   Sentinel), the other tests;
# - Valkey 9.1: the conformance cases on the module and the Functions
#   edition (standalone, replicated, Sentinel), the other tests;
# then checks that the `npm pack` tarball installs into a scratch project
# and imports as ESM and as CJS.
# REDIS_IDEM_MODULE=<so> tests that build of the module instead of building
# target/release/libredis_idem.so first.
NODE_CLIENT_DIR := clients/node
NODE_CLIENT_MODULE = $(if $(REDIS_IDEM_MODULE),$(abspath $(REDIS_IDEM_MODULE)),$(CURDIR)/$(MODULE))
NODE_CLIENT_TESTS := $(NODE_CLIENT_DIR)/test/*.test.mjs
NODE_CLIENT_RUN = REDIS_IDEM_MODULE="$(NODE_CLIENT_MODULE)" node --test --test-concurrency=2
NODE_CLIENT_TOPOLOGIES = replicated,sentinel
NODE_CLIENT_FUNCTIONS = functions,replicated-functions,sentinel-functions

.PHONY: test-client-node node-client-deps

node-client-deps:
	@command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || { \
		echo "node-client: installing nodejs and npm"; \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y nodejs npm; }
	@# npm ci (whose `prepare` builds) when node_modules is missing or older than the lock file; else build alone.
	cd $(NODE_CLIENT_DIR) && \
	if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then \
		npm ci --no-audit --no-fund --loglevel=error; \
	else npm run --silent build; fi

test-client-node: $(if $(REDIS_IDEM_MODULE),,build) redis8 valkey node-client-deps
	@echo "== clients/node on Redis 7.0 ($(REDIS7_SERVER)): module, Functions edition (standalone, replicated, Sentinel), cluster; the 30-second heartbeat and the failover tests"
	REDIS_SERVER="$(REDIS7_SERVER)" IDEM_CONFIGS=module,$(NODE_CLIENT_TOPOLOGIES),$(NODE_CLIENT_FUNCTIONS),cluster IDEM_FAILOVER=1 $(NODE_CLIENT_RUN) \
		$(NODE_CLIENT_TESTS) $(NODE_CLIENT_DIR)/test/long/*.test.mjs
	@echo "== clients/node on Redis 8.2: module (standalone, replicated, Sentinel)"
	REDIS_SERVER="$(REDIS8_SERVER)" IDEM_CONFIGS=module,$(NODE_CLIENT_TOPOLOGIES) $(NODE_CLIENT_RUN) $(NODE_CLIENT_TESTS)
	@echo "== clients/node on Valkey 9.1: module, Functions edition (standalone, replicated, Sentinel)"
	REDIS_SERVER="$(VALKEY_SERVER)" IDEM_CONFIGS=module,$(NODE_CLIENT_TOPOLOGIES),$(NODE_CLIENT_FUNCTIONS) $(NODE_CLIENT_RUN) $(NODE_CLIENT_TESTS)
	cd $(NODE_CLIENT_DIR) && node scripts/check-pack.mjs

# The consumer program brokers/scenario.py runs for node-streams, node-amqp
# and node-kafka (clients/conformance/brokers.json): test/brokers/consumer.mjs,
# on dist/. `make test-client-node-brokers`: the adapters' own tests against
# a real RabbitMQ and a real Kafka (test/brokers/*.test.mjs, each file its
# broker; the Streams adapter's tests are in the main suite).
.PHONY: brokers-consumers-node test-client-node-brokers
brokers-consumers-node: node-client-deps
BROKERS_CONSUMER_TARGETS += brokers-consumers-node
BROKERS_LIBRARY_TESTS += test-client-node-brokers

test-client-node-brokers: $(if $(REDIS_IDEM_MODULE),,build) brokers node-client-deps
	REDIS_SERVER="$(REDIS7_SERVER)" $(NODE_CLIENT_RUN) $(NODE_CLIENT_DIR)/test/brokers/*.test.mjs
