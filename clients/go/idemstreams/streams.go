// Package idemstreams consumes a Redis Stream through a consumer group
// and an idem.Idem: entries read with XREADGROUP, those another consumer
// left pending past the lease taken over with XAUTOCLAIM, each entry's
// DONE and XACK in one round trip, Busy and failed entries left pending,
// dead letters moved to a stream of their own and acknowledged in one
// MULTI (docs/clients.md, "Consumers of brokers").
//
//	c := idemstreams.New(consumer, "orders", "billing", "worker-1", handle, idemstreams.Options{})
//	err := c.Run(ctx) // until ctx ends
package idemstreams

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	idem "github.com/redis-idem/redis-idem/clients/go"
	"github.com/redis-idem/redis-idem/clients/go/internal/broker"
	"github.com/redis/go-redis/v9"
)

// KeyField is the entry's field where the default key function finds its
// key.
const KeyField = "idem-key"

// The fields a dead letter adds to the entry's own.
const (
	OriginalIDField = "original-id"
	ErrorField      = "error"
)

// Handler is the work for one entry: its value is the record's result
// (replayed to a duplicate's Process, not used by the consumer).
type Handler[T any] func(ctx context.Context, job *idem.Job, entry redis.XMessage) (T, error)

// Options configure a Consumer; the zero value of each is its default.
type Options struct {
	// Key is the entry's key in the Idem: default its idem-key field (a
	// producer's retry keeps it, unlike the entry's id). An entry without
	// one is dead-lettered (idem.ErrMissingKey).
	Key func(entry redis.XMessage) (string, error)
	// Payload, when set, claims with it (idem.WithPayload): a key seen
	// again with another payload is dead-lettered (idem.ErrMismatch).
	Payload func(entry redis.XMessage) []byte
	// Concurrency is how many entries are handled at once: default 8.
	Concurrency int
	// ClaimIdle: an entry pending that long (its consumer dead, stopped, or
	// the entry Busy or failed) is taken over with XAUTOCLAIM: default the
	// Idem's lease. The heartbeat of an entry at work keeps it from idling.
	ClaimIdle time.Duration
	// Block is XREADGROUP's BLOCK, and the longest between two
	// XAUTOCLAIM rounds: default ClaimIdle/2, at most 2 s.
	Block time.Duration
	// DeadLetterStream names the stream's dead-letter stream: default
	// stream + ":dlq" (in a cluster both need one hash tag: "{orders}").
	DeadLetterStream func(stream string) string
	// OnError is told what the consumer could not do and will try again
	// (a read, an XACK, a dead letter), and why an entry was left pending
	// when neither the handler nor Busy, a lost lease, an unconfirmed DONE or
	// NotDurable was the cause: a claim or DONE the server refused
	// (NOPERM, WRONGTYPE), a lost connection, an OnRun hook that failed.
	// Default: nothing.
	OnError func(err error)
}

// Stats are the Idem's counters and the consumer's: entries acknowledged,
// held back (left pending), dead-lettered.
type Stats = broker.Stats

// Consumer is one consumer of a stream's group, on the Idem's own server.
type Consumer[T any] struct {
	idem                    *idem.Idem
	rdb                     redis.UniversalClient
	stream, group, consumer string
	handle                  Handler[T]
	opts                    Options
	counters                broker.Counters
	mu                      sync.Mutex
	inHand                  map[string]bool // entry ids being handled here
	cursor                  string          // XAUTOCLAIM's
	lastClaim               time.Time
}

// New makes a Consumer named consumer in stream's group (XGROUP CREATE it
// first), on the Idem's client.
func New[T any](i *idem.Idem, stream, group, consumer string, handle Handler[T], opts Options) *Consumer[T] {
	if opts.Key == nil {
		opts.Key = fieldKey
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = 8
	}
	if opts.ClaimIdle <= 0 {
		opts.ClaimIdle = i.Lease()
	}
	if opts.Block <= 0 {
		opts.Block = min(opts.ClaimIdle/2, 2*time.Second)
	}
	if opts.DeadLetterStream == nil {
		opts.DeadLetterStream = func(stream string) string { return stream + ":dlq" }
	}
	return &Consumer[T]{idem: i, rdb: i.Client(), stream: stream, group: group, consumer: consumer,
		handle: handle, opts: opts, inHand: map[string]bool{}, cursor: "0-0"}
}

