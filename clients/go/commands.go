package idem

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// The typed commands, each the server's command as it is (Process and the
// batch helpers build on the same builders), and the builders themselves:
// the arguments of each command on an edition, without I/O.

// Claim sends IDEM.CLAIM (FCALL idem_claim on the Functions edition).
func (i *Idem) Claim(ctx context.Context, key string, lease time.Duration, args ClaimArgs) (ClaimReply, error) {
	secs, err := seconds("lease", lease)
	if err != nil {
		return ClaimReply{}, err
	}
	ed, err := i.Edition(ctx)
	if err != nil {
		return ClaimReply{}, err
	}
	cmd, err := i.core.claimCmd(ed, key, secs, args)
	if err != nil {
		return ClaimReply{}, err
	}
	v, err := i.do(ctx, cmd, false)
	if err != nil {
		return ClaimReply{}, err
	}
	return parseClaim(v)
}

// Done sends IDEM.DONE (FCALL idem_done).
func (i *Idem) Done(ctx context.Context, key, token string, args DoneArgs) (DoneCode, error) {
	ed, err := i.Edition(ctx)
	if err != nil {
		return 0, err
	}
	cmd, err := i.core.doneCmd(ed, DoneItem{Key: key, Token: token, Result: args.Result}, args.Retain, args.Bloom)
	if err != nil {
		return 0, err
	}
	v, err := i.do(ctx, cmd, false)
	n, _ := v.(int64)
	return DoneCode(n), err
}

// Release sends IDEM.RELEASE: true when the live claim was given up.
func (i *Idem) Release(ctx context.Context, key, token string) (bool, error) {
	ed, err := i.Edition(ctx)
	if err != nil {
		return false, err
	}
	v, err := i.do(ctx, i.core.keyCmd(ed, "IDEM.RELEASE", "idem_release", key, token), false)
	return v == int64(1), err
}

// Extend sends IDEM.EXTEND: a *ServerError of KindStale (ErrStale) when
// the token no longer holds the claim.
func (i *Idem) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	secs, err := seconds("lease", lease)
	if err != nil {
		return err
	}
	ed, err := i.Edition(ctx)
	if err != nil {
		return err
	}
	_, err = i.do(ctx, i.core.keyCmd(ed, "IDEM.EXTEND", "idem_extend", key, token, secs), false)
	return err
}

// Once sends IDEM.ONCE: true when the key had no record and now has one.
func (i *Idem) Once(ctx context.Context, key string, retain time.Duration) (bool, error) {
	secs, err := seconds("retain", retain)
	if err != nil {
		return false, err
	}
	ed, err := i.Edition(ctx)
	if err != nil {
		return false, err
	}
	v, err := i.do(ctx, i.core.keyCmd(ed, "IDEM.ONCE", "idem_once", key, secs), false)
	return v == int64(1), err
}

// Get sends IDEM.GET (FCALL_RO idem_get): nil without error when the key
// has no record.
func (i *Idem) Get(ctx context.Context, key string) (*Record, error) {
	ed, err := i.Edition(ctx)
	if err != nil {
		return nil, err
	}
	v, err := i.do(ctx, i.core.getCmd(ed, key), false)
	return parseRecord(v, err)
}

// Requeue sends IDEM.REQUEUE (FCALL idem_requeue): true when the record's
// work was given back (released now, its attempt kept so the next claim is
// RETRY with attempt + 1, its tries restarted), false when there is no
// record. A record whose lease is live is refused: ErrLiveLease (a
// *ServerError of KindLiveLease), the record unchanged.
func (i *Idem) Requeue(ctx context.Context, key string) (bool, error) {
	ed, err := i.Edition(ctx)
	if err != nil {
		return false, err
	}
	v, err := i.do(ctx, i.core.keyCmd(ed, "IDEM.REQUEUE", "idem_requeue", key), false)
	return v == int64(1), err
}

// keyCmd is a one-key command of either edition with its arguments.
func (c *core) keyCmd(ed Edition, module, function, key string, args ...any) []any {
	cmd := make([]any, 0, 4+len(args)+8)
	if ed == EditionModule {
		cmd = append(cmd, module, c.prefix+key)
	} else {
		cmd = append(cmd, "FCALL", function, 1, c.prefix+key)
	}
	return append(cmd, args...)
}

func (c *core) getCmd(ed Edition, key string) []any {
	cmd := c.keyCmd(ed, "IDEM.GET", "idem_get", key)
	if ed != EditionModule {
		cmd[0] = "FCALL_RO"
	}
	return cmd
}

func (c *core) claimCmd(ed Edition, key string, leaseSecs int64, a ClaimArgs) ([]any, error) {
	cmd := c.keyCmd(ed, "IDEM.CLAIM", "idem_claim", key, leaseSecs)
	if a.Payload != nil {
		cmd = append(cmd, "PAYLOAD", a.Payload)
	}
	if a.MaxTries > 0 {
		cmd = append(cmd, "MAXTRIES", a.MaxTries)
	}
	if a.Owner != "" {
		cmd = append(cmd, "OWNER", a.Owner)
	}
	if a.Bloom != "" {
		if ed != EditionModule {
			return nil, moduleRequired("BLOOM")
		}
		cmd = append(cmd, "BLOOM", c.prefix+a.Bloom)
	}
	if a.Wait > 0 {
		if ed != EditionModule {
			return nil, moduleRequired("WAIT")
		}
		cmd = append(cmd, "WAIT", max(int64(a.Wait/time.Millisecond), 1))
	}
	return cmd, nil
}

func (c *core) doneCmd(ed Edition, it DoneItem, retain time.Duration, bloom string) ([]any, error) {
	cmd := c.keyCmd(ed, "IDEM.DONE", "idem_done", it.Key, it.Token)
	if it.Result != nil {
		cmd = append(cmd, "RESULT", it.Result)
	}
	if retain != 0 {
		secs, err := seconds("retain", retain)
		if err != nil {
			return nil, err
		}
		cmd = append(cmd, "RETAIN", secs)
	}
	if bloom != "" {
		if ed != EditionModule {
			return nil, moduleRequired("BLOOM")
		}
		cmd = append(cmd, "BLOOM", c.prefix+bloom)
	}
	return cmd, nil
}

// claimArgs are the loop's claims: the instance's settings.
func (c *core) claimArgs(payload []byte, wait time.Duration) ClaimArgs {
	return ClaimArgs{Payload: payload, MaxTries: c.maxTries, Bloom: c.bloom, Owner: c.owner, Wait: wait}
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

// parseRecord reads IDEM.GET's answer (nil: no record).
func parseRecord(v any, err error) (*Record, error) {
	if errors.Is(err, redis.Nil) || (err == nil && v == nil) {
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
		Owner:     str(fields["owner"]),
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
