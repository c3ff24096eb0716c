package idem

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// The batch helpers: on the module one IDEM.MCLAIM / MDONE / MRELEASE per
// hash slot (in a cluster) and per MaxBatch keys; on the Functions edition
// the single command per key, pipelined. The same answers either way: one
// per key, in order, a key's error in its element.

// ClaimMany claims keys for lease (payloads nil, or one per key).
func (i *Idem) ClaimMany(ctx context.Context, keys []string, lease time.Duration, payloads [][]byte) ([]ClaimReply, error) {
	if payloads != nil && len(payloads) != len(keys) {
		return nil, errors.New("idem: one payload per key")
	}
	ed, err := i.Edition(ctx)
	if err != nil {
		return nil, err
	}
	if ed == EditionFunctions {
		cmds := make([][]any, len(keys))
		for j, k := range keys {
			args := ClaimArgs{MaxTries: i.opts.MaxTries}
			if payloads != nil {
				args.Payload = payloads[j]
			}
			if cmds[j], _, err = i.claimCommand(ctx, k, lease, args); err != nil {
				return nil, err
			}
		}
		return pipelined(ctx, i, cmds, false, func(r piped) (c ClaimReply) {
			if c.Err = r.err; c.Err == nil {
				c, c.Err = parseClaim(r.value)
			}
			return c
		})
	}
	indices := make([]int, len(keys))
	for j := range indices {
		indices[j] = j
	}
	return inBatches(i.prefixed(keys), i.cluster, nil, indices, func(group []int) ([]ClaimReply, error) {
		args := MClaimArgs{MaxTries: i.opts.MaxTries, Bloom: i.opts.Bloom}
		sub := make([]string, len(group))
		for n, j := range group {
			sub[n] = keys[j]
			if payloads != nil {
				args.Payloads = append(args.Payloads, payloads[j])
			}
		}
		return i.MClaim(ctx, sub, lease, args)
	})
}

// inBatches sends items in the batches of their keys (batches) and puts
// each answer in its item's place.
func inBatches[I, A any](keys []string, cluster bool, class func(int) int, items []I, send func([]I) ([]A, error)) ([]A, error) {
	out := make([]A, len(items))
	for _, group := range batches(keys, cluster, class) {
		sub := make([]I, len(group))
		for n, j := range group {
			sub[n] = items[j]
		}
		answers, err := send(sub)
		if err != nil {
			return nil, err
		}
		for n, j := range group {
			out[j] = answers[n]
		}
	}
	return out, nil
}

// DoneMany completes each item's claim (retain 0: the server's idem.retain).
// Items without a Result store none.
func (i *Idem) DoneMany(ctx context.Context, items []DoneItem, retain time.Duration) ([]DoneAnswer, error) {
	return i.doneMany(ctx, items, retain, false)
}

func (i *Idem) doneMany(ctx context.Context, items []DoneItem, retain time.Duration, once bool) ([]DoneAnswer, error) {
	ed, err := i.Edition(ctx)
	if err != nil {
		return nil, err
	}
	if ed == EditionFunctions {
		cmds := make([][]any, len(items))
		for j, it := range items {
			cmds[j] = []any{"FCALL", "idem_done", 1, i.prefix + it.Key, it.Token}
			if it.Result != nil {
				cmds[j] = append(cmds[j], "RESULT", it.Result)
			}
			if retain != 0 {
				secs, err := seconds("retain", retain)
				if err != nil {
					return nil, err
				}
				cmds[j] = append(cmds[j], "RETAIN", secs)
			}
		}
		return pipelined(ctx, i, cmds, once, func(r piped) DoneAnswer {
			n, _ := r.value.(int64)
			return DoneAnswer{Code: DoneCode(n), Err: r.err}
		})
	}
	keys := make([]string, len(items))
	for j, it := range items {
		keys[j] = i.prefix + it.Key
	}
	withResult := func(j int) int {
		if items[j].Result != nil {
			return 1
		}
		return 0
	}
	return inBatches(keys, i.cluster, withResult, items, func(sub []DoneItem) ([]DoneAnswer, error) {
		return i.mdone(ctx, sub, MDoneArgs{Retain: retain, Bloom: i.opts.Bloom}, once)
	})
}

// ReleaseMany gives up each item's live claim.
func (i *Idem) ReleaseMany(ctx context.Context, items []ReleaseItem) ([]ReleaseAnswer, error) {
	ed, err := i.Edition(ctx)
	if err != nil {
		return nil, err
	}
	if ed == EditionFunctions {
		cmds := make([][]any, len(items))
		for j, it := range items {
			cmds[j] = []any{"FCALL", "idem_release", 1, i.prefix + it.Key, it.Token}
		}
		return pipelined(ctx, i, cmds, false, func(r piped) ReleaseAnswer {
			return ReleaseAnswer{Released: r.value == int64(1), Err: r.err}
		})
	}
	keys := make([]string, len(items))
	for j, it := range items {
		keys[j] = i.prefix + it.Key
	}
	return inBatches(keys, i.cluster, nil, items, func(sub []ReleaseItem) ([]ReleaseAnswer, error) {
		return i.MRelease(ctx, sub)
	})
}

func (i *Idem) prefixed(keys []string) []string {
	out := make([]string, len(keys))
	for j, k := range keys {
		out[j] = i.prefix + k
	}
	return out
}

// pipelined is pipeline with each reply made an answer.
func pipelined[A any](ctx context.Context, i *Idem, cmds [][]any, once bool, answer func(piped) A) ([]A, error) {
	replies, err := i.pipeline(ctx, cmds, once)
	if err != nil {
		return nil, err
	}
	out := make([]A, len(replies))
	for j, r := range replies {
		out[j] = answer(r)
	}
	return out, nil
}

type piped struct {
	value any
	err   error
}

// pipeline sends cmds in one pipeline (go-redis routes each by its key in
// a cluster): each command's reply or its own error. A connection error
// fails the whole call.
func (i *Idem) pipeline(ctx context.Context, cmds [][]any, once bool) ([]piped, error) {
	sent := make([]*redis.Cmd, len(cmds))
	_, _ = i.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for j, args := range cmds {
			sent[j] = redis.NewCmd(ctx, args...)
			if once {
				_ = p.Process(ctx, sentOnce{sent[j]})
			} else {
				_ = p.Process(ctx, sent[j])
			}
		}
		return nil
	})
	out := make([]piped, len(cmds))
	for j, c := range sent {
		v, err := c.Result()
		if isConnError(err) {
			return nil, err
		}
		out[j] = piped{value: v, err: serverError(err)}
	}
	return out, nil
}
