package idem

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// The sentinel errors of docs/clients.md's table, for errors.Is. The
// outcomes of the loop have a struct type each (*BusyError, ...) for
// errors.As, carrying what the table says; the server's own error answers
// are one type, *ServerError, told apart by its Kind.
var (
	// ErrBusy: the key was still held by another worker when the wait ended.
	ErrBusy = errors.New("idem: busy")
	// ErrMismatch: the key was claimed with another payload.
	ErrMismatch = errors.New("idem: payload mismatch")
	// ErrExhausted: MaxTries tries were used; dead-letter the message.
	ErrExhausted = errors.New("idem: tries exhausted")
	// ErrLeaseLost: this worker's lease lapsed and another claimed the key;
	// its result is not the one kept.
	ErrLeaseLost = errors.New("idem: lease lost")
	// ErrResultNotStored: the record was completed without the result.
	ErrResultNotStored = errors.New("idem: result not stored")
	// ErrHook: a hook failed.
	ErrHook = errors.New("idem: hook failed")
	// ErrDoneUnconfirmed: DONE could not be confirmed after DoneRetries.
	ErrDoneUnconfirmed = errors.New("idem: DONE unconfirmed")
	// ErrNotDurable: Durable, and a WAIT answered fewer replicas than asked.
	ErrNotDurable = errors.New("idem: not durable")

	// ErrStale: the server answered STALE to EXTEND or DONE.
	ErrStale = errors.New("idem: stale token")
	// ErrWrongType: the key holds another type.
	ErrWrongType = errors.New("idem: wrong type")
	// ErrResultTooLarge: the server refused a RESULT as too large.
	ErrResultTooLarge = errors.New("idem: result too large")
	// ErrModuleRequired: the Functions edition cannot do this.
	ErrModuleRequired = errors.New("idem: needs the redis-idem module")
	// ErrLiveLease: Requeue was refused: the record is processing with a
	// live lease (its holder is still at work); nothing changed.
	ErrLiveLease = errors.New("idem: the record's lease is live")
	// ErrNotInstalled: the server has neither the module nor the functions.
	ErrNotInstalled = errors.New("idem: neither the redis-idem module nor its functions are installed")
)

// ErrorKind tells the server's error answers apart.
type ErrorKind int

// The kinds of *ServerError, each matching its sentinel with errors.Is.
const (
	KindStale          ErrorKind = iota + 1 // ErrStale
	KindWrongType                           // ErrWrongType
	KindResultTooLarge                      // ErrResultTooLarge
	KindModuleRequired                      // ErrModuleRequired
	KindLiveLease                           // ErrLiveLease
	KindNotInstalled                        // ErrNotInstalled
)

var kindSentinels = map[ErrorKind]error{
	KindStale: ErrStale, KindWrongType: ErrWrongType, KindResultTooLarge: ErrResultTooLarge,
	KindModuleRequired: ErrModuleRequired, KindLiveLease: ErrLiveLease, KindNotInstalled: ErrNotInstalled,
}

// ServerError is an error answer of the server that the library names
// (or, for KindModuleRequired, what the Functions edition cannot do). It
// is a go-redis reply error (it has RedisError), so a connection error is
// never mistaken for it:
//
//	var se *idem.ServerError
//	if errors.As(err, &se) && se.Kind == idem.KindStale { ... }
//	if errors.Is(err, idem.ErrStale) { ... } // the same test
type ServerError struct {
	Kind    ErrorKind
	Message string // the server's text
}

// Error is the server's text.
func (e *ServerError) Error() string { return e.Message }

// RedisError marks it a reply of the server, as go-redis's own errors are.
func (e *ServerError) RedisError() {}

// Is makes errors.Is(err, ErrStale) (and the others) true for its kind.
func (e *ServerError) Is(target error) bool { return target == kindSentinels[e.Kind] }

// serverErrorKinds: the one place where the server's texts are read, as
// go-redis reads its own (a prefix, or the words of the module's message).
var serverErrorKinds = []struct {
	kind             ErrorKind
	prefix, contains string
}{
	{KindStale, "STALE", ""},
	{KindWrongType, "WRONGTYPE", ""},
	{KindResultTooLarge, "", "larger than idem.max-result"},
	{KindResultTooLarge, "", "proto-max-bulk-len"},
	{KindModuleRequired, "", "needs the redis-idem module"},
	{KindLiveLease, "", "processing with a live lease"},
}

// serverError makes a reply error the library names a *ServerError, and
// gives any other error back as it is.
func serverError(err error) error {
	var rerr redis.Error
	if err == nil || !errors.As(err, &rerr) {
		return err
	}
	if _, named := rerr.(*ServerError); named {
		return err
	}
	msg := rerr.Error()
	for _, k := range serverErrorKinds {
		if (k.prefix != "" && redis.HasErrorPrefix(err, k.prefix)) || (k.contains != "" && strings.Contains(msg, k.contains)) {
			return &ServerError{Kind: k.kind, Message: msg}
		}
	}
	return err
}

func moduleRequired(what string) error {
	return &ServerError{Kind: KindModuleRequired, Message: "idem: " + what + " needs the redis-idem module"}
}

// isConnError: the command's fate is unknown (no reply came: a closed
// connection, a timeout), as opposed to an answer of the server.
func isConnError(err error) bool {
	var rerr redis.Error
	return err != nil && !errors.As(err, &rerr) && !errors.Is(err, redis.Nil)
}

// wroteNothing: a claim answered so changed nothing and may be sent again
// (to the new primary after a failover, which the client finds): a waiter
// unblocked, a resharding, a demoted or loading primary, a primary cut
// from its replicas (NOREPLICAS), or a connection
// lost (a claim that did run meets itself as BUSY and waits).
func wroteNothing(err error) bool {
	return redis.HasErrorPrefix(err, "UNBLOCKED") || redis.IsTryAgainError(err) || redis.IsReadOnlyError(err) ||
		redis.IsMasterDownError(err) || redis.IsLoadingError(err) || redis.HasErrorPrefix(err, "NOREPLICAS") || isConnError(err)
}

