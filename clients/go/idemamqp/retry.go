package idemamqp

import (
	"context"
	"fmt"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// giveBack makes the delivery come again after delay without spinning: a
// copy to the retry queue of that delay (confirmed by the broker), whose
// TTL dead-letters it back to the queue, then the delivery acknowledged.
// Should the copy fail, the delivery is kept for the delay and then
// requeued.
func (c *Consumer[T]) giveBack(ctx context.Context, d *amqp.Delivery, delay time.Duration) error {
	err := c.copyToRetry(ctx, d, delay)
	if err == nil {
		return d.Ack(false)
	}
	c.report(err)
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
	return d.Nack(false, true)
}

// heldBefore is how often the message came back from a retry queue of
// this consumer's queue (x-death's counts).
func (c *Consumer[T]) heldBefore(d *amqp.Delivery) int {
	deaths, _ := d.Headers["x-death"].([]any)
	n := 0
	for _, death := range deaths {
		t, _ := death.(amqp.Table)
		queue, _ := t["queue"].(string)
		count, _ := t["count"].(int64)
		if strings.HasPrefix(queue, c.queue+".retry.") {
			n += int(count)
		}
	}
	return n
}

// retryQueue is the retry queue for delay: the shortest one at least as
// long, the longest at most.
func (c *Consumer[T]) retryQueue(delay time.Duration) (string, time.Duration) {
	chosen := c.opts.RetryQueues[len(c.opts.RetryQueues)-1]
	for _, d := range c.opts.RetryQueues {
		if d >= delay && d < chosen {
			chosen = d
		}
	}
	return fmt.Sprintf("%s.retry.%d", c.queue, chosen.Milliseconds()), chosen
}

func (c *Consumer[T]) copyToRetry(ctx context.Context, d *amqp.Delivery, delay time.Duration) error {
	name, ttl := c.retryQueue(delay)
	// Declared each time (one round trip, on the rare path): a copy
	// published to a queue deleted since would be dropped.
	_, err := c.ch.QueueDeclare(name, true, false, false, false, amqp.Table{
		"x-message-ttl":             ttl.Milliseconds(),
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": c.queue,
	})
	if err != nil {
		return fmt.Errorf("idemamqp: declaring the retry queue %s: %w", name, err)
	}
	// The same message (properties, headers with x-death so far), without
	// the sender's user id (checked against this connection's) and its
	// own expiration (the retry queue's TTL is the delay).
	copied := amqp.Publishing{Headers: d.Headers, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding,
		DeliveryMode: d.DeliveryMode, Priority: d.Priority, CorrelationId: d.CorrelationId, ReplyTo: d.ReplyTo,
		MessageId: d.MessageId, Timestamp: d.Timestamp, Type: d.Type, AppId: d.AppId, Body: d.Body}
	confirm, err := c.ch.PublishWithDeferredConfirmWithContext(ctx, "", name, false, false, copied)
	if err != nil {
		return fmt.Errorf("idemamqp: the retry copy to %s: %w", name, err)
	}
	ok, err := confirm.WaitContext(ctx)
	switch {
	case err != nil:
		return fmt.Errorf("idemamqp: the retry copy to %s: %w", name, err)
	case !ok:
		return fmt.Errorf("idemamqp: the broker refused the retry copy to %s", name)
	}
	return nil
}
