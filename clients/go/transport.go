package idem

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// How commands reach the server: one at a time, or several in one
// pipeline; with Durable, a WAIT (or WAITAOF) after them on the same
// connection, so that it waits for exactly their writes. In a cluster that
// connection is the node's that ran them.

// sentOnce keeps go-redis from sending a command again after a connection
// error: a DONE whose reply was lost is resent by the loop itself, which
// must know it was resent (an answer 0 then may be its own completion),
// and a RELEASE is sent once.
type sentOnce struct{ *redis.Cmd }

func (sentOnce) NoRetry() bool { return true }

// settling is the context of a DONE (or RELEASE, or the GET checking a
// DONE): the caller's cancellation does not reach it, and DoneTimeout
// bounds it where the client applies deadlines (else its ReadTimeout
// does, and no timer is made).
func (i *Idem) settling(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx = context.WithoutCancel(ctx)
	if !i.core.ctxDeadlines {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, i.core.doneTimeout)
}

// do sends one command: its reply, a server error named.
func (i *Idem) do(ctx context.Context, args []any, once bool) (any, error) {
	cmd := redis.NewCmd(ctx, args...)
	if once {
		_ = i.client.Process(ctx, sentOnce{cmd})
	} else {
		_ = i.client.Process(ctx, cmd)
	}
	v, err := cmd.Result()
	return v, serverError(err)
}

// pipeliner is what sends a pipeline: the client, or one cluster node.
type pipeliner interface {
	Pipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error)
}

// piped is one command's answer in a round trip, with the WAIT's answer
// after it when durable.
type piped struct {
	value any
	err   error
	ack   acked
}

// exchange sends one command (key: the record it is about) with, when
// durable, its WAIT.
func (i *Idem) exchange(ctx context.Context, args []any, key string, once, durable bool) piped {
	if !durable || i.core.durable == nil {
		v, err := i.do(ctx, args, once)
		return piped{value: v, err: err}
	}
	return i.roundTrip(ctx, [][]any{args}, []string{key}, once, true)[0]
}

// roundTrip sends cmds in one pipeline (go-redis routes each by its key in
// a cluster; keys are the records they are about) and, when durable, one
// WAIT per connection after its commands.
func (i *Idem) roundTrip(ctx context.Context, cmds [][]any, keys []string, once, durable bool) []piped {
	out := make([]piped, len(cmds))
	durable = durable && i.core.durable != nil
	if !durable && len(cmds) == 1 {
		out[0].value, out[0].err = i.do(ctx, cmds[0], once)
		return out
	}
	if !durable || !i.core.cluster {
		i.pipe(ctx, i.client, cmds, once, durable, out, nil)
		return out
	}
	// A cluster: each node's commands, then its WAIT, on its connection.
	cc := i.client.(*redis.ClusterClient)
	groups := map[*redis.Client][]int{}
	var order []*redis.Client
	for j, key := range keys {
		node, err := cc.MasterForKey(ctx, i.core.prefix+key)
		if err != nil {
			out[j].err = err
			continue
		}
		if _, seen := groups[node]; !seen {
			order = append(order, node)
		}
		groups[node] = append(groups[node], j)
	}
	for _, node := range order {
		idx := groups[node]
		sub := make([][]any, len(idx))
		for n, j := range idx {
			sub[n] = cmds[j]
		}
		i.pipe(ctx, node, sub, once, true, out, idx)
	}
	return out
}

// pipe sends cmds (and a WAIT when durable) in one pipeline on p, putting
// each answer at out[at[n]] (at nil: out[n]).
func (i *Idem) pipe(ctx context.Context, p pipeliner, cmds [][]any, once, durable bool, out []piped, at []int) {
	sent := make([]*redis.Cmd, len(cmds), len(cmds)+1)
	for n, args := range cmds {
		sent[n] = redis.NewCmd(ctx, args...)
	}
	if durable {
		sent = append(sent, redis.NewCmd(ctx, i.core.waitCmd()...))
	}
	_, _ = p.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for _, c := range sent {
			if once {
				_ = pipe.Process(ctx, sentOnce{c})
			} else {
				_ = pipe.Process(ctx, c)
			}
		}
		return nil
	})
	var ack acked
	if durable {
		ack = parseAck(sent[len(cmds)].Result())
	}
	for n := range cmds {
		j := n
		if at != nil {
			j = at[n]
		}
		v, err := sent[n].Result()
		out[j] = piped{value: v, err: serverError(err), ack: ack}
	}
}

// waitCmd is the durability check after a write.
func (c *core) waitCmd() []any {
	d := c.durable
	ms := int64(d.Timeout / time.Millisecond)
	if d.Fsync {
		return []any{"WAITAOF", 1, d.Replicas, ms}
	}
	return []any{"WAIT", d.Replicas, ms}
}

var errNotFsynced = errors.New("idem: WAITAOF: the primary's AOF was not fsynced")

// parseAck reads WAIT's count, or WAITAOF's [local, replicas].
func parseAck(v any, err error) acked {
	if err != nil {
		return acked{err: serverError(err)}
	}
	switch v := v.(type) {
	case int64:
		return acked{replicas: v}
	case []any:
		if len(v) == 2 {
			local, _ := v[0].(int64)
			replicas, _ := v[1].(int64)
			if local < 1 {
				return acked{replicas: replicas, err: errNotFsynced}
			}
			return acked{replicas: replicas}
		}
	}
	return acked{err: errors.New("idem: unexpected WAIT reply")}
}
