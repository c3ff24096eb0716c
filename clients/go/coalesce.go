package idem

import (
	"context"
	"sync"
)

// coalescer makes concurrent calls share one round of commands: a call
// alone sends its item at once (no added latency); while a round is in
// flight the items that arrive queue, and when it returns they go as the
// next round, sent by the first of them. Each caller gets its own answer.
// No goroutine and no timer: the callers themselves take turns.
type coalescer[I, A any] struct {
	round func(ctx context.Context, items []I) []A
	mu    sync.Mutex
	busy  bool
	queue []*waiting[I, A]
}

type waiting[I, A any] struct {
	item   I
	answer A
	lead   []*waiting[I, A] // set when this caller sends the next round
	ready  chan struct{}
}

// do sends item in the next round and gives its answer.
func (c *coalescer[I, A]) do(ctx context.Context, item I) A {
	c.mu.Lock()
	if !c.busy {
		c.busy = true
		c.mu.Unlock()
		answer := c.round(ctx, []I{item})[0]
		c.handOff()
		return answer
	}
	w := &waiting[I, A]{item: item, ready: make(chan struct{})}
	c.queue = append(c.queue, w)
	c.mu.Unlock()
	<-w.ready
	if w.lead == nil {
		return w.answer
	}
	items := make([]I, len(w.lead))
	for n, q := range w.lead {
		items[n] = q.item
	}
	answers := c.round(ctx, items)
	for n, q := range w.lead[1:] {
		q.answer = answers[n+1]
		close(q.ready)
	}
	c.handOff()
	return answers[0]
}

// handOff gives the queue to its first caller as the next round, or ends
// the turns.
func (c *coalescer[I, A]) handOff() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.queue) == 0 {
		c.busy = false
		return
	}
	next := c.queue
	c.queue = nil
	next[0].lead = next
	close(next[0].ready)
}

// claimItem is a coalesced call's first claim.
type claimItem struct {
	key     string
	payload []byte
}

// claimRound sends a round of claims: the single command for one, else as
// ClaimMany does (MCLAIM per slot, pipelined singles on the Functions
// edition), with one WAIT per connection when durable.
func (i *Idem) claimRound(ctx context.Context, items []claimItem) []claimAnswer {
	if len(items) == 1 {
		return []claimAnswer{i.claimOne(ctx, i.core.edition(), items[0].key, items[0].payload, 0)}
	}
	ctx = context.WithoutCancel(ctx) // the others' claims too
	keys := make([]string, len(items))
	var payloads [][]byte
	for n, it := range items {
		keys[n] = it.key
		if it.payload != nil {
			if payloads == nil {
				payloads = make([][]byte, len(items))
			}
			payloads[n] = it.payload
		}
	}
	return i.claimBatch(ctx, i.core.edition(), keys, i.core.leaseSecs, payloads, true)
}

// doneRound sends a round of DONEs, each once (the loop resends), within
// DoneTimeout.
func (i *Idem) doneRound(ctx context.Context, items []DoneItem) []doneAnswer {
	ctx, cancel := i.settling(ctx)
	defer cancel()
	if len(items) == 1 {
		return []doneAnswer{i.doneOne(ctx, i.core.edition(), items[0])}
	}
	return i.doneBatch(ctx, i.core.edition(), items, i.core.retain, true, true)
}
