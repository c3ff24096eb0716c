# The broker adapters against real brokers (brokers/README.md), included by
# the top Makefile. `make test-brokers` runs clients/conformance/brokers.json's
# scenario for every adapter it lists, one target per broker (each starts its
# broker once), side by side under make -j.
#
# Each language that has adapters defines brokers-consumers-<language> in its
# clients/<language>/client.mk (building its consumer programs); the
# scenario's own Python (redis-py and the brokers' clients) lives in
# target/brokers/venv. A client.mk adds its target with
# `BROKERS_CONSUMER_TARGETS += brokers-consumers-<language>`.

BROKERS_VENV   := target/brokers/venv
BROKERS_PYTHON := $(BROKERS_VENV)/bin/python
BROKERS_PY_DEPS := redis confluent-kafka pika aio-pika nats-py celery
BROKER_NAMES   := kafka rocketmq rabbitmq celery nats streams

.PHONY: brokers-venv test-brokers $(addprefix test-brokers-,$(BROKER_NAMES))

brokers-venv:
	$(call python-venv,$(BROKERS_VENV),redis confluent_kafka pika aio_pika nats celery,$(BROKERS_PY_DEPS),brokers)

test-brokers: $(addprefix test-brokers-,$(BROKER_NAMES))

# Every consumer program is built before any scenario starts a broker.
BROKERS_PREREQS = build brokers brokers-venv $(BROKERS_CONSUMER_TARGETS)

$(addprefix test-brokers-,$(BROKER_NAMES)): test-brokers-%: $(BROKERS_PREREQS)
	@echo "== brokers: $* adapters, module and Functions edition"
	$(BROKERS_PYTHON) brokers/scenario.py --broker $*
