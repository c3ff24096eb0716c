package idem

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// The consumer loop's decisions, without I/O, shared by Process and
// ProcessMany: what a claim's answer means (onClaim, verdict), what a
// failed work's RELEASE counts (released), and how a work's value is
// settled into the record (settle: the next command from each reply).
// process.go and many.go only send what these decide and wait.

// core is an Idem's settings and counters: everything the decisions read.
type core struct {
	settings
	stats counters
	ed    atomic.Int32 // the Edition, once known
}

func (c *core) edition() Edition { return Edition(c.ed.Load()) }

// acked is a WAIT's (or WAITAOF's) answer after a command: how many
// replicas acknowledged it, or why that is unknown.
type acked struct {
	replicas int64
	err      error
}

// durableOK: no durability asked, or the WAIT answered enough replicas.
func (c *core) durableOK(a acked) bool {
	return c.durable == nil || (a.err == nil && a.replicas >= int64(c.durable.Replicas))
}

// acquire is one call's way to its claim: the end of its wait, whether it
// waited already, its polling.
type acquire struct {
	key      string
	deadline time.Time
	waited   bool
	poll     backoff
	resend   backoff
}

func (c *core) startAcquire(ctx context.Context, key string) acquire {
	deadline := time.Now().Add(c.wait)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	return acquire{key: key, deadline: deadline}
}

// claimStep is what the driver does after a claim's answer.
type claimStep struct {
	job    *Job          // granted: run the work
	replay bool          // DONE: decode the stored result
	again  bool          // claim again: with WAIT for wait (module), or after pause
	pause  time.Duration //
	wait   time.Duration //
	// release: durable, the granted claim was not acknowledged: give it
	// back (err is the *NotDurableError).
	release bool
	err     error // the call's outcome; a *BusyError's Owner is the driver's to read
}

// onClaim decides on one claim's answer (r, or err), with the WAIT's
// answer after it when durable.
func (c *core) onClaim(a *acquire, r ClaimReply, err error, ack acked) claimStep {
	left := time.Until(a.deadline)
	if err != nil {
		if wroteNothing(err) && left > 0 {
			return claimStep{again: true, pause: a.resend.pause(time.Hour, left)}
		}
		return claimStep{err: err}
	}
	if r.Status != StatusBusy {
		job, status, err := c.verdict(a.key, r, ack)
		release := status == BatchNotDurable && r.Status != StatusDone // a replay holds no claim to give back
		return claimStep{job: job, replay: status == BatchReplayed, release: release, err: err}
	}
	if left <= 0 {
		return claimStep{err: c.busy(a.key, r)}
	}
	if !a.waited {
		a.waited = true
		c.stats.waits.Add(1)
		if h := c.hooks.OnBusy; h != nil {
			quietly(func() { h(a.key, r.LeaseLeft) })
		}
	}
	// The module blocks the claim for the time left (when the driver has a
	// connection to spare for it); else poll.
	step := claimStep{again: true, pause: a.poll.pause(r.LeaseLeft, left)}
	if c.edition() == EditionModule {
		step.wait = c.waitPiece(left)
	}
	return step
}

// claimNotDurable is, with Durable, the error (counted) when ack, the WAIT
// after a claim, fell short of a claim that matters to it, in Process,
// ProcessMany and ClaimMany alike: a granted claim (StageClaim: the caller
// gives it back) or a replay (StageDone: the completion read may not have
// reached the replicas, a primary that has just lost its role keeps
// answering; the caller carries the stored result). Busy and refused
// claims wrote and read nothing to keep.
func (c *core) claimNotDurable(key string, r ClaimReply, ack acked) *NotDurableError {
	var stage Stage
	switch r.Status {
	case StatusNew, StatusSeen, StatusRetry:
		stage = StageClaim
	case StatusDone:
		stage = StageDone
	default:
		return nil
	}
	if c.durableOK(ack) {
		return nil
	}
	c.stats.notDurable.Add(1)
	return &NotDurableError{Key: key, Stage: stage, Acknowledged: ack.replicas, Cause: ack.err}
}

// verdict is what a claim's answer makes of a key, in Process and
// ProcessMany alike: a job to run, a replay (counted), the key's error, or
// busy (BatchBusy, the caller's to decide on).
func (c *core) verdict(key string, r ClaimReply, ack acked) (*Job, BatchStatus, error) {
	if nd := c.claimNotDurable(key, r, ack); nd != nil {
		return nil, BatchNotDurable, nd
	}
	switch r.Status {
	case StatusNew, StatusSeen, StatusRetry:
		if r.Status == StatusNew {
			c.stats.firstRuns.Add(1)
		} else {
			c.stats.retries.Add(1)
		}
		return &Job{key: key, token: r.Token, attempt: r.Attempt, status: r.Status}, "", nil
	case StatusDone:
		c.stats.replays.Add(1)
		if h := c.hooks.OnReplay; h != nil {
			quietly(func() { h(key, r.Attempt) })
		}
		return nil, BatchReplayed, nil
	case StatusMismatch:
		c.stats.mismatches.Add(1)
		return nil, BatchMismatch, &MismatchError{Key: key, Attempt: r.Attempt}
	case StatusExhausted:
		c.stats.exhausted.Add(1)
		return nil, BatchExhausted, &ExhaustedError{Key: key, Attempt: r.Attempt}
	}
	return nil, BatchBusy, nil
}

