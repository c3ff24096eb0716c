package idem

import (
	"fmt"
	"os"
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

// BatchMode is Options.Batch: whether concurrent Process calls on one Idem
// share one batch command per tick.
type BatchMode int

const (
	// BatchDefault is the library's default: on (see the README).
	BatchDefault BatchMode = iota
	// BatchOn: while a claim (or a DONE) is in flight, the ones that
	// arrive queue and go as one IDEM.MCLAIM (IDEM.MDONE) when it returns.
	BatchOn
	// BatchOff: every call sends its own commands.
	BatchOff
)

// Durable makes every claim that grants work, and every DONE, wait for
// replicas (WAIT, pipelined on the same connection) before the work
// starts, and before Process returns.
type Durable struct {
	// Replicas that must acknowledge (0 and more).
	Replicas int
	// Timeout of one WAIT: default 1 s, whole milliseconds. It must be
	// shorter than the client's ReadTimeout.
	Timeout time.Duration
	// Fsync sends WAITAOF 1 Replicas Timeout instead: the primary's AOF
	// and the replicas' fsynced (Redis 7.2+, Valkey 8+, appendonly yes).
	Fsync bool
}

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
	// DoneTimeout is how long one DONE (and its WAIT) may take before it
	// counts as lost: default 5 s. It is the DONE's context deadline, which
	// go-redis applies with ContextTimeoutEnabled; without it the client's
	// ReadTimeout (go-redis v9.23's default: 5 s) bounds each DONE.
	DoneTimeout time.Duration
	// Owner is sent as OWNER with every claim, for operators to see who
	// holds a key: default the host name, ":", the process id.
	Owner string
	// Durable, when set, waits for replicas after claims and DONEs.
	Durable *Durable
	// Batch: concurrent calls share one batch command per tick.
	Batch BatchMode
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
	NotDurable                                                    uint64
}

type counters struct {
	firstRuns, retries, replays, waits, busy, completed, released atomic.Uint64
	leasesLost, resultsDropped, mismatches, exhausted, extends    atomic.Uint64
	notDurable                                                    atomic.Uint64
}

// settings are Options resolved once, when the Idem is made.
type settings struct {
	prefix      string
	lease       time.Duration
	leaseSecs   int64
	wait        time.Duration
	heartbeat   time.Duration
	maxTries    int
	retain      time.Duration
	doneRetries int
	doneTimeout time.Duration
	owner       string
	durable     *Durable
	batch       bool
	oversize    Oversize
	codec       Codec
	bloom       string
	hooks       Hooks
	cluster     bool
	readTimeout time.Duration // 0: none
	// ctxDeadlines: the client applies a context's deadline to its I/O
	// (ContextTimeoutEnabled), so DoneTimeout is given as one.
	ctxDeadlines bool
	// blockers is how many claims may block in WAIT at once: half the
	// client's pool, so that the holders' DONEs always find a connection.
	blockers int
}

// defaultOwner is host:pid (Go programs do not fork, so it is read once).
var defaultOwner = func() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return fmt.Sprintf("%s:%d", host, os.Getpid())
}()

func resolve(client redis.UniversalClient, opts Options) (settings, error) {
	s := settings{prefix: opts.Prefix, maxTries: opts.MaxTries, retain: opts.Retain, oversize: opts.Oversize,
		codec: opts.Codec, bloom: opts.Bloom, hooks: opts.Hooks, owner: opts.Owner}
	s.lease = defaulted(opts.Lease, 30*time.Second)
	var err error
	if s.leaseSecs, err = seconds("Lease", s.lease); err != nil {
		return s, err
	}
	if opts.Retain != 0 {
		if _, err := seconds("Retain", opts.Retain); err != nil {
			return s, err
		}
	}
	if opts.MaxTries < 0 {
		return s, fmt.Errorf("idem: MaxTries must be positive (got %d)", opts.MaxTries)
	}
	if s.owner == "" {
		s.owner = defaultOwner
	} else if len(s.owner) > 64 {
		return s, fmt.Errorf("idem: Owner is at most 64 bytes (got %d)", len(s.owner))
	}
	s.wait = defaulted(opts.Wait, 10*time.Second)
	s.heartbeat = defaulted(opts.Heartbeat, s.lease/3)
	s.doneTimeout = defaulted(opts.DoneTimeout, 5*time.Second)
	switch {
	case opts.DoneRetries == 0:
		s.doneRetries = 5
	case opts.DoneRetries > 0:
		s.doneRetries = opts.DoneRetries
	}
	if d := opts.Durable; d != nil {
		durable := *d
		durable.Timeout = defaulted(d.Timeout, time.Second)
		if durable.Replicas < 0 || durable.Timeout%time.Millisecond != 0 {
			return s, fmt.Errorf("idem: Durable needs Replicas >= 0 and a Timeout of whole milliseconds (got %+v)", *d)
		}
		s.durable = &durable
	}
	s.batch = opts.Batch != BatchOff
	if s.codec == nil {
		s.codec = JSONCodec{}
	}
	s.readTimeout, s.blockers = 3*time.Second, 5
	switch c := client.(type) {
	case *redis.Client:
		o := c.Options()
		s.readTimeout, s.blockers, s.ctxDeadlines = o.ReadTimeout, o.PoolSize/2, o.ContextTimeoutEnabled
	case *redis.ClusterClient:
		o := c.Options()
		s.cluster = true
		s.readTimeout, s.blockers, s.ctxDeadlines = o.ReadTimeout, o.PoolSize/2, o.ContextTimeoutEnabled
	}
	s.blockers = max(s.blockers, 1)
	s.readTimeout = max(s.readTimeout, 0)
	return s, nil
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

func seconds(name string, d time.Duration) (int64, error) {
	if d < time.Second || d%time.Second != 0 {
		return 0, fmt.Errorf("idem: %s must be whole seconds, at least 1 (got %v)", name, d)
	}
	return int64(d / time.Second), nil
}
