package idem

import (
	"context"
	"errors"
	"time"
)

// ProcessMany is Process for a batch, with every promise of the single
// call: one ClaimMany, the work for each granted key in key order under
// one heartbeat, the successes completed in one DONE batch (resent after a
// connection error and confirmed with IDEM.GET per key, as Process does)
// and the failures released in one RELEASE batch. It answers one item per
// key, in order; a busy key is not waited for. A work that panics: the
// works after it do not run (BatchFailed), the ones before it are
// completed, the failed ones released, then the panic goes on. The error
// is only for the batch as a whole: every claim lost with its connection.
func ProcessMany[T any](ctx context.Context, i *Idem, keys []string, work Work[T], opts ...CallOption) ([]BatchItem[T], error) {
	var c call
	for _, o := range opts {
		o(&c)
	}
	if c.payloads != nil && len(c.payloads) != len(keys) {
		return nil, errors.New("idem: one payload per key")
	}
	ed, err := i.Edition(ctx)
	if err != nil {
		return nil, err
	}
	sent := time.Now()
	claims := i.claimBatch(ctx, ed, keys, i.core.leaseSecs, c.payloads, false)
	if failedWhole(claims) {
		return nil, claims[0].err
	}
	items := make([]BatchItem[T], len(keys))
	var jobs, undurable []*Job
	var at []int
	for j, a := range claims {
		it := &items[j]
		it.Key, it.Attempt = keys[j], a.reply.Attempt
		if a.err != nil {
			it.Status, it.Err = BatchError, a.err
			continue
		}
		job, status, err := i.core.verdict(keys[j], a.reply, a.ack)
		switch {
		case job != nil:
			job.beat = c.beat
			job.heldFrom(sent, i.core.lease)
			jobs, at = append(jobs, job), append(at, j)
		case status == BatchBusy:
			it.Status, it.Err = BatchBusy, i.core.busy(keys[j], a.reply)
		case a.reply.Status == StatusDone:
			// A replay, BatchReplayed or (not acknowledged) BatchNotDurable.
			it.Status = status
			it.ResultStored, it.Err = replayed(i.core.codec, a.reply, err, &it.Value)
		default:
			it.Status, it.Err = status, err
			if status == BatchNotDurable {
				undurable = append(undurable, &Job{key: keys[j], token: a.reply.Token})
			}
		}
	}
	if len(undurable) > 0 {
		i.release(ctx, ed, undurable)
	}
	if len(jobs) == 0 {
		return items, nil
	}
	runs := runMany(ctx, i, ed, jobs, work)
	var done []*Job
	var values []any
	var doneAt []int
	var panicked *ran[T]
	for n, r := range runs {
		it := &items[at[n]]
		if r.panicked && panicked == nil {
			panicked = &runs[n]
		}
		if r.failure() != nil {
			it.Status, it.Err = BatchFailed, r.failure()
			continue
		}
		it.Value = r.value
		done, values, doneAt = append(done, jobs[n]), append(values, r.value), append(doneAt, at[n])
	}
	for n, settled := range i.settle(ctx, ed, done, values, true) {
		it := &items[doneAt[n]]
		it.ResultStored, it.Err, it.Status = settled.stored, settled.err, settledStatus(settled.err)
	}
	if panicked != nil {
		panic(panicked.panicValue)
	}
	return items, nil
}

// failedWhole: every claim of the batch was lost with its connection (in
// a cluster, where one node's failure leaves the others' claims granted,
// those go on and the lost keys are BatchError).
func failedWhole(claims []claimAnswer) bool {
	for _, a := range claims {
		if !isConnError(a.err) {
			return false
		}
	}
	return len(claims) > 0
}

// runMany runs each job's work in key order under one heartbeat (OnRun of
// each first); after a panic the rest do not run. The failed ones are
// released in one batch, sent once.
func runMany[T any](ctx context.Context, i *Idem, ed Edition, jobs []*Job, work Work[T]) []ran[T] {
	out := make([]ran[T], len(jobs))
	ctxs := make([]context.Context, len(jobs))
	var runnable []*Job
	for n, job := range jobs {
		var cancel context.CancelCauseFunc
		ctxs[n], cancel = context.WithCancelCause(ctx)
		job.cancel = cancel
		defer cancel(context.Canceled)
		if out[n].err = i.core.beforeWork(job); out[n].err == nil {
			runnable = append(runnable, job)
		}
	}
	i.beats.add(runnable...)
	panicked := false
	for n, job := range jobs {
		switch {
		case out[n].err != nil:
		case panicked:
			out[n].err = errors.New("idem: not run: another work of the batch panicked")
		default:
			out[n] = safely(ctxs[n], job, work)
			panicked = out[n].panicked
		}
	}
	i.beats.remove(runnable...)
	var failed []*Job
	var failures []error
	for n, r := range out {
		if err := r.failure(); err != nil {
			failed, failures = append(failed, jobs[n]), append(failures, err)
		}
	}
	if len(failed) > 0 {
		i.releaseFailed(ctx, ed, failed, failures)
	}
	return out
}
