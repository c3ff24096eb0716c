package idemkafka

import (
	"context"
	"errors"
	"fmt"
	"time"

	idem "github.com/redis-idem/redis-idem/clients/go"
	"github.com/redis-idem/redis-idem/clients/go/internal/broker"
	"github.com/twmb/franz-go/pkg/kgo"
)

// partition is one assigned partition: its goroutine takes its records in
// offset order, one at a time, so that a record never runs before an
// earlier one of its partition is done or dead-lettered. Its fields but
// the channels are under the consumer's mu.
type partition struct {
	tp        topicPartition
	queue     []*kgo.Record
	seek      *kgo.EpochOffset // a seek back the poll loop owes (a record held back)
	holdUntil time.Time        // paused until then
	paused    bool             // paused by the poll loop
	done      *kgo.EpochOffset // the offset to commit: every record before it is done
	committed kgo.EpochOffset
	stopping  bool  // finish the record in hand, then end
	working   bool  // the record in hand's work runs
	heldAt    int64 // the offset held back last, and how often in a row
	holds     int

	wakeup chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
	ended  chan struct{}
}

func (p *partition) signal() {
	select {
	case p.wakeup <- struct{}{}:
	default:
	}
}

var errStopping = errors.New("idemkafka: the partition is stopping")

// assigned starts a goroutine for each new partition.
func (c *Consumer[T]) assigned(_ context.Context, cl *kgo.Client, assigned map[string][]int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.use(cl)
	for topic, parts := range assigned {
		for _, n := range parts {
			tp := topicPartition{topic, n}
			if c.parts[tp] != nil {
				continue
			}
			p := &partition{tp: tp, wakeup: make(chan struct{}, 1), ended: make(chan struct{}), heldAt: -1}
			p.ctx, p.cancel = context.WithCancel(context.Background())
			c.parts[tp] = p
			go c.work(p)
		}
	}
}

// revoked lets each revoked partition finish the record in hand (a claim
// still waiting is given up), then commits what is done: before the
// partition goes.
func (c *Consumer[T]) revoked(_ context.Context, cl *kgo.Client, revoked map[string][]int32) {
	gone := c.detach(cl, revoked)
	c.stop(gone, false)
	c.commit(cl, gone)
}

// lost stops the lost partitions at once, committing nothing: they are
// another member's already.
func (c *Consumer[T]) lost(_ context.Context, cl *kgo.Client, lost map[string][]int32) {
	c.stop(c.detach(cl, lost), true)
}

// detach takes partitions out of the loop's hands (resuming the paused
// ones, for a later assignment).
func (c *Consumer[T]) detach(cl *kgo.Client, parts map[string][]int32) map[topicPartition]*partition {
	c.mu.Lock()
	defer c.mu.Unlock()
	gone := map[topicPartition]*partition{}
	resume := map[string][]int32{}
	for topic, ns := range parts {
		for _, n := range ns {
			tp := topicPartition{topic, n}
			if p := c.parts[tp]; p != nil {
				gone[tp] = p
				delete(c.parts, tp)
				if p.paused {
					resume[topic] = append(resume[topic], n)
				}
			}
		}
	}
	if len(resume) > 0 {
		cl.ResumeFetchPartitions(resume)
	}
	return gone
}

// stopAll ends every partition gracefully and commits what is done (Run's
// end; the revoke at the client's Close finds them ended).
func (c *Consumer[T]) stopAll() {
	c.mu.Lock()
	all := make(map[topicPartition]*partition, len(c.parts))
	for tp, p := range c.parts {
		all[tp] = p
	}
	cl := c.cl
	c.mu.Unlock()
	c.stop(all, false)
	if cl != nil {
		c.commit(cl, all)
	}
}

// stop ends partitions' goroutines and waits for them: hard cancels the
// work in hand too; else only a claim still waiting.
func (c *Consumer[T]) stop(parts map[topicPartition]*partition, hard bool) {
	c.mu.Lock()
	for _, p := range parts {
		p.stopping = true
		if hard || !p.working {
			p.cancel()
		}
		p.signal()
	}
	c.mu.Unlock()
	for _, p := range parts {
		<-p.ended
		p.cancel()
	}
}

// work is a partition's goroutine.
func (c *Consumer[T]) work(p *partition) {
	defer close(p.ended)
	for {
		r := c.take(p)
		if r == nil || !c.acquire(p) {
			return
		}
		c.settle(p, r, c.one(p, r))
		c.release()
	}
}

