module github.com/redis-idem/redis-idem/examples/kafka/go

go 1.26.0

require (
	github.com/redis-idem/redis-idem/clients/go v0.2.0
	github.com/redis-idem/redis-idem/clients/go/idemkafka v0.2.0
	github.com/redis/go-redis/v9 v9.23.0
	github.com/twmb/franz-go v1.22.3
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/pierrec/lz4/v4 v4.1.33 // indirect
	github.com/twmb/franz-go/pkg/kmsg v1.15.1 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)

// A checkout's library and adapter; a user of the published modules drops
// these lines.
replace (
	github.com/redis-idem/redis-idem/clients/go => ../../../clients/go
	github.com/redis-idem/redis-idem/clients/go/idemkafka => ../../../clients/go/idemkafka
)
