package idem

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
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
}

// ClaimArgs are IDEM.CLAIM's options.
type ClaimArgs struct {
	Payload  []byte // nil: none
	MaxTries int    // 0: none
	Bloom    string // a filter key (module only)
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
	Err  error
}

// ReleaseAnswer is one key's answer in ReleaseMany and MRelease.
type ReleaseAnswer struct {
	Released bool
	Err      error
}

// MaxBatch is the most keys one batch command carries.
const MaxBatch = 10000

func seconds(name string, d time.Duration) (int64, error) {
	if d < time.Second || d%time.Second != 0 {
		return 0, fmt.Errorf("idem: %s must be whole seconds, at least 1 (got %v)", name, d)
	}
	return int64(d / time.Second), nil
}

// Edition is the edition the server has, asked once (COMMAND INFO
// IDEM.CLAIM, then FCALL_RO idem_edition 0): the module when it has both.
func (i *Idem) Edition(ctx context.Context) (Edition, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.edition != EditionAuto {
		return i.edition, nil
	}
	info, err := i.client.Do(ctx, "COMMAND", "INFO", "IDEM.CLAIM").Slice()
	if err != nil {
		return EditionAuto, err
	}
	if len(info) == 1 && info[0] != nil {
		i.edition = EditionModule
		return i.edition, nil
	}
	err = i.client.Do(ctx, "FCALL_RO", "idem_edition", 0).Err()
	if err != nil {
		if strings.Contains(strings.ToLower(err.Error()), "function not found") {
			return EditionAuto, ErrNotInstalled
		}
		return EditionAuto, err
	}
	i.edition = EditionFunctions
	return i.edition, nil
}

func (i *Idem) currentEdition() Edition {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.edition
}

// command is the name and first arguments of a command on an edition.
func (i *Idem) command(ctx context.Context, module, function, key string) ([]any, Edition, error) {
	ed, err := i.Edition(ctx)
	if err != nil {
		return nil, ed, err
	}
	if ed == EditionModule {
		return []any{module, i.prefix + key}, ed, nil
	}
	return []any{"FCALL", function, 1, i.prefix + key}, ed, nil
}

func (i *Idem) do(ctx context.Context, args []any, noRetry bool) (any, error) {
	cmd := redis.NewCmd(ctx, args...)
	if noRetry {
		_ = i.client.Process(ctx, sentOnce{cmd})
	} else {
		_ = i.client.Process(ctx, cmd)
	}
	v, err := cmd.Result()
	return v, serverError(err)
}

// sentOnce keeps go-redis from sending a command again after a connection
// error: a DONE whose reply was lost is resent by the loop itself, which
// must know it was resent (an answer 0 then may be its own completion).
type sentOnce struct{ *redis.Cmd }

func (sentOnce) NoRetry() bool { return true }

// Claim sends IDEM.CLAIM (FCALL idem_claim on the Functions edition).
func (i *Idem) Claim(ctx context.Context, key string, lease time.Duration, args ClaimArgs) (ClaimReply, error) {
	cmd, _, err := i.claimCommand(ctx, key, lease, args)
	if err != nil {
		return ClaimReply{}, err
	}
	v, err := i.do(ctx, cmd, false)
	if err != nil {
		return ClaimReply{}, err
	}
	return parseClaim(v)
}

func (i *Idem) claimCommand(ctx context.Context, key string, lease time.Duration, args ClaimArgs) ([]any, Edition, error) {
	secs, err := seconds("lease", lease)
	if err != nil {
		return nil, EditionAuto, err
	}
	cmd, ed, err := i.command(ctx, "IDEM.CLAIM", "idem_claim", key)
	if err != nil {
		return nil, ed, err
	}
	cmd = append(cmd, secs)
	if args.Payload != nil {
		cmd = append(cmd, "PAYLOAD", args.Payload)
	}
	if args.MaxTries > 0 {
		cmd = append(cmd, "MAXTRIES", args.MaxTries)
	}
	if args.Bloom != "" {
		if ed != EditionModule {
			return nil, ed, &ModuleRequiredError{"idem: BLOOM needs the redis-idem module"}
		}
		cmd = append(cmd, "BLOOM", i.prefix+args.Bloom)
	}
	if args.Wait > 0 {
		if ed != EditionModule {
			return nil, ed, &ModuleRequiredError{"idem: WAIT needs the redis-idem module"}
		}
		cmd = append(cmd, "WAIT", max(int64(args.Wait/time.Millisecond), 1))
	}
	return cmd, ed, nil
}

func parseClaim(v any) (ClaimReply, error) {
	if e, ok := v.(error); ok {
		return ClaimReply{}, serverError(e)
	}
	arr, ok := v.([]any)
	if !ok || len(arr) != 3 {
		return ClaimReply{}, fmt.Errorf("idem: unexpected CLAIM reply %v", v)
	}
	status, _ := arr[0].(string)
	attempt, _ := arr[2].(int64)
	r := ClaimReply{Status: Status(status), Attempt: attempt}
	switch r.Status {
	case StatusNew, StatusSeen, StatusRetry:
		r.Token, _ = arr[1].(string)
	case StatusDone:
		if s, ok := arr[1].(string); ok {
			r.Result = []byte(s)
		}
	case StatusBusy:
		ms, _ := arr[1].(int64)
		r.LeaseLeft = time.Duration(ms) * time.Millisecond
	case StatusMismatch, StatusExhausted:
	default:
		return ClaimReply{}, fmt.Errorf("idem: unexpected CLAIM status %q", status)
	}
	return r, nil
}

