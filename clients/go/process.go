package idem

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"
)

// Work is what Process runs for a key: ctx is cancelled when the job's
// lease is found lost (with ErrLeaseLost as its cause) or the caller's
// context ends.
type Work[T any] func(ctx context.Context, job *Job) (T, error)

// Result is a Process call's outcome.
type Result[T any] struct {
	// Value is the work's own value on a first run, the codec's decoding
	// of the stored result on a replay (the zero value when none was
	// stored).
	Value T
	// Replayed: the key was already done; the work did not run.
	Replayed bool
	// ResultStored: the record holds the result (false when it was
	// completed without it: too large, not encodable, dropped by the server).
	ResultStored bool
	// Status of the claim: StatusNew, StatusSeen, StatusRetry, or StatusDone
	// for a replay.
	Status Status
	// Attempt is the fencing number the work was given (a replay: the
	// record's).
	Attempt int64
}

// CallOption is an option of one Process or ProcessMany call.
type CallOption func(*call)

type call struct {
	payload  []byte
	payloads [][]byte
	wait     time.Duration
	maxTries int
	codec    Codec
}

// WithPayload claims with a payload (the message's content): a later claim
// of the key with another payload is ErrMismatch.
func WithPayload(p []byte) CallOption { return func(c *call) { c.payload = p } }

// WithPayloads gives ProcessMany one payload per key.
func WithPayloads(p [][]byte) CallOption { return func(c *call) { c.payloads = p } }

