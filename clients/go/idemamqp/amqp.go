// Package idemamqp runs RabbitMQ deliveries through an idem.Idem, with
// amqp091-go: manual acknowledgements, each delivery acknowledged only once
// its record is done, Busy and failures given back through retry queues
// whose TTL dead-letters them back, Exhausted rejected to the queue's
// dead-letter exchange (docs/clients.md, "Consumers of brokers").
//
//	c, err := idemamqp.New(consumer, ch, "orders", handle, idemamqp.Options{})
//	deliveries, err := ch.Consume("orders", "", false, false, false, false, nil)
//	err = c.Run(ctx, deliveries) // until ctx ends or the channel closes
package idemamqp

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	idem "github.com/redis-idem/redis-idem/clients/go"
	"github.com/redis-idem/redis-idem/clients/go/internal/broker"
)

// Handler is the work for one delivery: its value is the record's result
// (replayed to a duplicate's Process, not used by the consumer).
type Handler[T any] func(ctx context.Context, job *idem.Job, d *amqp.Delivery) (T, error)

// Options configure a Consumer; the zero value of each is its default.
type Options struct {
	// Key is the delivery's key in the Idem: default its message_id (a
	// publisher's retry keeps it, unlike the delivery tag). A delivery
	// without one is rejected to the dead letter (idem.ErrMissingKey).
	Key func(d *amqp.Delivery) (string, error)
	// Payload, when set, claims with it (idem.WithPayload): a key seen
	// again with another payload is dead-lettered (idem.ErrMismatch).
	Payload func(d *amqp.Delivery) []byte
	// RetryDelay is how long a delivery whose work failed (or whose DONE
	// was not confirmed) first waits before it comes again: default
	// 100 ms, doubling each time the message came back from a retry queue
	// (its x-death counts), at most 30 s. A Busy one waits for its
	// holder's lease left.
	RetryDelay time.Duration
	// RetryQueues are the delays of the retry queues (<queue>.retry.<ms>,
	// declared on first use, each with that TTL, dead-lettering back to
	// the queue): a delay takes the shortest one at least as long, the
	// longest at most. Default 100 ms doubling to 51.2 s.
	RetryQueues []time.Duration
	// Concurrency is how many deliveries Run handles at once: default 1
	// (set the channel's Qos prefetch to at least as many).
	Concurrency int
	// OnError is told what the consumer could not do (an ack, a retry
	// copy), and why a delivery was given back when neither the handler
	// nor Busy, a lost lease, an unconfirmed DONE or NotDurable was the
	// cause: a claim or DONE the server refused (NOPERM, WRONGTYPE), a
	// lost connection, an OnRun hook that failed. Default: nothing.
	OnError func(err error)
}

// Stats are the Idem's counters and the consumer's: deliveries
// acknowledged, held back (given back through a retry queue), rejected to
// the dead letter.
type Stats = broker.Stats

// Consumer handles one channel's deliveries of one queue.
type Consumer[T any] struct {
	idem     *idem.Idem
	ch       *amqp.Channel
	queue    string
	handle   Handler[T]
	opts     Options
	counters broker.Counters
}

// New makes a Consumer for queue's deliveries on ch (the channel they
// arrive on: acknowledgements go back on it). It puts ch in confirm mode:
// a retry copy counts only once the broker has it.
func New[T any](i *idem.Idem, ch *amqp.Channel, queue string, handle Handler[T], opts Options) (*Consumer[T], error) {
	if queue == "" {
		return nil, errors.New("idemamqp: the queue's name is needed (its retry queues dead-letter back to it)")
	}
	if opts.Key == nil {
		opts.Key = messageID
	}
	if opts.RetryDelay <= 0 {
		opts.RetryDelay = broker.DefaultRetryDelay
	}
	if len(opts.RetryQueues) == 0 {
		for d := 100 * time.Millisecond; d <= broker.MaxRetryDelay*2; d *= 2 {
			opts.RetryQueues = append(opts.RetryQueues, d)
		}
	}
	for _, d := range opts.RetryQueues {
		if d < time.Millisecond {
			return nil, fmt.Errorf("idemamqp: a retry queue's delay must be at least 1 ms (got %v)", d)
		}
	}
	opts.Concurrency = max(opts.Concurrency, 1)
	if err := ch.Confirm(false); err != nil {
		return nil, fmt.Errorf("idemamqp: confirm mode: %w", err)
	}
	return &Consumer[T]{idem: i, ch: ch, queue: queue, handle: handle, opts: opts}, nil
}

