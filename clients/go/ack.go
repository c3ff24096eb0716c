package idem

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// A broker's acknowledgement that goes with the record's DONE (WithAck),
// and the heartbeat's call per job (WithBeat): what the broker adapters
// build on, for anyone who writes one.

// AckCmd is a Redis command that acknowledges a message, run with the
// record's DONE (WithAck): XACK stream group id is
// AckCmd{Name: "XACK", Keys: []string{stream}, Args: []any{group, id}}.
type AckCmd struct {
	Name string
	// Keys are the command's keys, before Args (not prefixed).
	Keys []string
	Args []any
}

func (a *AckCmd) args() []any {
	cmd := make([]any, 0, 1+len(a.Keys)+len(a.Args))
	cmd = append(cmd, a.Name)
	for _, k := range a.Keys {
		cmd = append(cmd, k)
	}
	return append(cmd, a.Args...)
}

// WithAck runs ack only when this call's DONE completes the record, and
// tells in Outcome.Acked whether it ran. On the module edition, when ack's
// keys share the record's slot (always outside a cluster), one script runs
// the DONE and then the ack, in the DONE's round trip; on the Functions
// edition (a script cannot call a function) and across slots, the ack
// follows the DONE's answer. A replay does not send it: acknowledge the
// message yourself. Process only (ProcessMany ignores it).
func WithAck(ack AckCmd) CallOption { return func(c *call) { c.ack = &ack } }

// WithBeat calls beat after each heartbeat that extended a job's lease
// (from the heartbeat's timer: keep it short, as a broker's "in progress"
// signal is), so that a broker's own deadline follows the lease.
func WithBeat(beat func(job *Job)) CallOption { return func(c *call) { c.beat = beat } }

// doneAndAck runs IDEM.DONE, then the ack when it completed the record:
// ARGV[1] is how many of the DONE's arguments follow the record's key,
// then those, the ack's name and its arguments; KEYS the record's key,
// then the ack's keys. It answers {DONE's answer, 1 when acked} or DONE's
// error.
const doneAndAck = `local n = tonumber(ARGV[1])
local r = redis.pcall('IDEM.DONE', KEYS[1], unpack(ARGV, 2, n + 1))
if type(r) == 'table' and r.err then return r end
if r % 2 == 0 then return {r, 0} end
local cmd = {ARGV[n + 2]}
for k = 2, #KEYS do cmd[#cmd + 1] = KEYS[k] end
for k = n + 3, #ARGV do cmd[#cmd + 1] = ARGV[k] end
local a = redis.pcall(unpack(cmd))
if type(a) == 'table' and a.err then return {r, 0} end
return {r, 1}`

var doneAndAckSHA = func() string {
	h := sha1.Sum([]byte(doneAndAck))
	return hex.EncodeToString(h[:])
}()

// doneAcking sends a DONE that carries its ack: in the script where it can
// (ackedHere then says whether the ack ran), else the plain DONE.
func (i *Idem) doneAcking(ctx context.Context, ed Edition, item DoneItem, ack *AckCmd) doneAnswer {
	if ed != EditionModule || !i.sameSlot(item.Key, ack.Keys) {
		return i.doneOne(ctx, ed, item)
	}
	done, err := i.core.doneCmd(ed, item, i.core.retain, i.core.bloom)
	if err != nil {
		return doneAnswer{err: err}
	}
	doneArgs := done[2:] // after "IDEM.DONE" and the key
	keys := append([]any{i.core.prefix + item.Key}, toAny(ack.Keys)...)
	args := append([]any{len(doneArgs)}, doneArgs...)
	args = append(append(args, ack.Name), ack.Args...)
	evalsha := append(append([]any{"EVALSHA", doneAndAckSHA, len(keys)}, keys...), args...)
	p := i.exchange(ctx, evalsha, item.Key, true, true)
	if redis.HasErrorPrefix(p.err, "NOSCRIPT") { // not run: send the script itself
		p = i.exchange(ctx, append([]any{"EVAL", doneAndAck}, evalsha[2:]...), item.Key, true, true)
	}
	if p.err != nil {
		return doneAnswer{err: p.err, ack: p.ack}
	}
	pair, ok := p.value.([]any)
	if !ok || len(pair) != 2 {
		return doneAnswer{err: fmt.Errorf("idem: unexpected DONE reply %v", p.value), ack: p.ack}
	}
	code, _ := pair[0].(int64)
	return doneAnswer{code: DoneCode(code), ack: p.ack, acked: pair[1] == int64(1)}
}

// sameSlot: the ack's keys are in the record's slot (any key is, outside a
// cluster).
func (i *Idem) sameSlot(key string, keys []string) bool {
	if !i.core.cluster {
		return true
	}
	s := slot(i.core.prefix + key)
	for _, k := range keys {
		if slot(k) != s {
			return false
		}
	}
	return true
}

// ackAfter sends the ack alone after a settle that completed the record
// without running it (the Functions edition, another slot, a resent DONE
// whose first send's answer was lost): whether it ran.
func (i *Idem) ackAfter(ctx context.Context, ack *AckCmd, settled next) bool {
	if settled.acked {
		return true
	}
	if settledStatus(settled.err) != BatchProcessed {
		return false
	}
	ctx, cancel := i.settling(ctx)
	defer cancel()
	_, err := i.do(ctx, ack.args(), false)
	return err == nil
}

func toAny(keys []string) []any {
	out := make([]any, len(keys))
	for n, k := range keys {
		out[n] = k
	}
	return out
}

// ErrMissingKey: a message has no key (a broker adapter's key function
// found none). The adapters handle it as a failure that no retry can
// mend: the message goes to the dead letter, never through unclaimed.
var ErrMissingKey = errors.New("idem: the message has no key")
