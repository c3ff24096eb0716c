// The RabbitMQ adapter of the Go library (amqp091-go), in a module of its
// own so that only its users get the AMQP client.
module github.com/redis-idem/redis-idem/clients/go/idemamqp

go 1.26.0

require (
	github.com/rabbitmq/amqp091-go v1.16.0
	github.com/redis-idem/redis-idem/clients/go v0.2.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/redis/go-redis/v9 v9.23.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)

// A checkout's library; a user of the published module drops this line.
replace github.com/redis-idem/redis-idem/clients/go => ../
