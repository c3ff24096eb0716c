// The consumer programs brokers/scenario.py runs for the Go adapters
// (brokers/README.md, "Writing a consumer program"), one per adapter.
module github.com/redis-idem/redis-idem/clients/go/tests/brokers

go 1.26.0

require (
	github.com/nats-io/nats.go v1.55.0
	github.com/rabbitmq/amqp091-go v1.16.0
	github.com/redis-idem/redis-idem/clients/go v0.2.0
	github.com/redis-idem/redis-idem/clients/go/idemamqp v0.2.0
	github.com/redis-idem/redis-idem/clients/go/idemkafka v0.2.0
	github.com/redis-idem/redis-idem/clients/go/idemnats v0.2.0
	github.com/redis-idem/redis-idem/clients/go/idemstreams v0.2.0
	github.com/redis/go-redis/v9 v9.23.0
	github.com/twmb/franz-go v1.22.3
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/nats-io/nkeys v0.4.16 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	github.com/pierrec/lz4/v4 v4.1.33 // indirect
	github.com/twmb/franz-go/pkg/kmsg v1.15.1 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/crypto v0.57.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)

// The checkout's library and adapters.
replace (
	github.com/redis-idem/redis-idem/clients/go => ../../
	github.com/redis-idem/redis-idem/clients/go/idemamqp => ../../idemamqp
	github.com/redis-idem/redis-idem/clients/go/idemkafka => ../../idemkafka
	github.com/redis-idem/redis-idem/clients/go/idemnats => ../../idemnats
	github.com/redis-idem/redis-idem/clients/go/idemstreams => ../../idemstreams
)