func (i *Idem) call(opts []CallOption) *call {
	c := &call{wait: i.wait, maxTries: i.opts.MaxTries, codec: i.codec}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Process runs work for key at most once while the key's record lives:
// it claims the key, keeps the lease alive while the work runs, and
// records the result (DONE) or gives the claim back when the work fails or
// panics (the panic goes on after the release). A key already done
// replays its stored result without running the work; a key another
// worker holds is waited for (Options.Wait). Once the work has returned,
// the record is completed whatever fails after it, and the error says so
// (ErrResultNotStored, ErrLeaseLost, ErrDoneUnconfirmed, ErrHook).
func Process[T any](ctx context.Context, i *Idem, key string, work Work[T], opts ...CallOption) (Result[T], error) {
	c := i.call(opts)
	var res Result[T]
	reply, err := i.acquire(ctx, key, c)
	if err != nil {
		return res, err
	}
	job, err := i.onClaim(key, reply)
	if err != nil {
		return res, err
	}
	if job == nil {
		res.Status, res.Attempt, res.Replayed = StatusDone, reply.Attempt, true
		if reply.Result != nil {
			err = c.codec.Decode(reply.Result, &res.Value)
			res.ResultStored = err == nil
		}
		return res, err
	}
	res.Status, res.Attempt = job.status, job.attempt
	value, err := i.run(ctx, []*Job{job}, func(ctx context.Context, j *Job) (any, error) { return work(ctx, j) })[0].get()
	if err != nil {
		return res, err
	}
	if v, ok := value.(T); ok {
		res.Value = v
	}
	res.ResultStored, err = i.settle(ctx, job, res.Value, c)
	return res, err
}

// acquire claims key, waiting for a busy holder up to c.wait: the first
// claim without WAIT (a busy key is seen and counted once), then WAITs in
// pieces on the module, polling on the Functions edition.
func (i *Idem) acquire(ctx context.Context, key string, c *call) (ClaimReply, error) {
	ed, err := i.Edition(ctx)
	if err != nil {
		return ClaimReply{}, err
	}
	deadline := time.Now().Add(c.wait)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	args := ClaimArgs{Payload: c.payload, MaxTries: c.maxTries, Bloom: i.opts.Bloom}
	var poll backoff
	waited := false
	for {
		r, err := i.Claim(ctx, key, i.lease, args)
		left := time.Until(deadline)
		if err != nil {
			// A waiter unblocked (failover, CLIENT UNBLOCK) or whose record
			// left its node wrote nothing: claim again.
			if msg := err.Error(); (strings.HasPrefix(msg, "UNBLOCKED") || strings.HasPrefix(msg, "TRYAGAIN")) && left > 0 {
				if err := sleep(ctx, 10*time.Millisecond); err != nil {
					return r, err
				}
				continue
			}
			return r, err
		}
		if r.Status != StatusBusy {
			return r, nil
		}
		if left <= 0 {
			i.stats.busy.Add(1)
			return r, &BusyError{Key: key, LeaseLeft: r.LeaseLeft, Attempt: r.Attempt}
		}
		if !waited {
			waited = true
			i.stats.waits.Add(1)
			if h := i.opts.Hooks.OnBusy; h != nil {
				quietly(func() { h(key, r.LeaseLeft) })
			}
		}
		if ed == EditionModule {
			args.Wait = i.waitPiece(left)
		} else if err := sleep(ctx, poll.pause(r.LeaseLeft, left)); err != nil {
			return r, err
		}
	}
}

// outcome is one job's work result.
type outcome struct {
	value    any
	err      error
	panicked bool
	panicVal any
}

func (o outcome) get() (any, error) { return o.value, o.err }

// run runs work for each job in order under one heartbeat, releasing each
// job whose hook or work fails. After a work's panic the rest do not run
// and are released too; the panic goes on from here for a single job, from
// ProcessMany once the works that returned are settled.
func (i *Idem) run(ctx context.Context, jobs []*Job, work func(context.Context, *Job) (any, error)) []outcome {
	out := make([]outcome, len(jobs))
	ctxs := make([]context.Context, len(jobs))
	for n, job := range jobs {
		ctxs[n], job.cancel = context.WithCancelCause(ctx)
	}
	var failed []int
	runnable := make([]bool, len(jobs))
	for n, job := range jobs {
		if h := i.opts.Hooks.OnRun; h != nil {
			if err := hookErr(func() error { return h(job) }); err != nil {
				out[n].err = &HookError{Hook: "on_run", Cause: err}
				failed = append(failed, n)
				continue
			}
		}
		runnable[n] = true
	}
	stop := i.heartbeatAll(ctx, jobs, runnable)
	var panicked *outcome
	for n, job := range jobs {
		if !runnable[n] {
			continue
		}
		if panicked != nil {
			out[n].err = errors.New("idem: not run: another work of the batch panicked")
			failed = append(failed, n)
			continue
		}
		out[n] = runOne(ctxs[n], job, work)
		if out[n].panicked {
			panicked = &out[n]
		}
		if out[n].err != nil || out[n].panicked {
			failed = append(failed, n)
		}
	}
	stop()
	for n := range jobs {
		defer jobs[n].cancel(context.Canceled)
	}
	i.releaseJobs(ctx, jobs, failed, out)
	if panicked != nil && len(jobs) == 1 {
		panic(panicked.panicVal)
	}
	return out
}

func runOne(ctx context.Context, job *Job, work func(context.Context, *Job) (any, error)) (o outcome) {
	defer func() {
		if p := recover(); p != nil {
			o = outcome{panicked: true, panicVal: p}
		}
	}()
	v, err := work(ctx, job)
	return outcome{value: v, err: err}
}

// releaseJobs gives back the failed jobs' claims at once (a waiting
// duplicate takes over), whatever the caller's context.
func (i *Idem) releaseJobs(ctx context.Context, jobs []*Job, failed []int, out []outcome) {
	if len(failed) == 0 {
		return
	}
	ctx = context.WithoutCancel(ctx)
	items := make([]ReleaseItem, len(failed))
	for n, f := range failed {
		items[n] = ReleaseItem{Key: jobs[f].key, Token: jobs[f].token}
	}
	if len(items) == 1 {
		_, _ = i.Release(ctx, items[0].Key, items[0].Token)
	} else {
		_, _ = i.ReleaseMany(ctx, items)
	}
	for _, f := range failed {
		i.stats.released.Add(1)
		if h := i.opts.Hooks.OnRelease; h != nil {
			err := out[f].err
			if out[f].panicked {
				err = errors.New("idem: the work panicked")
			}
			quietly(func() { h(jobs[f], err) })
		}
	}
}

// heartbeatAll extends the runnable jobs' leases every Heartbeat until
// stop is called (which waits for the last EXTEND to end).
func (i *Idem) heartbeatAll(ctx context.Context, jobs []*Job, runnable []bool) (stop func()) {
	if i.heartbeat <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(i.heartbeat)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			i.beat(ctx, jobs, runnable)
		}
	}()
	return func() {
		close(done)
		wg.Wait()
	}
}

