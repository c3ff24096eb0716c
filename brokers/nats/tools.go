//go:build tools

// Package nats pins the NATS server's module, which `go build
// github.com/nats-io/nats-server/v2` builds into target/brokers/.
package nats

import _ "github.com/nats-io/nats-server/v2"