// BusyError is ErrBusy: the key's holder, still at work when the wait ended.
type BusyError struct {
	Key       string
	LeaseLeft time.Duration
	Attempt   int64
	// Owner is the holder's OWNER ("" when its claim carried none, or when
	// it could not be read; ProcessMany does not read it).
	Owner string
}

// Error is the message.
func (e *BusyError) Error() string {
	if e.Owner != "" {
		return fmt.Sprintf("idem: %q is busy (held by %s, lease left %v)", e.Key, e.Owner, e.LeaseLeft)
	}
	return fmt.Sprintf("idem: %q is busy (lease left %v)", e.Key, e.LeaseLeft)
}

// Is makes errors.Is(err, ErrBusy) true.
func (e *BusyError) Is(target error) bool { return target == ErrBusy }

// MismatchError is ErrMismatch for a key.
type MismatchError struct {
	Key     string
	Attempt int64
}

// Error is the message.
func (e *MismatchError) Error() string {
	return fmt.Sprintf("idem: %q was claimed with another payload", e.Key)
}

// Is makes errors.Is(err, ErrMismatch) true.
func (e *MismatchError) Is(target error) bool { return target == ErrMismatch }

// ExhaustedError is ErrExhausted for a key.
type ExhaustedError struct {
	Key     string
	Attempt int64
}

// Error is the message.
func (e *ExhaustedError) Error() string {
	return fmt.Sprintf("idem: %q used its %d tries", e.Key, e.Attempt)
}

// Is makes errors.Is(err, ErrExhausted) true.
func (e *ExhaustedError) Is(target error) bool { return target == ErrExhausted }

// LeaseLostError is ErrLeaseLost for a job.
type LeaseLostError struct {
	Key     string
	Attempt int64
}

// Error is the message.
func (e *LeaseLostError) Error() string {
	return fmt.Sprintf("idem: the lease of %q (attempt %d) was lost", e.Key, e.Attempt)
}

// Is makes errors.Is(err, ErrLeaseLost) true.
func (e *LeaseLostError) Is(target error) bool { return target == ErrLeaseLost }

// ResultNotStoredError is ErrResultNotStored: the record is completed (the
// work never runs again for it) but a replay gets no result.
type ResultNotStoredError struct {
	Key string
	// Result is the work's value.
	Result any
	// Cause is the codec's error, or why the result is too large.
	Cause error
}

// Error is the message.
func (e *ResultNotStoredError) Error() string {
	return fmt.Sprintf("idem: %q completed without its result: %v", e.Key, e.Cause)
}

// Is makes errors.Is(err, ErrResultNotStored) true.
func (e *ResultNotStoredError) Is(target error) bool { return target == ErrResultNotStored }

// Unwrap gives the cause.
func (e *ResultNotStoredError) Unwrap() error { return e.Cause }

// HookError is ErrHook: a hook (Hooks.OnRun or Hooks.OnDone) failed or
// panicked. Before the work the claim was released; after it the record is
// completed and Result holds the work's value.
type HookError struct {
	Hook   string // "on_run" or "on_done"
	Cause  error
	Result any
}

// Error is the message.
func (e *HookError) Error() string { return fmt.Sprintf("idem: hook %s: %v", e.Hook, e.Cause) }

// Is makes errors.Is(err, ErrHook) true.
func (e *HookError) Is(target error) bool { return target == ErrHook }

// Unwrap gives the cause.
func (e *HookError) Unwrap() error { return e.Cause }

// DoneUnconfirmedError is ErrDoneUnconfirmed: do not acknowledge the
// message; its redelivery replays or, if the lease lapsed first, retries.
type DoneUnconfirmedError struct {
	Key    string
	Result any
	Cause  error
}

// Error is the message.
func (e *DoneUnconfirmedError) Error() string {
	return fmt.Sprintf("idem: DONE of %q unconfirmed: %v", e.Key, e.Cause)
}

// Is makes errors.Is(err, ErrDoneUnconfirmed) true.
func (e *DoneUnconfirmedError) Is(target error) bool { return target == ErrDoneUnconfirmed }

// Unwrap gives the cause.
func (e *DoneUnconfirmedError) Unwrap() error { return e.Cause }

// Stage is where durability failed.
type Stage string

// The stages of a *NotDurableError.
const (
	// StageClaim: the claim was released; the work never ran.
	StageClaim Stage = "claim"
	// StageDone: the record is done on the primary; do not acknowledge
	// the message.
	StageDone Stage = "done"
)

// NotDurableError is ErrNotDurable: Options.Durable, and the WAIT (or
// WAITAOF) after a claim or a DONE answered fewer replicas than asked, or
// was refused.
type NotDurableError struct {
	Key   string
	Stage Stage
	// Acknowledged is how many replicas did.
	Acknowledged int64
	// Result is the work's value (StageDone).
	Result any
	// Cause is the WAIT's own error, if it failed.
	Cause error
}

// Error is the message.
func (e *NotDurableError) Error() string {
	msg := fmt.Sprintf("idem: the %s of %q was acknowledged by %d replicas only", e.Stage, e.Key, e.Acknowledged)
	if e.Cause != nil {
		msg += ": " + e.Cause.Error()
	}
	return msg
}

// Is makes errors.Is(err, ErrNotDurable) true.
func (e *NotDurableError) Is(target error) bool { return target == ErrNotDurable }

// Unwrap gives the cause.
func (e *NotDurableError) Unwrap() error { return e.Cause }
