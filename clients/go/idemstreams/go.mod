// The Redis Streams adapter of the Go library, in a module of its own as
// the other adapters are (it needs nothing but the library and go-redis).
module github.com/redis-idem/redis-idem/clients/go/idemstreams

go 1.26.0

require (
	github.com/redis-idem/redis-idem/clients/go v0.2.0
	github.com/redis/go-redis/v9 v9.23.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)

// A checkout's library; a user of the published module drops this line.
replace github.com/redis-idem/redis-idem/clients/go => ../
