package idem

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Off turns off Options.Wait or Options.Heartbeat (their zero value is the
// default, not none).
const Off time.Duration = -1

// Oversize is what Process does with a result over the server's
// idem.max-result. Both complete the record: the work never runs again.
type Oversize int

const (
	// OversizeComplete returns the value with ResultStored false.
	OversizeComplete Oversize = iota
	// OversizeError returns a *ResultNotStoredError carrying the value.
	OversizeError
)

// Options configure an Idem. The zero value of each field is its default.
type Options struct {
	// Prefix is put before every key ("tenant-a:"). In a cluster a hash tag
	// in the key still decides its slot.
	Prefix string
	// Lease a claim is held for between heartbeats: whole seconds, default 30 s.
	Lease time.Duration
	// Wait is how long a duplicate waits for the copy in flight: default
	// 10 s, Off for none.
	Wait time.Duration
	// Heartbeat is the time between EXTENDs while the work runs: default
	// Lease/3, Off for none.
	Heartbeat time.Duration
	// MaxTries makes a key a dead letter (ErrExhausted) after that many
	// tries: 0 for no limit.
	MaxTries int
	// Retain is how long a done record is kept: whole seconds, 0 for the
	// server's idem.retain.
	Retain time.Duration
	// DoneRetries is how often a DONE is sent again after a connection
	// error (50 ms doubling): default 5, negative for none.
	DoneRetries int
	// Oversize is the policy for results over idem.max-result.
	Oversize Oversize
	// Codec encodes results: default JSONCodec.
	Codec Codec
	// Bloom names a filter key (module only): claims answer SEEN for keys
	// it may have seen complete, and completions are added to it.
	Bloom string
	// Edition skips asking the server which edition it has.
	Edition Edition
	// Hooks are called as the loop goes.
	Hooks Hooks
}

// Hooks are called as the loop goes; all are optional. OnRun and OnDone
// returning an error (or panicking) is an ErrHook for the caller; what the
// others do does not change the outcome, and their panics are ignored.
type Hooks struct {
	OnRun           func(job *Job) error
	OnReplay        func(key string, attempt int64)
	OnBusy          func(key string, leaseLeft time.Duration)
	OnDone          func(job *Job, resultStored bool) error
	OnRelease       func(job *Job, err error)
	OnLeaseLost     func(job *Job)
	OnResultDropped func(job *Job, reason string) // "oversize", "unserializable", "memory"
}

// Stats are an Idem's counters (docs/clients.md's table).
type Stats struct {
	FirstRuns, Retries, Replays, Waits, Busy, Completed, Released uint64
	LeasesLost, ResultsDropped, Mismatches, Exhausted, Extends    uint64
}

type counters struct {
	firstRuns, retries, replays, waits, busy, completed, released atomic.Uint64
	leasesLost, resultsDropped, mismatches, exhausted, extends    atomic.Uint64
}

// Idem runs the consumer loop and the typed commands on one client. It is
// safe for concurrent use.
type Idem struct {
	client      redis.UniversalClient
	opts        Options
	prefix      string
	lease       time.Duration
	wait        time.Duration
	heartbeat   time.Duration
	doneRetries int
	codec       Codec
	cluster     bool
	readTimeout time.Duration // 0: none

	mu      sync.Mutex
	edition Edition

	stats counters
}

// New makes an Idem on a go-redis client (a single server, a cluster or a
// failover client). It sends nothing: the edition is asked at the first
// command. Its only error is an invalid option.
func New(client redis.UniversalClient, opts Options) (*Idem, error) {
	i := &Idem{client: client, opts: opts, prefix: opts.Prefix, edition: opts.Edition, codec: opts.Codec}
	i.lease = defaulted(opts.Lease, 30*time.Second)
	if _, err := seconds("Lease", i.lease); err != nil {
		return nil, err
	}
	if opts.Retain != 0 {
		if _, err := seconds("Retain", opts.Retain); err != nil {
			return nil, err
		}
	}
	i.wait = defaulted(opts.Wait, 10*time.Second)
	i.heartbeat = defaulted(opts.Heartbeat, i.lease/3)
	i.doneRetries = opts.DoneRetries
	if i.doneRetries == 0 {
		i.doneRetries = 5
	} else if i.doneRetries < 0 {
		i.doneRetries = 0
	}
	if i.codec == nil {
		i.codec = JSONCodec{}
	}
	if opts.MaxTries < 0 {
		return nil, fmt.Errorf("idem: MaxTries must be positive (got %d)", opts.MaxTries)
	}
	switch c := client.(type) {
	case *redis.Client:
		i.readTimeout = c.Options().ReadTimeout
	case *redis.ClusterClient:
		i.cluster = true
		i.readTimeout = c.Options().ReadTimeout
	default:
		i.readTimeout = 3 * time.Second
	}
	if i.readTimeout < 0 {
		i.readTimeout = 0
	}
	return i, nil
}

// defaulted: zero is the default, Off (or any negative) none.
func defaulted(d, def time.Duration) time.Duration {
	switch {
	case d == 0:
		return def
	case d < 0:
		return 0
	}
	return d
}

// Stats is a snapshot of the counters.
func (i *Idem) Stats() Stats {
	c := &i.stats
	return Stats{
		FirstRuns: c.firstRuns.Load(), Retries: c.retries.Load(), Replays: c.replays.Load(),
		Waits: c.waits.Load(), Busy: c.busy.Load(), Completed: c.completed.Load(),
		Released: c.released.Load(), LeasesLost: c.leasesLost.Load(),
		ResultsDropped: c.resultsDropped.Load(), Mismatches: c.mismatches.Load(),
		Exhausted: c.exhausted.Load(), Extends: c.extends.Load(),
	}
}

// Job is one claimed key, given to the work.
type Job struct {
	key     string
	token   string
	attempt int64
	status  Status
	lost    atomic.Bool
	cancel  context.CancelCauseFunc
}

// Key is the key as the caller gave it (without the prefix).
func (j *Job) Key() string { return j.key }

// Attempt is the fencing number: 1 for the first claim, +1 for each retry.
// Pass it to the systems the work writes to, so that a worker that lost its
// lease cannot overwrite a later one's writes.
func (j *Job) Attempt() int64 { return j.attempt }

// Status says how the claim was granted: StatusNew, StatusSeen or StatusRetry.
func (j *Job) Status() Status { return j.status }

// Lost reports that the lease was found lost while the work ran (the
// work's context is then cancelled with ErrLeaseLost as its cause).
func (j *Job) Lost() bool { return j.lost.Load() }

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

// loseLease marks the job lost, once: counted, its context cancelled.
func (i *Idem) loseLease(job *Job) {
	if !job.lost.CompareAndSwap(false, true) {
		return
	}
	i.stats.leasesLost.Add(1)
	job.cancel(ErrLeaseLost)
	if h := i.opts.Hooks.OnLeaseLost; h != nil {
		quietly(func() { h(job) })
	}
}

// onClaim counts a claim's answer and makes it a job, a replay or an error
// (nil, nil for BUSY, which the caller decides on).
func (i *Idem) onClaim(key string, r ClaimReply) (*Job, error) {
	switch r.Status {
	case StatusNew, StatusSeen, StatusRetry:
		if r.Status == StatusNew {
			i.stats.firstRuns.Add(1)
		} else {
			i.stats.retries.Add(1)
		}
		job := &Job{key: key, token: r.Token, attempt: r.Attempt, status: r.Status}
		return job, nil
	case StatusDone:
		i.stats.replays.Add(1)
		if h := i.opts.Hooks.OnReplay; h != nil {
			quietly(func() { h(key, r.Attempt) })
		}
		return nil, nil
	case StatusMismatch:
		i.stats.mismatches.Add(1)
		return nil, &MismatchError{Key: key, Attempt: r.Attempt}
	case StatusExhausted:
		i.stats.exhausted.Add(1)
		return nil, &ExhaustedError{Key: key, Attempt: r.Attempt}
	}
	return nil, nil
}

// waitPiece is the longest WAIT that fits the client's read timeout.
func (i *Idem) waitPiece(left time.Duration) time.Duration {
	rt := i.readTimeout
	switch {
	case rt == 0:
		return left
	case rt >= 2*time.Second:
		return min(left, rt-time.Second)
	}
	return min(left, rt/2)
}

// backoff is the Functions edition's polling: 10 ms doubling to 1 s,
// jittered, never past the holder's lease end nor the deadline.
type backoff struct{ next time.Duration }

func (b *backoff) pause(leaseLeft, left time.Duration) time.Duration {
	if b.next == 0 {
		b.next = 10 * time.Millisecond
	}
	p := min(b.next, max(leaseLeft, time.Millisecond), left)
	b.next = min(2*b.next, time.Second)
	// Jitter: between half and all of it, so that waiters spread out.
	return p/2 + time.Duration(time.Now().UnixNano()%int64(p/2+1))
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
