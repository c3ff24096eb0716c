// Package idemnats runs NATS JetStream messages through an idem.Idem,
// with nats.go's jetstream package: a jetstream.MessageHandler for a pull
// consumer's Consume, each message acknowledged (a double ack, confirmed
// by the server) only once its record is done, kept in progress while its
// work runs, Busy and failures given back with Nak and a delay, Exhausted
// terminated and copied to a dead-letter subject (docs/clients.md,
// "Consumers of brokers").
//
//	c := idemnats.New(consumer, js, handle, idemnats.Options{})
//	cc, err := cons.Consume(c.MessageHandler(context.Background()))
//	// ... cc.Stop(); <-cc.Closed()
package idemnats

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	idem "github.com/redis-idem/redis-idem/clients/go"
	"github.com/redis-idem/redis-idem/clients/go/internal/broker"
)

// KeyHeader is where the default key function finds a message's key.
const KeyHeader = "Idem-Key"

// The headers of a dead letter (besides the message's own and KeyHeader).
const (
	OriginalSubjectHeader  = "Idem-Original-Subject"
	OriginalSequenceHeader = "Idem-Original-Sequence"
	ErrorHeader            = "Idem-Error"
)

// ackTimeout bounds a double ack and a dead letter's publish.
const ackTimeout = 10 * time.Second

// Handler is the work for one message: its value is the record's result
// (replayed to a duplicate's Process, not used by the consumer).
type Handler[T any] func(ctx context.Context, job *idem.Job, msg jetstream.Msg) (T, error)

// Options configure a Consumer; the zero value of each is its default.
type Options struct {
	// Key is the message's key in the Idem: default its Idem-Key header
	// (a publisher's retry keeps it, unlike the stream sequence). A
	// message without one is dead-lettered (idem.ErrMissingKey).
	Key func(msg jetstream.Msg) (string, error)
	// Payload, when set, claims with it (idem.WithPayload): a key seen
	// again with another payload is dead-lettered (idem.ErrMismatch).
	Payload func(msg jetstream.Msg) []byte
	// RetryDelay is the Nak delay of a message whose work failed (or whose
	// DONE was not confirmed) at its first delivery: default 100 ms,
	// doubling with each delivery, at most 30 s. A Busy one's is its
	// holder's lease left.
	RetryDelay time.Duration
	// DeadLetterSubject is where a message's dead letter goes: default
	// "<stream>.dlq", which the stream's subjects must take in (and the
	// consumer's filter leave out).
	DeadLetterSubject func(msg jetstream.Msg, meta *jetstream.MsgMetadata) string
	// OnError is told what the consumer could not do (an ack, a Nak, a
	// dead letter), and why a message was given back when neither the
	// handler nor Busy, a lost lease, an unconfirmed DONE or
	// NotDurable was the cause: a claim or DONE the server refused
	// (NOPERM, WRONGTYPE), a lost connection, an OnRun hook that failed.
	// Default: nothing.
	OnError func(err error)
}

// Stats are the Idem's counters and the consumer's: messages acknowledged,
// held back (Nak with a delay), dead-lettered.
type Stats = broker.Stats

// Consumer handles a JetStream consumer's messages.
type Consumer[T any] struct {
	idem     *idem.Idem
	js       jetstream.JetStream
	handle   Handler[T]
	opts     Options
	counters broker.Counters
}

// New makes a Consumer that runs handle for each message through i; js
// publishes the dead letters.
func New[T any](i *idem.Idem, js jetstream.JetStream, handle Handler[T], opts Options) *Consumer[T] {
	if opts.Key == nil {
		opts.Key = headerKey
	}
	if opts.RetryDelay <= 0 {
		opts.RetryDelay = broker.DefaultRetryDelay
	}
	if opts.DeadLetterSubject == nil {
		opts.DeadLetterSubject = func(_ jetstream.Msg, meta *jetstream.MsgMetadata) string { return meta.Stream + ".dlq" }
	}
	return &Consumer[T]{idem: i, js: js, handle: handle, opts: opts}
}

func headerKey(msg jetstream.Msg) (string, error) {
	if k := msg.Headers().Get(KeyHeader); k != "" {
		return k, nil
	}
	return "", broker.MissingKey("the message has no " + KeyHeader + " header")
}

// Stats is a snapshot of the counters.
func (c *Consumer[T]) Stats() Stats { return c.counters.Stats(c.idem) }

