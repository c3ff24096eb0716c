# The broker adapters against real brokers (brokers/README.md), included by
# the top Makefile. `make test-brokers` runs clients/conformance/brokers.json's
# scenario for every adapter it lists, one target per broker (each starts its
# broker once), side by side under make -j.
#
# Each language that has adapters defines brokers-consumers-<language> in its
# clients/<language>/client.mk (building its consumer programs); the
# scenario's own Python (redis-py and the brokers' clients) lives in
# target/brokers/venv, with the Python library installed from the checkout
# each time (as client-python-venv does) with its adapters' extras. A client.mk adds its target with
# `BROKERS_CONSUMER_TARGETS += brokers-consumers-<language>`.

BROKERS_VENV   := target/brokers/venv
BROKERS_PYTHON := $(BROKERS_VENV)/bin/python
BROKERS_PY_DEPS := redis confluent-kafka pika aio-pika nats-py celery
# The Python library's adapters the consumer programs import, with the
# extras that bring their brokers' clients.
BROKERS_PY_EXTRAS := rabbitmq,aio-pika,celery,kafka,nats,streams
BROKER_NAMES   := kafka rocketmq rabbitmq celery nats streams

.PHONY: brokers-venv test-brokers $(addprefix test-brokers-,$(BROKER_NAMES))

# (A stamp, as pyenv's: the library is installed again only when its
# sources changed, so suites side by side never build it at once.)
brokers-venv: $(BROKERS_VENV)/.redis-idem-installed
$(BROKERS_VENV)/.redis-idem-installed: $(PY_LIBRARY_SOURCES)
	$(call python-venv,$(BROKERS_VENV),redis confluent_kafka pika aio_pika nats celery,$(BROKERS_PY_DEPS),brokers)
	@$(BROKERS_VENV)/bin/pip install -q --force-reinstall --no-deps ./clients/python
	@$(BROKERS_VENV)/bin/pip install -q "./clients/python[$(BROKERS_PY_EXTRAS)]"
	@touch $@

# The libraries' own adapter tests against the real brokers run here too:
# a client.mk adds its target with `BROKERS_LIBRARY_TESTS += <target>`.
test-brokers: $(addprefix test-brokers-,$(BROKER_NAMES)) $(BROKERS_LIBRARY_TESTS)

# Every consumer program is built before any scenario starts a broker.
BROKERS_PREREQS = build brokers brokers-venv $(BROKERS_CONSUMER_TARGETS)

$(addprefix test-brokers-,$(BROKER_NAMES)): test-brokers-%: $(BROKERS_PREREQS)
	@echo "== brokers: $* adapters, module and Functions edition"
	$(BROKERS_PYTHON) brokers/scenario.py --broker $*