// beat extends every live job's lease, pipelined.
func (i *Idem) beat(ctx context.Context, jobs []*Job, runnable []bool) {
	var live []*Job
	var cmds [][]any
	for n, job := range jobs {
		if !runnable[n] || job.Lost() {
			continue
		}
		cmd, _, err := i.command(ctx, "IDEM.EXTEND", "idem_extend", job.key)
		if err != nil {
			return
		}
		live, cmds = append(live, job), append(cmds, append(cmd, job.token, int64(i.lease/time.Second)))
	}
	if len(cmds) == 0 {
		return
	}
	// A connection error: the next beat tries again.
	replies, _ := i.pipeline(ctx, cmds, false)
	for n, r := range replies {
		switch {
		case r.err == nil:
			i.stats.extends.Add(1)
		case errors.Is(r.err, ErrStale):
			i.loseLease(live[n])
		}
	}
}

// settle completes a job whose work returned value: with its result, or
// without it when it cannot be stored. From here the record is completed,
// whatever fails.
func (i *Idem) settle(ctx context.Context, job *Job, value any, c *call) (bool, error) {
	ctx = context.WithoutCancel(ctx)
	args := DoneArgs{Retain: i.opts.Retain, Bloom: i.opts.Bloom}
	encoded, encErr := c.codec.Encode(value)
	reason := ""
	var cause error
	if encErr != nil {
		reason, cause = "unserializable", encErr
	} else {
		args.Result = encoded
	}
	code, err := i.sendDone(ctx, job, args)
	if errors.Is(err, ErrResultTooLarge) && args.Result != nil {
		reason, cause = "oversize", err
		args.Result = nil
		code, err = i.sendDone(ctx, job, args)
	}
	if err != nil {
		return false, i.doneFailed(job, value, err)
	}
	return i.completed(job, value, code, reason, cause)
}

// doneFailed makes a DONE that did not complete the record an error.
func (i *Idem) doneFailed(job *Job, value any, err error) error {
	var unconfirmed *DoneUnconfirmedError
	if errors.As(err, &unconfirmed) {
		unconfirmed.Result = value
		return err
	}
	if errors.Is(err, ErrStale) || errors.Is(err, ErrLeaseLost) {
		i.loseLease(job)
		return &LeaseLostError{Key: job.key, Attempt: job.attempt}
	}
	return err
}

// completed counts a completion and tells the hooks; the error, if any,
// carries the value.
func (i *Idem) completed(job *Job, value any, code DoneCode, reason string, cause error) (bool, error) {
	i.stats.completed.Add(1)
	if reason == "" && code.ResultDropped() {
		reason = "memory"
	}
	stored := reason == ""
	if !stored {
		i.stats.resultsDropped.Add(1)
		if h := i.opts.Hooks.OnResultDropped; h != nil {
			quietly(func() { h(job, reason) })
		}
	}
	if h := i.opts.Hooks.OnDone; h != nil {
		if err := hookErr(func() error { return h(job, stored) }); err != nil {
			return stored, &HookError{Hook: "on_done", Cause: err, Result: value}
		}
	}
	if reason == "unserializable" || (reason == "oversize" && i.opts.Oversize == OversizeError) {
		return false, &ResultNotStoredError{Key: job.key, Result: value, Cause: cause}
	}
	return stored, nil
}

// sendDone sends DONE, again after a connection error. An answer 0 to the
// first DONE means another worker completed the key (ErrLeaseLost); to a
// resent one it may be this DONE's own first send, which IDEM.GET tells.
func (i *Idem) sendDone(ctx context.Context, job *Job, args DoneArgs) (DoneCode, error) {
	delay := 50 * time.Millisecond
	resent := false
	for try := 0; ; try++ {
		code, err := i.done(ctx, job.key, job.token, args, true)
		if err == nil && code == 0 {
			if resent && i.ownCompletion(ctx, job) {
				return 1, nil
			}
			return 0, ErrLeaseLost
		}
		if !isConnError(err) {
			return code, err
		}
		if try >= i.doneRetries {
			return 0, &DoneUnconfirmedError{Key: job.key, Cause: err}
		}
		resent = true
		_ = sleep(ctx, delay)
		delay *= 2
	}
}

// ownCompletion: the record is done with this job's attempt. Nobody else
// can have claimed in between (a claim would have raised the attempt).
func (i *Idem) ownCompletion(ctx context.Context, job *Job) bool {
	rec, err := i.Get(ctx, job.key)
	return err == nil && rec != nil && rec.State == StateDone && rec.Attempt == job.attempt
}
