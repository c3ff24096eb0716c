package idem

import (
	"context"
	"errors"
	"time"
)

// The batch helpers, on one generic plan: on the module one IDEM.MCLAIM /
// MDONE / MRELEASE per hash slot (in a cluster), per class (with or
// without a payload or a result) and per MaxBatch keys; on the Functions
// edition the single command per key. All of a batch goes in one pipeline
// (with one WAIT per connection when durable), and every key gets the
// answer the single command would have given it, in order, a key's error
// in its element.

// batchPlan is a batch's commands and the items each answers.
type batchPlan struct {
	cmds    [][]any
	keys    []string // each command's first key (its node's, for the WAIT)
	members [][]int  // the items a command answers, in its reply's order
	multi   []bool   // a batch command: an array, one element per member
}

// planBatch groups the items (by their keys) into commands: single(j) for
// item j alone, multi(group) for a group. lone: a group of one goes as the
// single command (a coalesced call alone sends what it would send alone).
func (c *core) planBatch(ed Edition, keys []string, class func(int) int, single func(int) ([]any, error),
	multi func([]int) []any, lone bool) (batchPlan, error) {
	var p batchPlan
	add := func(cmd []any, members []int, isMulti bool) {
		p.cmds, p.keys = append(p.cmds, cmd), append(p.keys, keys[members[0]])
		p.members, p.multi = append(p.members, members), append(p.multi, isMulti)
	}
	if ed != EditionModule {
		for j := range keys {
			cmd, err := single(j)
			if err != nil {
				return p, err
			}
			add(cmd, []int{j}, false)
		}
		return p, nil
	}
	prefixed := make([]string, len(keys))
	for j, k := range keys {
		prefixed[j] = c.prefix + k
	}
	for _, group := range batches(prefixed, c.cluster, class) {
		if lone && len(group) == 1 {
			cmd, err := single(group[0])
			if err != nil {
				return p, err
			}
			add(cmd, group, false)
			continue
		}
		add(multi(group), group, true)
	}
	return p, nil
}

// sendBatch sends a plan: each item's reply (or error), with its WAIT's
// answer when durable.
func (i *Idem) sendBatch(ctx context.Context, p batchPlan, n int, once, durable bool) []piped {
	replies := i.roundTrip(ctx, p.cmds, p.keys, once, durable)
	out := make([]piped, n)
	for c, members := range p.members {
		r := replies[c]
		if !p.multi[c] || r.err != nil {
			for _, j := range members {
				out[j] = r
			}
			continue
		}
		arr, _ := r.value.([]any)
		for m, j := range members {
			out[j].ack = r.ack
			switch {
			case m >= len(arr):
				out[j].err = errors.New("idem: a batch reply with too few answers")
			default:
				if e, ok := arr[m].(error); ok {
					out[j].err = serverError(e)
				} else {
					out[j].value = arr[m]
				}
			}
		}
	}
	return out
}

// claimAnswer is one key's claim in a batch: its reply or error, and the
// WAIT after it.
type claimAnswer struct {
	reply ClaimReply
	err   error
	ack   acked
}

// claimBatch claims keys with the instance's settings (payloads nil, or one
// per key, nil for none).
func (i *Idem) claimBatch(ctx context.Context, ed Edition, keys []string, leaseSecs int64, payloads [][]byte, lone bool) []claimAnswer {
	c := i.core
	payload := func(j int) []byte {
		if payloads == nil {
			return nil
		}
		return payloads[j]
	}
	withPayload := func(j int) int {
		if payload(j) != nil {
			return 1
		}
		return 0
	}
	out := make([]claimAnswer, len(keys))
	plan, err := c.planBatch(ed, keys, withPayload,
		func(j int) ([]any, error) { return c.claimCmd(ed, keys[j], leaseSecs, c.claimArgs(payload(j), 0)) },
		func(group []int) []any {
			sub := make([]string, len(group))
			var ps [][]byte
			for n, j := range group {
				sub[n] = keys[j]
				if p := payload(j); p != nil {
					ps = append(ps, p)
				}
			}
			return c.mclaimCmd(sub, leaseSecs, MClaimArgs{Payloads: ps, MaxTries: c.maxTries, Bloom: c.bloom, Owner: c.owner})
		}, lone)
	if err != nil {
		for j := range out {
			out[j].err = err
		}
		return out
	}
	for j, r := range i.sendBatch(ctx, plan, len(keys), false, true) {
		out[j].ack, out[j].err = r.ack, r.err
		if r.err == nil {
			out[j].reply, out[j].err = parseClaim(r.value)
		}
	}
	return out
}

// doneAnswer is one key's DONE in a batch.
type doneAnswer struct {
	code  DoneCode
	err   error
	ack   acked
	acked bool // WithAck's script ran the ack
}