func messageID(d *amqp.Delivery) (string, error) {
	if d.MessageId == "" {
		return "", broker.MissingKey("the delivery has no message_id")
	}
	return d.MessageId, nil
}

// QueueArguments are a quorum queue's arguments for i's consumers: the
// dead-letter exchange, and a delivery-limit above i's MaxTries (twice it,
// at least 20), so that the broker never dead-letters a message the Idem
// would still try (each try is a delivery; a crashed consumer's is one
// more).
func QueueArguments(i *idem.Idem, deadLetterExchange string) amqp.Table {
	return amqp.Table{"x-queue-type": "quorum", "x-dead-letter-exchange": deadLetterExchange,
		"x-delivery-limit": int64(max(20, 2*i.MaxTries()))}
}

// Stats is a snapshot of the counters.
func (c *Consumer[T]) Stats() Stats { return c.counters.Stats(c.idem) }

// Run handles deliveries, Concurrency at a time, until ctx ends or the
// channel closes. A delivery in hand when ctx ends is finished (its work,
// its DONE, its ack); those not taken yet are left unacknowledged for the
// broker to requeue when the channel closes.
func (c *Consumer[T]) Run(ctx context.Context, deliveries <-chan amqp.Delivery) error {
	var wg sync.WaitGroup
	for range c.opts.Concurrency {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case d, ok := <-deliveries:
					if !ok || ctx.Err() != nil {
						return // unacknowledged: requeued with the channel
					}
					c.Handle(context.WithoutCancel(ctx), d)
				}
			}
		})
	}
	wg.Wait()
	return nil
}

// Handle runs one delivery through the Idem and settles it with the broker:
// acknowledged once its record is done (or a replay), given back through a
// retry queue (Busy: after the holder's lease left; a failure, a DONE not
// confirmed, a lost lease: after RetryDelay), rejected to the queue's
// dead-letter exchange (Exhausted, Mismatch, no key). With ctx ended, a
// claim still waiting is given up and the delivery requeued.
func (c *Consumer[T]) Handle(ctx context.Context, d amqp.Delivery) {
	key, err := c.opts.Key(&d)
	var failed error // the handler's own
	if err == nil {
		var opts []idem.CallOption
		if c.opts.Payload != nil {
			opts = append(opts, idem.WithPayload(c.opts.Payload(&d)))
		}
		_, err = idem.Process(ctx, c.idem, key, func(ctx context.Context, job *idem.Job) (v T, err error) {
			v, err = c.handle(ctx, job, &d)
			failed = err
			return v, err
		}, opts...)
	}
	retry := broker.Backoff(c.opts.RetryDelay, c.heldBefore(&d))
	decision := broker.Decide(err, failed, retry, ctx.Err() != nil)
	if decision.Report {
		c.report(fmt.Errorf("idemamqp: message %q given back: %w", d.MessageId, err))
	}
	switch decision.Verdict {
	case broker.Ack:
		err = d.Ack(false)
	case broker.DeadLetter:
		err = d.Reject(false)
	case broker.HoldBack:
		err = c.giveBack(ctx, &d, decision.Delay)
	case broker.Leave:
		err = d.Nack(false, true)
	}
	if err != nil {
		c.report(fmt.Errorf("idemamqp: message %q: %w", d.MessageId, err))
		return
	}
	c.counters.Count(decision.Verdict)
}

func (c *Consumer[T]) report(err error) {
	if c.opts.OnError != nil {
		c.opts.OnError(err)
	}
}