func fieldKey(entry redis.XMessage) (string, error) {
	if k, ok := entry.Values[KeyField].(string); ok && k != "" {
		return k, nil
	}
	return "", broker.MissingKey("the entry has no " + KeyField + " field")
}

// Stats is a snapshot of the counters.
func (c *Consumer[T]) Stats() Stats { return c.counters.Stats(c.idem) }

// Run reads and handles entries until ctx ends, then lets the entries in
// hand finish and returns nil. What it leaves pending another consumer
// takes over after ClaimIdle.
func (c *Consumer[T]) Run(ctx context.Context) error {
	slots := make(chan struct{}, c.opts.Concurrency)
	var wg sync.WaitGroup
	defer wg.Wait()
	work := context.WithoutCancel(ctx)
	for ctx.Err() == nil {
		free := reserve(slots)
		entries, err := c.read(ctx, free, free == cap(slots))
		if err != nil && ctx.Err() == nil {
			c.report(err)
			sleep(ctx, c.opts.Block)
		}
		for n := 0; n < free; n++ {
			if n >= len(entries) {
				<-slots
				continue
			}
			entry := entries[n]
			wg.Go(func() {
				defer func() { <-slots }()
				c.Handle(work, entry)
				c.mu.Lock()
				delete(c.inHand, entry.ID)
				c.mu.Unlock()
			})
		}
	}
	return nil
}

// reserve waits for a free slot and takes every free one: how many.
func reserve(slots chan struct{}) int {
	slots <- struct{}{}
	for n := 1; ; n++ {
		select {
		case slots <- struct{}{}:
		default:
			return n
		}
	}
}

// read takes up to n entries: those pending past ClaimIdle first (an
// XAUTOCLAIM round when one is due), else new ones (blocking only when
// nothing is in hand, so that a full round does not wait).
func (c *Consumer[T]) read(ctx context.Context, n int, idle bool) ([]redis.XMessage, error) {
	if time.Since(c.lastClaim) >= c.opts.Block {
		entries, err := c.autoclaim(ctx, n)
		if err != nil || len(entries) > 0 {
			return entries, err
		}
	}
	block := c.opts.Block
	if !idle {
		block = -1 // no BLOCK
	}
	streams, err := c.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: c.group, Consumer: c.consumer,
		Streams: []string{c.stream, ">"}, Count: int64(n), Block: block}).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("idemstreams: XREADGROUP: %w", err)
	}
	var out []redis.XMessage
	for _, s := range streams {
		out = append(out, s.Messages...)
	}
	return c.mine(out), nil
}

// autoclaim takes over up to n entries pending past ClaimIdle, walking the
// group's pending entries with XAUTOCLAIM's cursor.
func (c *Consumer[T]) autoclaim(ctx context.Context, n int) ([]redis.XMessage, error) {
	entries, next, err := c.rdb.XAutoClaim(ctx, &redis.XAutoClaimArgs{Stream: c.stream, Group: c.group,
		Consumer: c.consumer, MinIdle: c.opts.ClaimIdle, Start: c.cursor, Count: int64(n)}).Result()
	if err != nil {
		return nil, fmt.Errorf("idemstreams: XAUTOCLAIM: %w", err)
	}
	c.cursor = next
	if next == "0-0" {
		c.lastClaim = time.Now() // a whole round: the next one after Block
	}
	return c.mine(entries), nil
}

// mine keeps the entries not in hand here already (an entry at work whose
// heartbeat is late comes back to its own consumer), marking them in hand.
func (c *Consumer[T]) mine(entries []redis.XMessage) []redis.XMessage {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := entries[:0]
	for _, e := range entries {
		if c.inHand[e.ID] {
			continue
		}
		c.inHand[e.ID] = true
		out = append(out, e)
	}
	return out
}

func (c *Consumer[T]) report(err error) {
	if c.opts.OnError != nil && err != nil {
		c.opts.OnError(err)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