// doneBatch completes items (retain 0: the server's idem.retain); once:
// go-redis does not resend them (the loop does).
func (i *Idem) doneBatch(ctx context.Context, ed Edition, items []DoneItem, retain time.Duration, once, lone bool) []doneAnswer {
	c := i.core
	keys := make([]string, len(items))
	for j, it := range items {
		keys[j] = it.Key
	}
	withResult := func(j int) int {
		if items[j].Result != nil {
			return 1
		}
		return 0
	}
	out := make([]doneAnswer, len(items))
	fail := func(err error) []doneAnswer {
		for j := range out {
			out[j].err = err
		}
		return out
	}
	if retain != 0 {
		if _, err := seconds("retain", retain); err != nil {
			return fail(err)
		}
	}
	plan, err := c.planBatch(ed, keys, withResult,
		func(j int) ([]any, error) { return c.doneCmd(ed, items[j], retain, c.bloom) },
		func(group []int) []any {
			sub := make([]DoneItem, len(group))
			for n, j := range group {
				sub[n] = items[j]
			}
			return c.mdoneCmd(sub, MDoneArgs{Retain: retain, Bloom: c.bloom})
		}, lone)
	if err != nil {
		return fail(err)
	}
	for j, r := range i.sendBatch(ctx, plan, len(items), once, true) {
		n, _ := r.value.(int64)
		out[j] = doneAnswer{code: DoneCode(n), err: r.err, ack: r.ack}
	}
	return out
}

// releaseBatch gives up each item's live claim.
func (i *Idem) releaseBatch(ctx context.Context, ed Edition, items []ReleaseItem, once bool) []ReleaseAnswer {
	c := i.core
	keys := make([]string, len(items))
	for j, it := range items {
		keys[j] = it.Key
	}
	plan, _ := c.planBatch(ed, keys, nil,
		func(j int) ([]any, error) {
			return c.keyCmd(ed, "IDEM.RELEASE", "idem_release", items[j].Key, items[j].Token), nil
		},
		func(group []int) []any {
			sub := make([]ReleaseItem, len(group))
			for n, j := range group {
				sub[n] = items[j]
			}
			return c.mreleaseCmd(sub)
		}, false)
	out := make([]ReleaseAnswer, len(items))
	for j, r := range i.sendBatch(ctx, plan, len(items), once, false) {
		out[j] = ReleaseAnswer{Released: r.value == int64(1), Err: r.err}
	}
	return out
}

// ClaimMany claims keys for lease with the instance's MaxTries, Bloom and
// Owner (payloads nil, or one per key). With Options.Durable a key granted
// but not acknowledged is released at once and its Err is a
// *NotDurableError (StageClaim); a key answered done whose WAIT fell short
// keeps its reply (the stored Result) with a *NotDurableError (StageDone),
// as Process does. The error is a connection's, for the batch as a whole.
func (i *Idem) ClaimMany(ctx context.Context, keys []string, lease time.Duration, payloads [][]byte) ([]ClaimReply, error) {
	if payloads != nil && len(payloads) != len(keys) {
		return nil, errors.New("idem: one payload per key")
	}
	secs, err := seconds("lease", lease)
	if err != nil {
		return nil, err
	}
	ed, err := i.Edition(ctx)
	if err != nil {
		return nil, err
	}
	answers := i.claimBatch(ctx, ed, keys, secs, payloads, false)
	out := make([]ClaimReply, len(keys))
	var undurable []ReleaseItem
	for j, a := range answers {
		if isConnError(a.err) {
			return nil, a.err
		}
		out[j], out[j].Err = a.reply, a.err
		if a.err != nil {
			continue
		}
		if nd := i.core.claimNotDurable(keys[j], a.reply, a.ack); nd != nil {
			out[j].Err = nd
			if a.reply.Status.Granted() { // a replay holds no claim to give back
				undurable = append(undurable, ReleaseItem{Key: keys[j], Token: a.reply.Token})
			}
		}
	}
	if len(undurable) > 0 {
		i.releaseBatch(ctx, ed, undurable, true)
	}
	return out, nil
}

// DoneMany completes each item's claim (retain 0: the server's idem.retain).
// Items without a Result store none. With Options.Durable a completion the
// replicas did not acknowledge has its Code and a *NotDurableError.
func (i *Idem) DoneMany(ctx context.Context, items []DoneItem, retain time.Duration) ([]DoneAnswer, error) {
	ed, err := i.Edition(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]DoneAnswer, len(items))
	for j, a := range i.doneBatch(ctx, ed, items, retain, false, false) {
		if isConnError(a.err) {
			return nil, a.err
		}
		out[j] = DoneAnswer{Code: a.code, Err: a.err}
		if a.err == nil && a.code.Completed() && !i.core.durableOK(a.ack) {
			out[j].Err = &NotDurableError{Key: items[j].Key, Stage: StageDone, Acknowledged: a.ack.replicas, Cause: a.ack.err}
		}
	}
	return out, nil
}

// ReleaseMany gives up each item's live claim.
func (i *Idem) ReleaseMany(ctx context.Context, items []ReleaseItem) ([]ReleaseAnswer, error) {
	ed, err := i.Edition(ctx)
	if err != nil {
		return nil, err
	}
	out := i.releaseBatch(ctx, ed, items, false)
	for _, a := range out {
		if isConnError(a.Err) {
			return nil, a.Err
		}
	}
	return out, nil
}
