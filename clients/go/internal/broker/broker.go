// Package broker is what the broker adapters (idemkafka, idemamqp,
// idemnats, idemstreams) share: what Process's answer means for the
// message (docs/clients.md, "Consumers of brokers"), the key a message
// must have, and the adapters' counters.
package broker

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	idem "github.com/redis-idem/redis-idem/clients/go"
)

// Verdict is what an adapter does with a message after Process.
type Verdict int

const (
	// Ack: the record is done (the work ran and its DONE was confirmed, or
	// a replay).
	Ack Verdict = iota + 1
	// HoldBack: give the message back, to come again after Delay (Busy, a
	// failed work, a DONE not confirmed, a lost lease, not durable).
	HoldBack
	// DeadLetter: to the broker's dead letter, then acknowledge
	// (Exhausted, Mismatch, a message without a key).
	DeadLetter
	// Leave: the consumer is stopping; neither (the broker redelivers).
	Leave
)

// Decision is a Verdict with its delay and the error it comes from.
type Decision struct {
	Verdict Verdict
	Delay   time.Duration // HoldBack
	Err     error
	// Report: a HoldBack for a reason the user's OnError must hear of,
	// since nobody else does: not the handler's own failure (it knows)
	// nor one of the contract's routine outcomes (Busy, LeaseLost,
	// DoneUnconfirmed, NotDurable), but what kept the loop itself from
	// its work: a claim or DONE the server refused (NOPERM without the
	// IDEM commands, WRONGTYPE), a lost connection, an OnRun hook that
	// failed. Left unreported, such a message would only ever come back.
	Report bool
}

// MinDelay is the least a message is held back: a holder's lease about to
// end is not spun on.
const MinDelay = 100 * time.Millisecond

// DefaultRetryDelay is how long a failed message is first held back by
// default.
const DefaultRetryDelay = 100 * time.Millisecond

// MaxRetryDelay is the longest a failed message is held back.
const MaxRetryDelay = 30 * time.Second

// Backoff is the delay of a failed message held back n times before: base,
// doubling each time, at most MaxRetryDelay.
func Backoff(base time.Duration, n int) time.Duration {
	d := base
	for ; n > 0 && d < MaxRetryDelay; n-- {
		d *= 2
	}
	return min(d, MaxRetryDelay)
}

// Decide reads Process's error. failed is the handler's own error, as it
// returned it (nil when it did not run or succeeded); retry is the delay
// of a failure (Backoff); stopping says the consumer's own context ended
// (a cancelled claim is then left to the broker).
func Decide(err, failed error, retry time.Duration, stopping bool) Decision {
	var busy *idem.BusyError
	var hook *idem.HookError
	var lost *idem.LeaseLostError
	var unconfirmed *idem.DoneUnconfirmedError
	var undurable *idem.NotDurableError
	switch {
	case err == nil, errors.Is(err, idem.ErrResultNotStored), errors.As(err, &hook) && hook.Hook == "on_done":
		// The record is completed (a result or a hook's trouble does not
		// undo it).
		return Decision{Verdict: Ack, Err: err}
	case errors.Is(err, idem.ErrExhausted), errors.Is(err, idem.ErrMismatch), errors.Is(err, idem.ErrMissingKey):
		return Decision{Verdict: DeadLetter, Err: err}
	case errors.As(err, &busy):
		return Decision{Verdict: HoldBack, Delay: max(busy.LeaseLeft, MinDelay), Err: err}
	case stopping && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
		return Decision{Verdict: Leave, Err: err}
	}
	routine := (failed != nil && err == failed) || errors.As(err, &lost) || errors.As(err, &unconfirmed) ||
		errors.As(err, &undurable)
	return Decision{Verdict: HoldBack, Delay: max(retry, MinDelay), Err: err, Report: !routine}
}

// MissingKey is the error of a message without a key: ErrMissingKey, with
// where the key was looked for.
func MissingKey(where string) error {
	return fmt.Errorf("%w (%s)", idem.ErrMissingKey, where)
}

// Stats are an adapter's counters: the Idem's, and what the adapter did
// with the messages.
type Stats struct {
	idem.Stats
	// Acknowledged: messages acknowledged as done (processed, replayed).
	Acknowledged uint64
	// HeldBack: messages given back to come again (Busy, failures, the
	// outcomes that are not acknowledged).
	HeldBack uint64
	// DeadLettered: messages moved to the dead letter and acknowledged.
	DeadLettered uint64
}

// Counters count what an adapter did.
type Counters struct {
	acknowledged, heldBack, deadLettered atomic.Uint64
}

// Count one message's end.
func (c *Counters) Count(v Verdict) {
	switch v {
	case Ack:
		c.acknowledged.Add(1)
	case HoldBack:
		c.heldBack.Add(1)
	case DeadLetter:
		c.deadLettered.Add(1)
	}
}

// Stats is a snapshot, with the Idem's counters.
func (c *Counters) Stats(i *idem.Idem) Stats {
	return Stats{Stats: i.Stats(), Acknowledged: c.acknowledged.Load(), HeldBack: c.heldBack.Load(),
		DeadLettered: c.deadLettered.Load()}
}
