// Package idem is the Go library of redis-idem: idempotent message
// consumption on Redis, with go-redis v9.
//
// [Process] runs a message's work at most once per key while the key's
// record lives: it claims the key (IDEM.CLAIM), keeps the lease alive with
// a heartbeat while the work runs, and records the result (IDEM.DONE) or
// gives the claim back (IDEM.RELEASE) when the work fails or panics. A
// redelivery of a done key gets the stored result without running the
// work; a copy that arrives while another worker is at work waits for it.
// [ProcessMany] does the same for a batch, [Idem.Middleware] for HTTP
// requests under the Idempotency-Key header, and the typed commands
// ([Idem.Claim], [Idem.Done], ...) are there for loops of your own.
//
// It works on both editions of the server side, asked of the server at the
// first command: the redis-idem module, and the Functions edition
// (functions/idem.lua) for managed Redis, where WAIT becomes polling and
// the batch helpers pipeline single commands. Every duration is a
// [time.Duration]; durations sent to the server must be whole seconds.
//
// The contract it keeps, the same in every language, is docs/clients.md
// of the redis-idem repository.
package idem
