# The Python library (clients/python, package redis-idem) and its tests;
# included by the top Makefile, whose test-clients runs test-client-python.
#
#   make test-client-python   its own venv (target/client-python-venv) with
#       `pip install ./clients/python` (not editable: it proves the package
#       installs) and the test dependencies from PyPI, then the suite (the
#       conformance cases of clients/conformance/cases.json with Idem and
#       AsyncIdem, and the library's own tests) once per server config: the
#       module on Redis 7.0, Redis 8.2 and Valkey 9.1 (each with a 3-node
#       cluster for the cluster cases, a primary and replica for the durable
#       cases, a primary, replica and Sentinel (the server binary with
#       --sentinel) for the Sentinel case and test), and the Functions
#       edition (functions/idem.lua, no module) on Redis 7.0 and Valkey 9.1.
#       The configs are independent targets, so `make -j` runs them side by
#       side (each starts 3-8 servers; two at a time suit 2 cores).
#       The 30-second heartbeat test and the planned failover test (a
#       6-node cluster, every primary failed over in turn) run once, on
#       Redis 7.0 with the module; the RabbitMQ and Celery adapters' tests
#       (tests/rabbitmq: a RabbitMQ node of their own, make brokers) on
#       Redis 7.0 with each edition.
#       The Kafka and NATS adapters' own tests (tests/brokers, against a real
#       Kafka and nats-server from brokers/launch.py: `make brokers`; about
#       90 s) run once too, on Redis 7.0 with the module; the Streams
#       adapter's (tests/test_streams.py) on every config.
#
# REDIS_IDEM_MODULE=<path.so> tests that build of the module instead of
# building target/release/libredis_idem.so first.

PY_CLIENT_VENV   := target/client-python-venv
PY_CLIENT_PYTHON := $(PY_CLIENT_VENV)/bin/python
PY_CLIENT_DEPS   := pytest pytest-asyncio starlette uvicorn httpx
PY_CLIENT_MODULE := $(if $(REDIS_IDEM_MODULE),$(abspath $(REDIS_IDEM_MODULE)),$(abspath $(MODULE)))
# From the checkout's root, so that REDIS_SERVER=... before it reaches pytest
# and redis_idem is imported from the venv, not from clients/python/src.
PY_CLIENT_PYTEST  = REDIS_IDEM_MODULE="$(PY_CLIENT_MODULE)" $(PY_CLIENT_PYTHON) -m pytest -q -p no:cacheprovider \
	-c clients/python/pyproject.toml --rootdir clients/python clients/python/tests
PY_CLIENT_CONFIGS := redis7-module redis8-module valkey-module redis7-functions valkey-functions

.PHONY: test-client-python client-python-venv $(addprefix test-client-python-,$(PY_CLIENT_CONFIGS))

client-python-venv:
	$(call python-venv,$(PY_CLIENT_VENV),pytest pytest_asyncio starlette uvicorn httpx,$(PY_CLIENT_DEPS),client-python)
	$(PY_CLIENT_VENV)/bin/pip install -q --force-reinstall --no-deps ./clients/python
	$(PY_CLIENT_VENV)/bin/pip install -q "./clients/python[rabbitmq,aio-pika,celery,kafka,nats]"

test-client-python: $(addprefix test-client-python-,$(PY_CLIENT_CONFIGS))

PY_CLIENT_PREREQS = $(if $(REDIS_IDEM_MODULE),,build) redis8 valkey client-python-venv

test-client-python-redis7-module: $(PY_CLIENT_PREREQS) brokers
	@echo "== clients/python: Redis 7.0, module (and the 30-second heartbeat, the failover and the brokers' tests: RabbitMQ, Celery, Kafka, NATS)"
	$(PY_CLIENT_PYTEST) --run-long --run-failover --run-brokers

test-client-python-redis8-module: $(PY_CLIENT_PREREQS)
	@echo "== clients/python: Redis 8.2, module"
	REDIS_SERVER="$(REDIS8_SERVER)" $(PY_CLIENT_PYTEST)

test-client-python-valkey-module: $(PY_CLIENT_PREREQS)
	@echo "== clients/python: Valkey 9.1, module"
	REDIS_SERVER="$(VALKEY_SERVER)" $(PY_CLIENT_PYTEST)

test-client-python-redis7-functions: $(PY_CLIENT_PREREQS) brokers
	@echo "== clients/python: Redis 7.0, Functions edition (and the RabbitMQ / Celery tests)"
	$(PY_CLIENT_PYTEST) --edition functions --run-brokers

test-client-python-valkey-functions: $(PY_CLIENT_PREREQS)
	@echo "== clients/python: Valkey 9.1, Functions edition"
	REDIS_SERVER="$(VALKEY_SERVER)" $(PY_CLIENT_PYTEST) --edition functions

# The broker adapters' consumer programs (clients/python/tests/brokers/,
# for brokers/scenario.py): nothing to build but the scenario's venv, which
# installs the library from the checkout with its adapters' extras.
.PHONY: brokers-consumers-python
brokers-consumers-python: brokers-venv
	$(BROKERS_PYTHON) -m py_compile clients/python/tests/brokers/rabbitmq_consumer.py clients/python/tests/brokers/celery_consumer.py clients/python/tests/brokers/consumer.py
BROKERS_CONSUMER_TARGETS += brokers-consumers-python
