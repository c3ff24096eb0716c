# The Java library (clients/java, Maven: redis-idem over Jedis and Lettuce)
# and its tests; included by the top Makefile, whose test-clients runs
# test-client-java.
#
#   make test-client-java   `mvn verify` in one JVM: every conformance case
#       through Jedis and through Lettuce on the module (Redis 7.0, Redis
#       8.2, Valkey 9.1) and the Functions edition (Redis 7.0, Valkey 9.1),
#       each on a server, a primary with a replica and a primary watched by
#       a Sentinel (redis-server --sentinel, valkey-server --sentinel), and
#       on a 3-node cluster, each topology shared by its cases (JUnit runs
#       the configurations side by side), plus the library's own tests (a
#       killed worker JVM, Lettuce's async front end, batches, a Sentinel
#       failover under load with durability, the servlet filter). Maven and a JDK 17 come from
#       Debian's apt when mvn or javac is missing; Maven's repository is
#       kept in target/client-java-m2, so later runs on the machine download
#       nothing (`make clean` removes it with the rest of target/).
#
# REDIS_IDEM_MODULE=<path.so> tests that build of the module instead of
# building target/release/libredis_idem.so first; REDIS_SERVER=<binary>
# runs every configuration on that one server binary.

JAVA_CLIENT_M2     := $(abspath target/client-java-m2)
JAVA_CLIENT_MODULE := $(if $(REDIS_IDEM_MODULE),$(abspath $(REDIS_IDEM_MODULE)),$(abspath $(MODULE)))

.PHONY: test-client-java client-java-tools

client-java-tools:
	@if ! command -v mvn >/dev/null 2>&1 || ! command -v javac >/dev/null 2>&1; then \
		echo "client-java: installing maven and openjdk-17-jdk-headless"; \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y maven openjdk-17-jdk-headless; \
	fi

test-client-java: $(if $(REDIS_IDEM_MODULE),,build) redis8 valkey client-java-tools
	@echo "== clients/java: module on Redis 7.0, 8.2, Valkey 9.1; Functions edition on Redis 7.0, Valkey 9.1; a 3-node cluster"
	REDIS_IDEM_MODULE="$(JAVA_CLIENT_MODULE)" REDIS7_SERVER="$(REDIS7_SERVER)" \
	REDIS8_SERVER="$(REDIS8_SERVER)" VALKEY_SERVER="$(VALKEY_SERVER)" \
		mvn -q -B -Dmaven.repo.local=$(JAVA_CLIENT_M2) -f clients/java/pom.xml verify

# The broker adapters (clients/java/adapters/<broker>, one Maven module
# each) build against the library installed into the tests' repository.
# Each module's scenario program lives in its test sources; its classpath
# is written to target/brokers/java/<module>.classpath for
# clients/java/adapters/run, which clients/conformance/brokers.json's java
# rows call.
JAVA_LIBRARY_INSTALLED := $(JAVA_CLIENT_M2)/.redis-idem-installed
JAVA_LIBRARY_SOURCES   := clients/java/pom.xml $(shell find clients/java/src/main -type f 2>/dev/null)
JAVA_ADAPTER_MODULES   := $(shell sed -n 's:.*<module>\([a-z-]*\)</module>.*:\1:p' clients/java/adapters/pom.xml)
MVN_JAVA := mvn -q -B -Dmaven.repo.local=$(JAVA_CLIENT_M2)

.PHONY: client-java-installed brokers-consumers-java
client-java-installed: $(JAVA_LIBRARY_INSTALLED)
$(JAVA_LIBRARY_INSTALLED): $(JAVA_LIBRARY_SOURCES) | client-java-tools
	$(MVN_JAVA) -f clients/java/pom.xml install -DskipTests
	@touch $@

BROKERS_CONSUMER_TARGETS += brokers-consumers-java
brokers-consumers-java: client-java-installed
	@mkdir -p target/brokers/java
	$(if $(JAVA_ADAPTER_MODULES),$(MVN_JAVA) -f clients/java/adapters/pom.xml test-compile)
	@for m in $(JAVA_ADAPTER_MODULES); do \
		$(MVN_JAVA) -f clients/java/adapters/$$m/pom.xml dependency:build-classpath \
			-Dmdep.includeScope=test -Dmdep.outputFile=$(abspath target/brokers/java)/$$m.classpath || exit 1; \
	done

# The adapters' own tests (each module starts the real broker it needs, once,
# with brokers/launch.py) run in test-brokers.
.PHONY: test-client-java-adapters
BROKERS_LIBRARY_TESTS += test-client-java-adapters
test-client-java-adapters: $(if $(REDIS_IDEM_MODULE),,build) brokers brokers-consumers-java
	@echo "== clients/java/adapters: $(JAVA_ADAPTER_MODULES), each against its real broker"
	REDIS_IDEM_MODULE="$(JAVA_CLIENT_MODULE)" REDIS7_SERVER="$(REDIS7_SERVER)" \
		$(MVN_JAVA) -f clients/java/adapters/pom.xml verify
