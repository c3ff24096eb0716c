package idem

import (
	"context"
	"errors"
	"time"
)

// ItemStatus is what became of one key of ProcessMany.
type ItemStatus string

// The statuses of ProcessMany's items.
const (
	ItemProcessed ItemStatus = "processed" // the work ran and the record is completed
	ItemReplayed  ItemStatus = "replayed"  // already done: the stored result
	ItemBusy      ItemStatus = "busy"      // another worker holds it (not waited for)
	ItemFailed    ItemStatus = "failed"    // the work or OnRun failed: released
	ItemLost      ItemStatus = "lost"      // the lease was lost: its result not kept
	ItemMismatch  ItemStatus = "mismatch"
	ItemExhausted ItemStatus = "exhausted"
	ItemError     ItemStatus = "error" // the key's own error (e.g. ErrWrongType)
)

// Item is one key's outcome in ProcessMany.
type Item[T any] struct {
	Key          string
	Status       ItemStatus
	Value        T
	Err          error
	Attempt      int64
	ResultStored bool
}

// ProcessMany is Process for a batch: one ClaimMany, the work for each
// granted key in key order under one heartbeat, the successes completed in
// one DoneMany and the failures released in one ReleaseMany. It answers
// one item per key, in order; a busy key is not waited for. The error is
// only for the batch as a whole (a connection's).
func ProcessMany[T any](ctx context.Context, i *Idem, keys []string, work Work[T], opts ...CallOption) ([]Item[T], error) {
	c := i.call(opts)
	replies, err := i.ClaimMany(ctx, keys, i.lease, c.payloads)
	if err != nil {
		return nil, err
	}
	items := make([]Item[T], len(keys))
	var jobs []*Job
	var at []int
	for j, r := range replies {
		it := &items[j]
		it.Key, it.Attempt = keys[j], r.Attempt
		if r.Err != nil {
			it.Status, it.Err = ItemError, r.Err
			continue
		}
		job, err := i.onClaim(keys[j], r)
		switch {
		case job != nil:
			jobs, at = append(jobs, job), append(at, j)
		case errors.Is(err, ErrMismatch):
			it.Status, it.Err = ItemMismatch, err
		case errors.Is(err, ErrExhausted):
			it.Status, it.Err = ItemExhausted, err
		case r.Status == StatusBusy:
			i.stats.busy.Add(1)
			it.Status, it.Err = ItemBusy, &BusyError{Key: keys[j], LeaseLeft: r.LeaseLeft, Attempt: r.Attempt}
		default:
			it.Status = ItemReplayed
			if r.Result != nil {
				it.Err = c.codec.Decode(r.Result, &it.Value)
				it.ResultStored = it.Err == nil
			}
		}
	}
	if len(jobs) == 0 {
		return items, nil
	}
	outs := i.run(ctx, jobs, func(ctx context.Context, j *Job) (any, error) { return work(ctx, j) })
	var panicked *outcome
	var done []int
	var doneItems []DoneItem
	encErrs := map[int]error{}
	for n, o := range outs {
		it := &items[at[n]]
		if o.panicked && panicked == nil {
			panicked = &outs[n]
		}
		if o.err != nil || o.panicked {
			it.Status, it.Err = ItemFailed, o.err
			continue
		}
		if v, ok := o.value.(T); ok {
			it.Value = v
		}
		d := DoneItem{Key: jobs[n].key, Token: jobs[n].token}
		if d.Result, encErrs[n] = c.codec.Encode(o.value); encErrs[n] != nil {
			d.Result = nil
		}
		done, doneItems = append(done, n), append(doneItems, d)
	}
	settleMany(ctx, i, jobs, at, done, doneItems, encErrs, items)
	if panicked != nil {
		panic(panicked.panicVal)
	}
	return items, nil
}

// settleMany completes the jobs done[k] (whose works returned) with one
// DoneMany, sent again after a connection error, then once more without
// the results the server refused as too large.
func settleMany[T any](ctx context.Context, i *Idem, jobs []*Job, at, done []int, doneItems []DoneItem, encErrs map[int]error, items []Item[T]) {
	if len(done) == 0 {
		return
	}
	ctx = context.WithoutCancel(ctx)
	answers, resent, err := i.sendDoneMany(ctx, doneItems)
	if err != nil {
		for _, n := range done {
			it := &items[at[n]]
			it.Status, it.Err = ItemError, &DoneUnconfirmedError{Key: it.Key, Result: it.Value, Cause: err}
		}
		return
	}
	var again []int
	for k, a := range answers {
		if errors.Is(a.Err, ErrResultTooLarge) {
			again = append(again, k)
		}
	}
	tooLarge := map[int]error{}
	if len(again) > 0 {
		retry := make([]DoneItem, len(again))
		for m, k := range again {
			retry[m] = DoneItem{Key: doneItems[k].Key, Token: doneItems[k].Token}
		}
		second, resent2, err := i.sendDoneMany(ctx, retry)
		for m, k := range again {
			tooLarge[k] = answers[k].Err
			if err != nil {
				answers[k] = DoneAnswer{Err: &DoneUnconfirmedError{Key: retry[m].Key, Cause: err}}
			} else {
				answers[k] = second[m]
			}
		}
		resent = resent || resent2
	}
	for k, n := range done {
		job, it, a := jobs[n], &items[at[n]], answers[k]
		if a.Err == nil && a.Code == 0 && !(resent && i.ownCompletion(ctx, job)) {
			a.Err = ErrLeaseLost
		} else if a.Err == nil && a.Code == 0 {
			a.Code = 1
		}
		if a.Err != nil {
			it.Err = i.doneFailed(job, it.Value, a.Err)
			it.Status = ItemError
			if errors.Is(it.Err, ErrLeaseLost) {
				it.Status = ItemLost
			}
			continue
		}
		reason, cause := "", error(nil)
		if encErrs[n] != nil {
			reason, cause = "unserializable", encErrs[n]
		} else if tooLarge[k] != nil {
			reason, cause = "oversize", tooLarge[k]
		}
		it.Status = ItemProcessed
		it.ResultStored, it.Err = i.completed(job, it.Value, a.Code, reason, cause)
	}
}

// sendDoneMany is DoneMany sent again after a connection error (resent
// says it was: an answer 0 may then be its own first completion).
func (i *Idem) sendDoneMany(ctx context.Context, items []DoneItem) ([]DoneAnswer, bool, error) {
	delay := 50 * time.Millisecond
	for try := 0; ; try++ {
		answers, err := i.doneMany(ctx, items, i.opts.Retain, true)
		if !isConnError(err) {
			return answers, try > 0, err
		}
		if try >= i.doneRetries {
			return nil, true, err
		}
		_ = sleep(ctx, delay)
		delay *= 2
	}
}