// replayed decodes the stored result of a claim answered DONE into v, in
// Process and ProcessMany alike; stored says one was there and decoded.
// verdict is the claim's error from verdict: nil for a replay, whose
// error is then the codec's; a *NotDurableError for a replay the
// replicas did not acknowledge, which carries the value too and stays
// the answer (a value that does not decode is then left out).
func replayed[T any](c Codec, r ClaimReply, verdict error, v *T) (stored bool, err error) {
	var undurable *NotDurableError
	errors.As(verdict, &undurable)
	if r.Result == nil {
		return false, verdict
	}
	if err := c.Decode(r.Result, v); err != nil {
		if undurable != nil {
			return false, verdict
		}
		return false, err
	}
	if undurable != nil {
		undurable.Result = *v
	}
	return true, verdict
}

// busy counts a key that ends busy.
func (c *core) busy(key string, r ClaimReply) *BusyError {
	c.stats.busy.Add(1)
	return &BusyError{Key: key, LeaseLeft: r.LeaseLeft, Attempt: r.Attempt}
}

// waitPiece is the longest WAIT that fits the client's read timeout.
func (c *core) waitPiece(left time.Duration) time.Duration {
	rt := c.readTimeout
	switch {
	case rt == 0:
		return left
	case rt >= 2*time.Second:
		return min(left, rt-time.Second)
	}
	return min(left, rt/2)
}

// beforeWork calls OnRun: its failure is the caller's *HookError, and the
// claim is released.
func (c *core) beforeWork(job *Job) error {
	if h := c.hooks.OnRun; h != nil {
		if err := hookErr(func() error { return h(job) }); err != nil {
			return &HookError{Hook: "on_run", Cause: err}
		}
	}
	return nil
}

// released tells of a failed job's RELEASE (sent once, never again):
// counted only when the server gave the claim up; OnRelease called once
// either way, with the work's (or hook's) failure.
func (c *core) released(job *Job, ok bool, failure error) {
	if ok {
		c.stats.released.Add(1)
	}
	if h := c.hooks.OnRelease; h != nil {
		quietly(func() { h(job, failure) })
	}
}

// loseLease marks the job lost, once: counted, its context cancelled.
func (c *core) loseLease(job *Job) error {
	if job.lost.CompareAndSwap(false, true) {
		c.stats.leasesLost.Add(1)
		if job.cancel != nil {
			job.cancel(ErrLeaseLost)
		}
		if h := c.hooks.OnLeaseLost; h != nil {
			quietly(func() { h(job) })
		}
	}
	return &LeaseLostError{Key: job.key, Attempt: job.attempt}
}

// onExtend decides on an EXTEND's answer: STALE while the job is still at
// work is its lease lost.
func (c *core) onExtend(job *Job, err error, atWork bool) {
	switch {
	case err == nil:
		c.stats.extends.Add(1)
		if job.beat != nil && atWork {
			quietly(func() { job.beat(job) })
		}
	case errors.Is(err, ErrStale) && atWork:
		c.loseLease(job)
	}
}

// settle is one work's value on its way into the record: DONE, sent again
// after a connection error (at most 1 + DoneRetries), without RESULT when
// the server refuses it, checked with IDEM.GET when a resent DONE answers 0.
type settle struct {
	job      *Job
	value    any
	result   []byte // RESULT, nil when none can be stored
	dropped  string // why not: "unserializable", "oversize", "memory"
	cause    error
	sends    int
	resent   bool
	checking bool
	ack      acked // the WAIT after the latest DONE
}

// next is what the driver does for a settle: send its DONE (or the GET
// checking it) after pause, or take the outcome.
type next struct {
	send     bool
	get      bool
	pause    time.Duration
	finished bool
	stored   bool
	err      error
	acked    bool // WithAck: the DONE's script ran the ack (the driver's to set)
}

// startSettle encodes the value: from here on the record is completed,
// whatever fails.
func (c *core) startSettle(job *Job, value any) (*settle, next) {
	s := &settle{job: job, value: value, sends: 1}
	encoded, err := c.codec.Encode(value)
	if err != nil {
		s.dropped, s.cause = "unserializable", err
	} else {
		s.result = encoded
	}
	return s, next{send: true}
}

// doneItem is the DONE the settle sends now.
func (s *settle) doneItem() DoneItem {
	return DoneItem{Key: s.job.key, Token: s.job.token, Result: s.result}
}

