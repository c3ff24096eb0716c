package idem

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Process and the I/O both it and ProcessMany drive: they send what
// flow.go decides and wait.

// CallOption is an option of one Process or ProcessMany call.
type CallOption func(*call)

type call struct {
	payload  []byte
	payloads [][]byte
	ack      *AckCmd
	beat     func(*Job)
}

// WithPayload claims with a payload (the message's content, as bytes): a
// later claim of the key with another payload is ErrMismatch.
func WithPayload(p []byte) CallOption { return func(c *call) { c.payload = p } }

// WithPayloads gives ProcessMany one payload per key.
func WithPayloads(p [][]byte) CallOption { return func(c *call) { c.payloads = p } }

// Process runs work for key at most once while the key's record lives:
// it claims the key, keeps the lease alive while the work runs, and
// records the result (DONE) or gives the claim back when the work fails or
// panics (the panic goes on after the release). A key already done
// replays its stored result without running the work; a key another
// worker holds is waited for (Options.Wait). Once the work has returned,
// the record is completed whatever fails after it, and the error says so
// (ErrResultNotStored, ErrLeaseLost, ErrDoneUnconfirmed, ErrHook,
// ErrNotDurable).
func Process[T any](ctx context.Context, i *Idem, key string, work Work[T], opts ...CallOption) (Outcome[T], error) {
	var out Outcome[T]
	var c call
	for _, o := range opts {
		o(&c)
	}
	ed, err := i.Edition(ctx)
	if err != nil {
		return out, err
	}
	a := i.core.startAcquire(ctx, key)
	var step claimStep
	var r claimAnswer
	var sent time.Time
	for {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		sent = time.Now()
		r = i.claimOnce(ctx, ed, key, c.payload, step.wait)
		if step = i.core.onClaim(&a, r.reply, r.err, r.ack); !step.again {
			break
		}
		if step.wait > 0 && i.blockers() {
			continue
		}
		// No WAIT now: the holders' DONEs keep their connections.
		step.wait = 0
		if err := sleep(ctx, step.pause); err != nil {
			return out, err
		}
	}
	if step.release {
		i.release(ctx, ed, []*Job{{key: key, token: r.reply.Token}})
	}
	var busy *BusyError
	if errors.As(step.err, &busy) {
		busy.Owner = i.holder(ctx, key)
	}
	if r.err == nil && r.reply.Status == StatusDone {
		// A replay; not acknowledged by the replicas, its stored result
		// comes with the NotDurableError (do not acknowledge the message).
		out.Status, out.Attempt, out.Replayed = StatusDone, r.reply.Attempt, true
		out.ResultStored, err = replayed(i.core.codec, r.reply, step.err, &out.Value)
		return out, err
	}
	if step.err != nil {
		return out, step.err
	}
	job := step.job
	job.ack, job.beat = c.ack, c.beat
	job.heldFrom(sent, i.core.lease)
	out.Status, out.Attempt = job.status, job.attempt
	if out.Value, err = runOne(ctx, i, ed, job, work); err != nil {
		return out, err
	}
	settled := i.settle(ctx, ed, []*Job{job}, []any{out.Value}, false)[0]
	out.ResultStored = settled.stored
	if job.ack != nil {
		out.Acked = i.ackAfter(ctx, job.ack, settled)
	}
	return out, settled.err
}

// blockers: a claim may block in WAIT now (a place is free; claimOnce
// gives it back).
func (i *Idem) blockers() bool {
	select {
	case i.blocking <- struct{}{}:
		return true
	default:
		return false
	}
}

// claimOnce sends one claim: without WAIT through the batch of its tick
// when Batch is on, a WAIT alone (holding a place of blockers).
func (i *Idem) claimOnce(ctx context.Context, ed Edition, key string, payload []byte, wait time.Duration) claimAnswer {
	if wait == 0 && i.claims != nil {
		return i.claims.do(ctx, claimItem{key: key, payload: payload})
	}
	if wait > 0 {
		defer func() { <-i.blocking }()
	}
	return i.claimOne(ctx, ed, key, payload, wait)
}

// claimOne sends one IDEM.CLAIM with the instance's settings (and WAIT
// after it when durable).
func (i *Idem) claimOne(ctx context.Context, ed Edition, key string, payload []byte, wait time.Duration) claimAnswer {
	cmd, err := i.core.claimCmd(ed, key, i.core.leaseSecs, i.core.claimArgs(payload, wait))
	if err != nil {
		return claimAnswer{err: err}
	}
	p := i.exchange(ctx, cmd, key, false, true)
	a := claimAnswer{err: p.err, ack: p.ack}
	if p.err == nil {
		a.reply, a.err = parseClaim(p.value)
	}
	return a
}

// holder is the OWNER of a busy key's claim, read on the Busy path only.
func (i *Idem) holder(ctx context.Context, key string) string {
	rec, err := i.Get(ctx, key)
	if err != nil || rec == nil {
		return ""
	}
	return rec.Owner
}

// runOne runs one job's work under the heartbeat: OnRun first; a failure
// (the hook's, the work's error or panic) releases the claim at once, and
// a panic goes on after.
func runOne[T any](ctx context.Context, i *Idem, ed Edition, job *Job, work Work[T]) (T, error) {
	var zero T
	jobCtx, cancel := context.WithCancelCause(ctx)
	job.cancel = cancel
	defer cancel(context.Canceled)
	if err := i.core.beforeWork(job); err != nil {
		i.releaseFailed(ctx, ed, []*Job{job}, []error{err})
		return zero, err
	}
	i.beats.add(job)
	r := safely(jobCtx, job, work)
	i.beats.remove(job)
	if r.failure() != nil {
		i.releaseFailed(ctx, ed, []*Job{job}, []error{r.failure()})
		if r.panicked {
			panic(r.panicValue)
		}
		return zero, r.err
	}
	return r.value, nil
}

