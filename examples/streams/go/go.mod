module github.com/redis-idem/redis-idem/examples/streams/go

go 1.26.0

require (
	github.com/redis-idem/redis-idem/clients/go v0.2.0
	github.com/redis-idem/redis-idem/clients/go/idemstreams v0.2.0
	github.com/redis/go-redis/v9 v9.23.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)

// A checkout's library and adapter; a user of the published modules drops
// these lines.
replace (
	github.com/redis-idem/redis-idem/clients/go => ../../../clients/go
	github.com/redis-idem/redis-idem/clients/go/idemstreams => ../../../clients/go/idemstreams
)