// onDone takes the answer to the settle's DONE: its code or error, and
// the WAIT's answer after it when durable.
func (c *core) onDone(s *settle, code DoneCode, err error, ack acked) next {
	s.ack = ack
	switch {
	case err == nil && code.Completed():
		if code.ResultDropped() && s.dropped == "" {
			s.dropped, s.cause = "memory", errors.New("idem: the server dropped the result (maxmemory)")
		}
		return c.success(s, s.result != nil && !code.ResultDropped(), ack)
	case err == nil && s.resent:
		// Answered 0: someone else's completion, or this DONE's own first
		// send, whose reply was lost: IDEM.GET tells.
		s.checking = true
		return next{get: true}
	case err == nil || errors.Is(err, ErrStale):
		return next{finished: true, err: c.loseLease(s.job)}
	case errors.Is(err, ErrResultTooLarge) && s.result != nil:
		s.dropped, s.cause, s.result = "oversize", err, nil
		return next{send: true}
	case wroteNothing(err): // a lost connection, or READONLY, NOREPLICAS, ...: not run
		return c.again(s, err)
	}
	// Any other error (WRONGTYPE: the key was overwritten): the record was
	// not completed, and the call never says it was.
	return next{finished: true, err: err}
}

// onChecked takes the IDEM.GET after a resent DONE answered 0: done with
// this job's attempt is this worker's own completion (nobody else can have
// claimed in between); anything else is a lost lease.
func (c *core) onChecked(s *settle, rec *Record, err error) next {
	switch {
	case err == nil && rec != nil && rec.State == StateDone && rec.Attempt == s.job.attempt:
		stored := s.result != nil && rec.Result != nil
		if s.result != nil && !stored && s.dropped == "" {
			s.dropped, s.cause = "memory", errors.New("idem: the server dropped the result (maxmemory)")
		}
		return c.success(s, stored, s.ack)
	case err == nil:
		return next{finished: true, err: c.loseLease(s.job)}
	case isConnError(err):
		return c.again(s, err)
	}
	return next{finished: true, err: err}
}

// again sends the DONE (or its GET) once more after a connection error, or
// gives DoneUnconfirmed when the retries are used up.
func (c *core) again(s *settle, cause error) next {
	if s.sends > c.doneRetries {
		return next{finished: true, err: &DoneUnconfirmedError{Key: s.job.key, Result: s.value, Cause: cause}}
	}
	pause := 50 * time.Millisecond << min(s.sends-1, 10)
	s.sends++
	if s.checking {
		return next{get: true, pause: pause}
	}
	s.resent = true
	return next{send: true, pause: pause}
}

// success counts a completion and tells the hooks; the error, if any,
// carries the value.
func (c *core) success(s *settle, stored bool, ack acked) next {
	job, value := s.job, s.value
	c.stats.completed.Add(1)
	if !stored {
		c.stats.resultsDropped.Add(1)
		if h := c.hooks.OnResultDropped; h != nil {
			quietly(func() { h(job, s.dropped) })
		}
	}
	out := next{finished: true, stored: stored}
	if h := c.hooks.OnDone; h != nil {
		if err := hookErr(func() error { return h(job, stored) }); err != nil {
			out.err = &HookError{Hook: "on_done", Cause: err, Result: value}
		}
	}
	switch {
	case !c.durableOK(ack):
		c.stats.notDurable.Add(1)
		out.err = &NotDurableError{Key: job.key, Stage: StageDone, Acknowledged: ack.replicas, Result: value, Cause: ack.err}
	case out.err != nil:
	case s.dropped == "unserializable" || (s.dropped == "oversize" && c.oversize == OversizeError):
		out.stored, out.err = false, &ResultNotStoredError{Key: job.key, Result: value, Cause: s.cause}
	}
	return out
}

// settledStatus is a settled batch key's status: processed, also when the
// result was not stored or OnDone failed (the record is completed).
func settledStatus(err error) BatchStatus {
	switch {
	case err == nil, errors.Is(err, ErrResultNotStored), errors.Is(err, ErrHook):
		return BatchProcessed
	case errors.Is(err, ErrLeaseLost):
		return BatchLost
	case errors.Is(err, ErrNotDurable):
		return BatchNotDurable
	}
	return BatchError // ErrDoneUnconfirmed, or DONE's own error (the record is not completed)
}

// quietly calls a hook whose failure changes nothing.
func quietly(f func()) {
	defer func() { _ = recover() }()
	f()
}

// hookErr calls a hook whose failure is the caller's ErrHook.
func hookErr(f func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	return f()
}

// backoff is the polling of the Functions edition (and the resends of a
// claim that wrote nothing): 10 ms doubling to 1 s, jittered, never past
// the holder's lease end nor the deadline.
type backoff struct{ next time.Duration }

func (b *backoff) pause(leaseLeft, left time.Duration) time.Duration {
	if b.next == 0 {
		b.next = 10 * time.Millisecond
	}
	p := min(b.next, max(leaseLeft, time.Millisecond), max(left, 0))
	b.next = min(2*b.next, time.Second)
	// Jitter: between half and all of it, so that waiters spread out.
	return p/2 + time.Duration(time.Now().UnixNano()%int64(p/2+1))
}
