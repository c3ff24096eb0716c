package idemstreams

import (
	"context"
	"fmt"

	idem "github.com/redis-idem/redis-idem/clients/go"
	"github.com/redis-idem/redis-idem/clients/go/internal/broker"
	"github.com/redis/go-redis/v9"
)

// Handle runs one entry of the group through the Idem and settles it: the
// entry's XACK runs with its DONE (in the same round trip on the module,
// by one script; right after it on the Functions edition), and alone for
// a replay; an entry Busy, failed, or whose DONE was not confirmed is left
// pending (XAUTOCLAIM brings it back after ClaimIdle); a dead letter
// (Exhausted, Mismatch, no key) is added to the dead-letter stream and
// acknowledged in one MULTI. While the work runs each heartbeat also
// resets the entry's idle time (XCLAIM ... JUSTID), so that no other
// consumer takes it over.
func (c *Consumer[T]) Handle(ctx context.Context, entry redis.XMessage) {
	key, err := c.opts.Key(entry)
	var out idem.Outcome[T]
	var failed error // the handler's own
	if err == nil {
		opts := []idem.CallOption{
			idem.WithAck(idem.AckCmd{Name: "XACK", Keys: []string{c.stream}, Args: []any{c.group, entry.ID}}),
			idem.WithBeat(func(*idem.Job) { go c.touch(entry.ID) }),
		}
		if c.opts.Payload != nil {
			opts = append(opts, idem.WithPayload(c.opts.Payload(entry)))
		}
		out, err = idem.Process(ctx, c.idem, key, func(ctx context.Context, job *idem.Job) (v T, err error) {
			v, err = c.handle(ctx, job, entry)
			failed = err
			return v, err
		}, opts...)
	}
	decision := broker.Decide(err, failed, 0, ctx.Err() != nil)
	if decision.Report {
		c.report(fmt.Errorf("idemstreams: entry %s left pending: %w", entry.ID, err))
	}
	switch decision.Verdict {
	case broker.Ack:
		if !out.Acked {
			err = c.rdb.XAck(context.WithoutCancel(ctx), c.stream, c.group, entry.ID).Err()
		}
	case broker.DeadLetter:
		err = c.deadLetter(context.WithoutCancel(ctx), entry, decision.Err)
	default:
		err = nil // left pending
	}
	if err != nil {
		c.report(fmt.Errorf("idemstreams: entry %s: %w", entry.ID, err))
		return
	}
	c.counters.Count(decision.Verdict)
}

// touch resets an entry's idle time, keeping it this consumer's.
func (c *Consumer[T]) touch(id string) {
	err := c.rdb.XClaimJustID(context.Background(), &redis.XClaimArgs{Stream: c.stream, Group: c.group,
		Consumer: c.consumer, MinIdle: 0, Messages: []string{id}}).Err()
	if err != nil {
		c.report(fmt.Errorf("idemstreams: XCLAIM of %s at a heartbeat: %w", id, err))
	}
}

// deadLetter adds the entry, where it came from and the error to the
// dead-letter stream and acknowledges it, in one MULTI: both or neither.
func (c *Consumer[T]) deadLetter(ctx context.Context, entry redis.XMessage, cause error) error {
	values := make(map[string]any, len(entry.Values)+2)
	for k, v := range entry.Values {
		values[k] = v
	}
	values[OriginalIDField] = entry.ID
	values[ErrorField] = cause.Error()
	_, err := c.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.XAdd(ctx, &redis.XAddArgs{Stream: c.opts.DeadLetterStream(c.stream), Values: values})
		p.XAck(ctx, c.stream, c.group, entry.ID)
		return nil
	})
	return err
}
