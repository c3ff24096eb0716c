// The Kafka adapter of the Go library: a poll loop on franz-go, in a module
// of its own so that only its users get franz-go.
module github.com/redis-idem/redis-idem/clients/go/idemkafka

go 1.26.0

require (
	github.com/redis-idem/redis-idem/clients/go v0.2.0
	github.com/twmb/franz-go v1.22.3
	github.com/twmb/franz-go/pkg/kmsg v1.15.1
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/pierrec/lz4/v4 v4.1.33 // indirect
	github.com/redis/go-redis/v9 v9.23.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)

// A checkout's library; a user of the published module drops this line.
replace github.com/redis-idem/redis-idem/clients/go => ../
