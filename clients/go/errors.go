package idem

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// The sentinel errors of docs/clients.md's table, for errors.Is. Each one
// has a struct type (BusyError, MismatchError, ...) for errors.As that
// carries what the table says it carries, and matches its sentinel.
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

// BusyError is ErrBusy with the holder's time left.
type BusyError struct {
	Key       string
	LeaseLeft time.Duration
	Attempt   int64
}

// Error is the message.
func (e *BusyError) Error() string {
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
	// Cause is the codec's error, or a *ResultTooLargeError.
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
	Hook   string
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

// StaleError is ErrStale with the server's text.
type StaleError struct{ Message string }

// Error is the message.
func (e *StaleError) Error() string { return e.Message }

// Is makes errors.Is(err, ErrStale) true.
func (e *StaleError) Is(target error) bool { return target == ErrStale }

// WrongTypeError is ErrWrongType with the server's text.
type WrongTypeError struct{ Message string }

// Error is the message.
func (e *WrongTypeError) Error() string { return e.Message }

// Is makes errors.Is(err, ErrWrongType) true.
func (e *WrongTypeError) Is(target error) bool { return target == ErrWrongType }

// ResultTooLargeError is ErrResultTooLarge with the server's text.
type ResultTooLargeError struct{ Message string }

// Error is the message.
func (e *ResultTooLargeError) Error() string { return e.Message }

// Is makes errors.Is(err, ErrResultTooLarge) true.
func (e *ResultTooLargeError) Is(target error) bool { return target == ErrResultTooLarge }

// ModuleRequiredError is ErrModuleRequired with what was asked of the
// Functions edition.
type ModuleRequiredError struct{ Message string }

// Error is the message.
func (e *ModuleRequiredError) Error() string { return e.Message }

// Is makes errors.Is(err, ErrModuleRequired) true.
func (e *ModuleRequiredError) Is(target error) bool { return target == ErrModuleRequired }

// LiveLeaseError is ErrLiveLease with the server's text.
type LiveLeaseError struct{ Message string }

// Error is the message.
func (e *LiveLeaseError) Error() string { return e.Message }

// Is makes errors.Is(err, ErrLiveLease) true.
func (e *LiveLeaseError) Is(target error) bool { return target == ErrLiveLease }

// serverError names a reply error of the server, or returns err as it is.
func serverError(err error) error {
	var rerr redis.Error
	if err == nil || !errors.As(err, &rerr) {
		return err
	}
	msg := rerr.Error()
	switch {
	case strings.HasPrefix(msg, "STALE"):
		return &StaleError{msg}
	case strings.HasPrefix(msg, "WRONGTYPE"):
		return &WrongTypeError{msg}
	case strings.Contains(msg, "larger than idem.max-result") || strings.Contains(msg, "proto-max-bulk-len"):
		return &ResultTooLargeError{msg}
	case strings.Contains(msg, "needs the redis-idem module"):
		return &ModuleRequiredError{msg}
	case strings.Contains(msg, "processing with a live lease"):
		return &LiveLeaseError{msg}
	}
	return err
}

// isConnError: the command's fate is unknown (no reply came), as opposed to
// an error the server answered.
func isConnError(err error) bool {
	var rerr redis.Error
	if err == nil || errors.As(err, &rerr) || errors.Is(err, redis.Nil) {
		return false
	}
	for _, named := range []error{ErrStale, ErrWrongType, ErrResultTooLarge, ErrModuleRequired, ErrLiveLease} {
		if errors.Is(err, named) {
			return false
		}
	}
	return true
}