// Done sends IDEM.DONE (FCALL idem_done).
func (i *Idem) Done(ctx context.Context, key, token string, args DoneArgs) (DoneCode, error) {
	return i.done(ctx, key, token, args, false)
}

func (i *Idem) done(ctx context.Context, key, token string, args DoneArgs, once bool) (DoneCode, error) {
	cmd, ed, err := i.command(ctx, "IDEM.DONE", "idem_done", key)
	if err != nil {
		return 0, err
	}
	cmd = append(cmd, token)
	if args.Result != nil {
		cmd = append(cmd, "RESULT", args.Result)
	}
	if args.Retain != 0 {
		secs, err := seconds("retain", args.Retain)
		if err != nil {
			return 0, err
		}
		cmd = append(cmd, "RETAIN", secs)
	}
	if args.Bloom != "" {
		if ed != EditionModule {
			return 0, &ModuleRequiredError{"idem: BLOOM needs the redis-idem module"}
		}
		cmd = append(cmd, "BLOOM", i.prefix+args.Bloom)
	}
	v, err := i.do(ctx, cmd, once)
	if err != nil {
		return 0, err
	}
	n, _ := v.(int64)
	return DoneCode(n), nil
}

// Release sends IDEM.RELEASE: true when the live claim was given up.
func (i *Idem) Release(ctx context.Context, key, token string) (bool, error) {
	cmd, _, err := i.command(ctx, "IDEM.RELEASE", "idem_release", key)
	if err != nil {
		return false, err
	}
	v, err := i.do(ctx, append(cmd, token), false)
	return v == int64(1), err
}

// Extend sends IDEM.EXTEND: a *StaleError when the token no longer holds
// the claim.
func (i *Idem) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	secs, err := seconds("lease", lease)
	if err != nil {
		return err
	}
	cmd, _, err := i.command(ctx, "IDEM.EXTEND", "idem_extend", key)
	if err != nil {
		return err
	}
	_, err = i.do(ctx, append(cmd, token, secs), false)
	return err
}

// Once sends IDEM.ONCE: true when the key had no record and now has one.
func (i *Idem) Once(ctx context.Context, key string, retain time.Duration) (bool, error) {
	secs, err := seconds("retain", retain)
	if err != nil {
		return false, err
	}
	cmd, _, err := i.command(ctx, "IDEM.ONCE", "idem_once", key)
	if err != nil {
		return false, err
	}
	v, err := i.do(ctx, append(cmd, secs), false)
	return v == int64(1), err
}

// Get sends IDEM.GET (FCALL_RO idem_get): nil without error when the key
// has no record.
func (i *Idem) Get(ctx context.Context, key string) (*Record, error) {
	cmd, ed, err := i.command(ctx, "IDEM.GET", "idem_get", key)
	if err != nil {
		return nil, err
	}
	if ed == EditionFunctions {
		cmd[0] = "FCALL_RO"
	}
	v, err := i.do(ctx, cmd, false)
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	fields := fieldMap(v)
	if fields == nil {
		return nil, fmt.Errorf("idem: unexpected GET reply %v", v)
	}
	r := &Record{
		State:     State(str(fields["state"])),
		Attempt:   num(fields["attempt"]),
		LeaseLeft: time.Duration(num(fields["lease_ms"])) * time.Millisecond,
		PTTL:      time.Duration(num(fields["pttl"])) * time.Millisecond,
	}
	if ms := num(fields["claimed_at"]); ms != 0 {
		r.ClaimedAt = time.UnixMilli(ms)
	}
	if ms := num(fields["done_at"]); ms != 0 {
		r.DoneAt = time.UnixMilli(ms)
	}
	if s, ok := fields["result"].(string); ok {
		r.Result = []byte(s)
	}
	r.Fingerprint = str(fields["fingerprint"])
	if v, ok := fields["tries"]; ok && v != nil {
		n := num(v)
		r.Tries = &n
	}
	return r, nil
}

// fieldMap reads a RESP3 map or a RESP2 flat field-value array.
func fieldMap(v any) map[string]any {
	out := map[string]any{}
	switch m := v.(type) {
	case map[any]any:
		for k, val := range m {
			out[str(k)] = val
		}
	case []any:
		for j := 0; j+1 < len(m); j += 2 {
			out[str(m[j])] = m[j+1]
		}
	default:
		return nil
	}
	return out
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

func num(v any) int64 {
	switch n := v.(type) {
	case int64:
		return n
	case string:
		i, _ := strconv.ParseInt(n, 10, 64)
		return i
	case float64:
		return int64(n)
	}
	return 0
}
