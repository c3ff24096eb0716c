package idem

import (
	"context"
	"sync/atomic"
	"time"
)

// Edition is which implementation of the commands a server has.
type Edition int

const (
	// EditionAuto asks the server (the default of Options.Edition).
	EditionAuto Edition = iota
	// EditionModule: the redis-idem module (IDEM.* commands).
	EditionModule
	// EditionFunctions: functions/idem.lua loaded with FUNCTION LOAD.
	EditionFunctions
)

// String is "module", "functions" or "auto".
func (e Edition) String() string {
	switch e {
	case EditionModule:
		return "module"
	case EditionFunctions:
		return "functions"
	}
	return "auto"
}

// Status is the first element of IDEM.CLAIM's answer.
type Status string

// The statuses of IDEM.CLAIM.
const (
	StatusNew       Status = "NEW"
	StatusSeen      Status = "SEEN"
	StatusRetry     Status = "RETRY"
	StatusDone      Status = "DONE"
	StatusBusy      Status = "BUSY"
	StatusMismatch  Status = "MISMATCH"
	StatusExhausted Status = "EXHAUSTED"
)

// Granted says whether the claim is now this caller's (NEW, SEEN, RETRY).
func (s Status) Granted() bool { return s == StatusNew || s == StatusSeen || s == StatusRetry }

// State is a record's state in IDEM.GET.
type State string

// The states of a record.
const (
	StateProcessing State = "processing"
	StateExpired    State = "expired"
	StateReleased   State = "released"
	StateDone       State = "done"
)

// ClaimReply is one IDEM.CLAIM answer.
type ClaimReply struct {
	Status Status
	// Token of a granted claim (NEW, SEEN, RETRY).
	Token string
	// Result stored by the record's DONE (nil when none was stored).
	Result []byte
	// LeaseLeft on the holder's lease (BUSY).
	LeaseLeft time.Duration
	// Attempt is the fencing number (the record's, or this claim's).
	Attempt int64
	// Err is set only in a batch's answers: that key's error.
	Err error
}

// DoneCode is IDEM.DONE's integer answer: 0, or 1 with the bits of what
// was dropped (3: the result, over maxmemory; 5: the Bloom add; 7: both).
type DoneCode int64

// Completed: this call completed the record (1, 3, 5, 7).
func (c DoneCode) Completed() bool { return c&1 == 1 }

// ResultDropped: completed, but the server kept no result (3, 7).
func (c DoneCode) ResultDropped() bool { return c&1 == 1 && c&2 != 0 }

// BloomDropped: completed, but the Bloom filter add was not made (5, 7).
func (c DoneCode) BloomDropped() bool { return c&1 == 1 && c&4 != 0 }

// Record is IDEM.GET's answer.
type Record struct {
	State     State
	Attempt   int64
	LeaseLeft time.Duration
	PTTL      time.Duration
	ClaimedAt time.Time // zero if never claimed
	DoneAt    time.Time // zero unless done
	// Result stored, nil when none.
	Result []byte
	// Fingerprint of the payload as 32 hex digits, "" when none.
	Fingerprint string
	// Tries are the claims since the latest requeue (what MaxTries counts);
	// nil from a module older than IDEM.REQUEUE.
	Tries *int64
	// Owner is the latest claim's OWNER ("" when it carried none, and
	// once the record is done).
	Owner string
}

// ClaimArgs are IDEM.CLAIM's options.
type ClaimArgs struct {
	Payload  []byte // nil: none
	MaxTries int    // 0: none
	Bloom    string // a filter key (module only)
	// Owner is sent as OWNER ("": none).
	Owner string
	// Wait on a busy key up to this long (module only; whole milliseconds).
	// The client's ReadTimeout must be longer; Process waits in pieces.
	Wait time.Duration
}

// DoneArgs are IDEM.DONE's options.
type DoneArgs struct {
	Result []byte        // nil: none
	Retain time.Duration // 0: the server's idem.retain
	Bloom  string        // module only
}