// ran is one work's run.
type ran[T any] struct {
	value      T
	err        error
	panicked   bool
	panicValue any
}

// failure is the work's error, or its panic as an error.
func (r ran[T]) failure() error {
	if r.panicked {
		return fmt.Errorf("idem: the work panicked: %v", r.panicValue)
	}
	return r.err
}

func safely[T any](ctx context.Context, job *Job, work Work[T]) (r ran[T]) {
	defer func() {
		if p := recover(); p != nil {
			r = ran[T]{panicked: true, panicValue: p}
		}
	}()
	r.value, r.err = work(ctx, job)
	return r
}

// releaseFailed gives back the failed jobs' claims at once (a waiting
// duplicate takes over), whatever the caller's context, each RELEASE sent
// once within DoneTimeout; flow decides what each answer counts.
func (i *Idem) releaseFailed(ctx context.Context, ed Edition, jobs []*Job, failures []error) {
	for n, ok := range i.release(ctx, ed, jobs) {
		i.core.released(jobs[n], ok, failures[n])
	}
}

// release sends the jobs' RELEASEs once: which were given up.
func (i *Idem) release(ctx context.Context, ed Edition, jobs []*Job) []bool {
	ctx, cancel := i.settling(ctx)
	defer cancel()
	out := make([]bool, len(jobs))
	if len(jobs) == 1 {
		v, err := i.do(ctx, i.core.keyCmd(ed, "IDEM.RELEASE", "idem_release", jobs[0].key, jobs[0].token), true)
		out[0] = err == nil && v == int64(1)
		return out
	}
	items := make([]ReleaseItem, len(jobs))
	for n, job := range jobs {
		items[n] = ReleaseItem{Key: job.key, Token: job.token}
	}
	for n, a := range i.releaseBatch(ctx, ed, items, true) {
		out[n] = a.Err == nil && a.Released
	}
	return out
}

// settle drives the settles of jobs whose works returned values: each
// round of DONEs (or of the GETs checking them) goes as one batch
// (ProcessMany), or through the batch of its tick (Process).
func (i *Idem) settle(ctx context.Context, ed Edition, jobs []*Job, values []any, batch bool) []next {
	// Each send is under settling's context: the caller's cancellation
	// does not reach it.
	settles, nexts := make([]*settle, len(jobs)), make([]next, len(jobs))
	acked := make([]bool, len(jobs)) // WithAck: its script ran the ack
	for k, job := range jobs {
		settles[k], nexts[k] = i.core.startSettle(job, values[k])
	}
	for {
		var sends, gets []int
		var pause time.Duration
		for k, n := range nexts {
			switch {
			case n.send:
				sends = append(sends, k)
			case n.get:
				gets = append(gets, k)
			default:
				continue
			}
			pause = max(pause, n.pause)
		}
		if sends == nil && gets == nil {
			for k := range nexts {
				nexts[k].acked = acked[k]
			}
			return nexts
		}
		time.Sleep(pause)
		if len(sends) > 0 {
			items := make([]DoneItem, len(sends))
			for m, k := range sends {
				items[m] = settles[k].doneItem()
			}
			for m, a := range i.sendDones(ctx, ed, items, jobs[sends[0]].ack, batch) {
				k := sends[m]
				nexts[k] = i.core.onDone(settles[k], a.code, a.err, a.ack)
				acked[k] = acked[k] || a.acked
			}
		}
		if len(gets) > 0 {
			keys := make([]string, len(gets))
			for m, k := range gets {
				keys[m] = jobs[k].key
			}
			for m, r := range i.getAll(ctx, ed, keys) {
				rec, err := parseRecord(r.value, r.err)
				nexts[gets[m]] = i.core.onChecked(settles[gets[m]], rec, err)
			}
		}
	}
}

// sendDones sends one round of a settle's DONEs, each once within
// DoneTimeout (Process's with its ack, if it has one).
func (i *Idem) sendDones(ctx context.Context, ed Edition, items []DoneItem, ack *AckCmd, batch bool) []doneAnswer {
	if !batch && ack != nil {
		ctx, cancel := i.settling(ctx)
		defer cancel()
		return []doneAnswer{i.doneAcking(ctx, ed, items[0], ack)}
	}
	if !batch && i.dones != nil {
		return []doneAnswer{i.dones.do(ctx, items[0])}
	}
	ctx, cancel := i.settling(ctx)
	defer cancel()
	if !batch {
		return []doneAnswer{i.doneOne(ctx, ed, items[0])}
	}
	return i.doneBatch(ctx, ed, items, i.core.retain, true, false)
}

// doneOne sends one IDEM.DONE once (and WAIT after it when durable).
func (i *Idem) doneOne(ctx context.Context, ed Edition, item DoneItem) doneAnswer {
	cmd, err := i.core.doneCmd(ed, item, i.core.retain, i.core.bloom)
	if err != nil {
		return doneAnswer{err: err}
	}
	p := i.exchange(ctx, cmd, item.Key, true, true)
	n, _ := p.value.(int64)
	return doneAnswer{code: DoneCode(n), err: p.err, ack: p.ack}
}

// getAll reads records, pipelined, within DoneTimeout.
func (i *Idem) getAll(ctx context.Context, ed Edition, keys []string) []piped {
	ctx, cancel := i.settling(ctx)
	defer cancel()
	cmds := make([][]any, len(keys))
	for n, key := range keys {
		cmds[n] = i.core.getCmd(ed, key)
	}
	return i.roundTrip(ctx, cmds, keys, false, false)
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