// acquire waits for a slot of MaxInFlight (false: the partition stops).
func (c *Consumer[T]) acquire(p *partition) bool {
	if c.slots == nil {
		return true
	}
	select {
	case c.slots <- struct{}{}:
		return true
	case <-p.ctx.Done():
		return false
	}
}

func (c *Consumer[T]) release() {
	if c.slots != nil {
		<-c.slots
	}
}

// take waits for the partition's next record (nil: stop).
func (c *Consumer[T]) take(p *partition) *kgo.Record {
	for {
		c.mu.Lock()
		if p.stopping {
			c.mu.Unlock()
			return nil
		}
		if len(p.queue) > 0 {
			r := p.queue[0]
			p.queue[0], p.queue = nil, p.queue[1:]
			if p.paused && p.seek == nil && !time.Now().Before(p.holdUntil) && len(p.queue) < c.opts.MaxBuffered/2 {
				c.poke() // room again: resume its fetching
			}
			c.mu.Unlock()
			return r
		}
		c.mu.Unlock()
		select {
		case <-p.wakeup:
		case <-p.ctx.Done():
			return nil
		}
	}
}

// one runs a record through the Idem.
func (c *Consumer[T]) one(p *partition, r *kgo.Record) broker.Decision {
	key, err := c.opts.Key(r)
	var failed error // the work's own: the handler's, or errStopping
	if err == nil {
		var opts []idem.CallOption
		if c.opts.Payload != nil {
			opts = append(opts, idem.WithPayload(c.opts.Payload(r)))
		}
		_, err = idem.Process(p.ctx, c.idem, key, func(ctx context.Context, job *idem.Job) (T, error) {
			c.mu.Lock()
			stopping := p.stopping
			p.working = !stopping
			c.mu.Unlock()
			if stopping {
				var zero T
				failed = errStopping
				return zero, errStopping
			}
			defer func() {
				c.mu.Lock()
				p.working = false
				c.mu.Unlock()
			}()
			v, err := c.handle(ctx, job, r)
			failed = err
			return v, err
		}, opts...)
	}
	retry := c.opts.RetryDelay
	if r.Offset == p.heldAt {
		retry = broker.Backoff(retry, p.holds)
	}
	return broker.Decide(err, failed, retry, p.ctx.Err() != nil)
}

// settle does what the decision says: the record done (its offset
// committable), dead-lettered then done, or held back.
func (c *Consumer[T]) settle(p *partition, r *kgo.Record, d broker.Decision) {
	if d.Report {
		c.report(fmt.Errorf("idemkafka: record %s/%d@%d held back: %w", r.Topic, r.Partition, r.Offset, d.Err))
	}
	if d.Verdict == broker.DeadLetter {
		if err := c.deadLetter(p, r, d.Err); err != nil {
			c.report(err)
			d = broker.Decision{Verdict: broker.HoldBack, Delay: c.opts.RetryDelay, Err: err}
		}
	}
	c.mu.Lock()
	c.mark(p, r, d)
	cl := c.cl
	c.mu.Unlock()
	if d.Verdict == broker.DeadLetter && cl != nil {
		// Committed at once, as Spring's commitRecovered does: a member
		// that dies before its next commit would have the partition's
		// next owner dead-letter the record a second time (a replay
		// answers any other record).
		c.commit(cl, map[topicPartition]*partition{p.tp: p})
	}
}

// mark records the decision in the partition's state (under mu).
func (c *Consumer[T]) mark(p *partition, r *kgo.Record, d broker.Decision) {
	if d.Verdict == broker.HoldBack && p.stopping {
		return // the partition goes: its next owner takes the record
	}
	c.counters.Count(d.Verdict)
	switch d.Verdict {
	case broker.Ack, broker.DeadLetter:
		p.done = &kgo.EpochOffset{Epoch: r.LeaderEpoch, Offset: r.Offset + 1}
		p.heldAt, p.holds = -1, 0
	case broker.HoldBack:
		if r.Offset != p.heldAt {
			p.heldAt, p.holds = r.Offset, 0
		}
		p.holds++
		// Back to this record, after the delay; the records after it
		// are fetched again then.
		p.seek = &kgo.EpochOffset{Epoch: r.LeaderEpoch, Offset: r.Offset}
		p.holdUntil = time.Now().Add(d.Delay)
		p.queue = nil
		c.poke()
	}
}
