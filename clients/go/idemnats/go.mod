// The NATS JetStream adapter of the Go library (nats.go's jetstream), in a
// module of its own so that only its users get the NATS client.
module github.com/redis-idem/redis-idem/clients/go/idemnats

go 1.26.0

require (
	github.com/nats-io/nats.go v1.55.0
	github.com/redis-idem/redis-idem/clients/go v0.2.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/klauspost/compress v1.20.0 // indirect
	github.com/nats-io/nkeys v0.4.16 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	github.com/redis/go-redis/v9 v9.23.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/crypto v0.57.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)

// A checkout's library; a user of the published module drops this line.
replace github.com/redis-idem/redis-idem/clients/go => ../