// MessageHandler is Handle for a pull consumer's Consume (its calls are
// one at a time: start several Consume for more at once). ctx is the
// works' context: Stop the ConsumeContext and wait for Closed to let the
// message in hand finish.
func (c *Consumer[T]) MessageHandler(ctx context.Context) jetstream.MessageHandler {
	return func(msg jetstream.Msg) { c.Handle(ctx, msg) }
}

// Handle runs one message through the Idem and settles it with the
// server: a double ack once its record is done (or a replay); Nak with
// the holder's lease left (Busy) or RetryDelay (a failure, a DONE not
// confirmed, a lost lease) as the delay; a dead letter (Exhausted,
// Mismatch, no key) copied to DeadLetterSubject, then Term. While the work
// runs, each heartbeat that extends the lease also sends InProgress, so
// the consumer's AckWait follows the lease. With ctx ended, a claim still
// waiting is given up and the message Nak'd.
func (c *Consumer[T]) Handle(ctx context.Context, msg jetstream.Msg) {
	key, err := c.opts.Key(msg)
	var failed error // the handler's own
	if err == nil {
		opts := []idem.CallOption{idem.WithBeat(func(*idem.Job) { _ = msg.InProgress() })}
		if c.opts.Payload != nil {
			opts = append(opts, idem.WithPayload(c.opts.Payload(msg)))
		}
		_, err = idem.Process(ctx, c.idem, key, func(ctx context.Context, job *idem.Job) (v T, err error) {
			v, err = c.handle(ctx, job, msg)
			failed = err
			return v, err
		}, opts...)
	}
	retry := c.opts.RetryDelay
	if meta, err := msg.Metadata(); err == nil && meta.NumDelivered > 1 {
		retry = broker.Backoff(retry, int(meta.NumDelivered-1))
	}
	decision := broker.Decide(err, failed, retry, ctx.Err() != nil)
	if decision.Report {
		c.report(fmt.Errorf("idemnats: message on %s given back: %w", msg.Subject(), err))
	}
	settle, cancel := context.WithTimeout(context.WithoutCancel(ctx), ackTimeout)
	defer cancel()
	switch decision.Verdict {
	case broker.Ack:
		err = msg.DoubleAck(settle)
	case broker.DeadLetter:
		if err = c.deadLetter(settle, msg, decision.Err); err == nil {
			err = msg.TermWithReason(reason(decision.Err))
		}
	case broker.HoldBack:
		err = msg.NakWithDelay(decision.Delay)
	case broker.Leave:
		err = msg.Nak()
	}
	if err != nil {
		c.report(fmt.Errorf("idemnats: message on %s: %w", msg.Subject(), err))
		return
	}
	c.counters.Count(decision.Verdict)
}

func (c *Consumer[T]) report(err error) {
	if c.opts.OnError != nil {
		c.opts.OnError(err)
	}
}

// deadLetter publishes a copy of msg to its dead-letter subject (and waits
// for the stream's acknowledgement): its data and headers (but the
// server's own Nats-* ones), the key, where it came from and the error.
// Its Nats-Msg-Id is the original's stream and sequence, so a dead letter
// sent again (its Term lost, the message redelivered) is dropped as a
// duplicate within the stream's duplicate window.
func (c *Consumer[T]) deadLetter(ctx context.Context, msg jetstream.Msg, cause error) error {
	meta, err := msg.Metadata()
	if err != nil {
		return err
	}
	header := nats.Header{}
	for k, vs := range msg.Headers() {
		if !strings.HasPrefix(k, "Nats-") {
			header[k] = append([]string(nil), vs...)
		}
	}
	if key, err := c.opts.Key(msg); err == nil {
		header.Set(KeyHeader, key)
	}
	header.Set(OriginalSubjectHeader, msg.Subject())
	header.Set(OriginalSequenceHeader, strconv.FormatUint(meta.Sequence.Stream, 10))
	header.Set(ErrorHeader, cause.Error())
	header.Set(jetstream.MsgIDHeader, fmt.Sprintf("idem-dlq:%s:%d", meta.Stream, meta.Sequence.Stream))
	letter := &nats.Msg{Subject: c.opts.DeadLetterSubject(msg, meta), Header: header, Data: msg.Data()}
	if _, err := c.js.PublishMsg(ctx, letter); err != nil {
		return fmt.Errorf("the dead letter to %s: %w", letter.Subject, err)
	}
	return nil
}

// reason is Term's reason: one line.
func reason(err error) string {
	s := err.Error()
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return s
}