// DoneItem is one key of DoneMany and MDone.
type DoneItem struct {
	Key, Token string
	Result     []byte // nil: none
}

// ReleaseItem is one key of ReleaseMany and MRelease.
type ReleaseItem struct{ Key, Token string }

// DoneAnswer is one key's answer in DoneMany and MDone.
type DoneAnswer struct {
	Code DoneCode
	// Err is the key's error; with Options.Durable, a *NotDurableError
	// for a completion (Code says so) the replicas did not acknowledge.
	Err error
}

// ReleaseAnswer is one key's answer in ReleaseMany and MRelease.
type ReleaseAnswer struct {
	Released bool
	Err      error
}

// MaxBatch is the most keys one batch command carries.
const MaxBatch = 10000

// Work is what Process runs for a key: ctx is cancelled when the job's
// lease is found lost (with ErrLeaseLost as its cause) or the caller's
// context ends.
type Work[T any] func(ctx context.Context, job *Job) (T, error)

// Outcome is a Process call's answer.
type Outcome[T any] struct {
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
	// Acked: WithAck's command ran (never on a replay).
	Acked bool
}

// BatchStatus is what became of one key of ProcessMany.
type BatchStatus string

// The statuses of ProcessMany's items.
const (
	BatchProcessed  BatchStatus = "processed"   // the work ran and the record is completed
	BatchReplayed   BatchStatus = "replayed"    // already done: the stored result
	BatchBusy       BatchStatus = "busy"        // another worker holds it (not waited for)
	BatchFailed     BatchStatus = "failed"      // the work or OnRun failed: released
	BatchLost       BatchStatus = "lost"        // the lease was lost: its result not kept
	BatchMismatch   BatchStatus = "mismatch"    // claimed before with another payload
	BatchExhausted  BatchStatus = "exhausted"   // MaxTries used: dead-letter it
	BatchNotDurable BatchStatus = "not_durable" // Durable: not acknowledged (see Err)
	BatchError      BatchStatus = "error"       // the key's own error (ErrWrongType, ErrDoneUnconfirmed, ...)
)

// BatchItem is one key's outcome in ProcessMany.
type BatchItem[T any] struct {
	Key    string
	Status BatchStatus
	// Value as in Outcome (also with ErrDoneUnconfirmed and ErrNotDurable
	// at the DONE, where the work ran).
	Value        T
	Err          error
	Attempt      int64
	ResultStored bool
}

// Job is one claimed key, given to the work.
type Job struct {
	key     string
	token   string
	attempt int64
	status  Status
	lost    atomic.Bool
	held    atomic.Int64 // the lease is known held until then (unix ns)
	cancel  context.CancelCauseFunc
	due     time.Time  // the next heartbeat, under the heartbeat's lock
	ack     *AckCmd    // WithAck
	beat    func(*Job) // WithBeat
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

// Check is nil while the lease is known to be held: not found lost, and
// not past its deadline (when the claim, or the latest EXTEND that
// succeeded, was sent, plus the lease). Past the deadline another worker
// may hold the key already, though no heartbeat told yet (this process
// was paused, a heartbeat is late): call Check right before an effect
// that the store it goes to cannot fence with Attempt. Its error is a
// *LeaseLostError.
func (j *Job) Check() error {
	if j.lost.Load() || time.Now().UnixNano() > j.held.Load() {
		return &LeaseLostError{Key: j.key, Attempt: j.attempt}
	}
	return nil
}

// heldFrom: a claim or EXTEND sent at sent (and granted) holds the lease
// for lease from then on.
func (j *Job) heldFrom(sent time.Time, lease time.Duration) {
	until := sent.Add(lease).UnixNano()
	for {
		old := j.held.Load()
		if until <= old || j.held.CompareAndSwap(old, until) {
			return
		}
	}
}
