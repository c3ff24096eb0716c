// Package idemkafka runs a Kafka consumer group's records through an
// idem.Idem, with franz-go: the poll loop users write, one goroutine per
// partition, each record's offset committed only once its record is done
// (docs/clients.md, "Consumers of brokers").
//
//	c := idemkafka.New(consumer, handle, idemkafka.Options{})
//	cl, err := kgo.NewClient(append(c.ClientOpts(),
//		kgo.SeedBrokers("127.0.0.1:9092"), kgo.ConsumerGroup("billing"), kgo.ConsumeTopics("orders"))...)
//	err = c.Run(ctx, cl) // until ctx ends; then cl.Close()
package idemkafka

import (
	"context"
	"errors"
	"sync"
	"time"

	idem "github.com/redis-idem/redis-idem/clients/go"
	"github.com/redis-idem/redis-idem/clients/go/internal/broker"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Handler is the work for one record: its value is the record's result
// (replayed to a duplicate's Process, not used by the consumer).
type Handler[T any] func(ctx context.Context, job *idem.Job, r *kgo.Record) (T, error)

// Options configure a Consumer; the zero value of each is its default.
type Options struct {
	// Key is the record's key in the Idem: default the record's key (a
	// producer's retry keeps it, unlike the offset). A record without one
	// is dead-lettered with idem.ErrMissingKey.
	Key func(r *kgo.Record) (string, error)
	// Payload, when set, claims with it (idem.WithPayload): a key seen
	// again with another payload is dead-lettered (idem.ErrMismatch).
	Payload func(r *kgo.Record) []byte
	// RetryDelay is how long a partition first waits before a record whose
	// work failed (or whose DONE was not confirmed) comes again: default
	// 100 ms, doubling at each failure of the same record, at most 30 s.
	// A Busy record waits for its holder's lease left.
	RetryDelay time.Duration
	// CommitInterval between commits of what is done: default 1 s (a
	// dead letter's partition is committed at once).
	CommitInterval time.Duration
	// DeadLetterTopic names a topic's dead-letter topic: default
	// topic + "-dlt" (Spring Kafka's). The dead letter goes to the
	// record's own partition (ClientOpts sets the manual partitioner).
	DeadLetterTopic func(topic string) string
	// MaxBuffered records of a partition wait for their turn before its
	// fetching pauses: default 500.
	MaxBuffered int
	// MaxInFlight records are at work at once, across the partitions:
	// default 0, one per partition.
	MaxInFlight int
	// OnError is told what the consumer could not do and will try again
	// (a commit, a dead letter), and why a record was held back when
	// neither the handler nor Busy, a lost lease, an unconfirmed DONE or
	// NotDurable was the cause: a claim or DONE the server refused
	// (NOPERM, WRONGTYPE), a lost connection, an OnRun hook that failed.
	// Default: nothing.
	OnError func(err error)
}

// Stats are the Idem's counters and the consumer's: records
// acknowledged (their offsets committable), held back, dead-lettered.
type Stats = broker.Stats

// Consumer is the poll loop of one kgo.Client in a consumer group. Make
// it first, build the client with its ClientOpts, then Run.
type Consumer[T any] struct {
	idem       *idem.Idem
	letters    *idem.Idem // the dead letters' sends: no MaxTries nor Bloom, JSON, no hooks
	lettersErr error
	handle     Handler[T]
	opts       Options
	counters   broker.Counters
	slots      chan struct{} // MaxInFlight's, nil without

	cl       *kgo.Client
	group    string
	mu       sync.Mutex // parts, each partition's queue and state, wake
	parts    map[topicPartition]*partition
	wake     context.CancelFunc // ends the poll in progress
	commitMu sync.Mutex         // one commit at a time: a revoke's is the last of its partitions
}

type topicPartition struct {
	topic     string
	partition int32
}

// New makes a Consumer that runs handle for each record through i.
func New[T any](i *idem.Idem, handle Handler[T], opts Options) *Consumer[T] {
	if opts.Key == nil {
		opts.Key = recordKey
	}
	if opts.RetryDelay <= 0 {
		opts.RetryDelay = broker.DefaultRetryDelay
	}
	if opts.CommitInterval <= 0 {
		opts.CommitInterval = time.Second
	}
	if opts.DeadLetterTopic == nil {
		opts.DeadLetterTopic = func(topic string) string { return topic + "-dlt" }
	}
	if opts.MaxBuffered <= 0 {
		opts.MaxBuffered = 500
	}
	c := &Consumer[T]{idem: i, handle: handle, opts: opts, parts: map[topicPartition]*partition{}}
	o := i.Options()
	o.MaxTries, o.Bloom, o.Codec, o.Hooks = 0, "", idem.JSONCodec{}, idem.Hooks{}
	c.letters, c.lettersErr = idem.New(i.Client(), o)
	if opts.MaxInFlight > 0 {
		c.slots = make(chan struct{}, opts.MaxInFlight)
	}
	return c
}

func recordKey(r *kgo.Record) (string, error) {
	if len(r.Key) == 0 {
		return "", broker.MissingKey("the record has no key")
	}
	return string(r.Key), nil
}

// ClientOpts are the client options the consumer needs: manual commits
// (its own, per partition, of what is done), rebalances held while a poll
// is dispatched, its callbacks for assigned, revoked and lost partitions,
// the manual partitioner for the dead letters (a client that also
// produces sets Record.Partition itself), and fetches that wait 100 ms at
// most for new records (a partition resumed after a hold is fetched only
// once the fetch in flight returns; a later kgo.FetchMaxWait overrides).
func (c *Consumer[T]) ClientOpts() []kgo.Opt {
	return []kgo.Opt{
		kgo.FetchMaxWait(100 * time.Millisecond),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsAssigned(c.assigned),
		kgo.OnPartitionsRevoked(c.revoked),
		kgo.OnPartitionsLost(c.lost),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
	}
}

// Stats is a snapshot of the counters.
func (c *Consumer[T]) Stats() Stats { return c.counters.Stats(c.idem) }

// Run polls cl (made with ClientOpts) until ctx ends, then lets each
// partition finish the record in hand, commits what is done and returns
// nil; close cl after it (leaving the group). Its error is the client's
// (closed, or a fatal fetch error).
func (c *Consumer[T]) Run(ctx context.Context, cl *kgo.Client) error {
	c.mu.Lock()
	c.use(cl)
	c.mu.Unlock()
	defer c.stopAll()
	lastCommit := time.Now()
	for {
		next := c.reconcile(cl)
		if ctx.Err() != nil {
			cl.AllowRebalance()
			return nil
		}
		if time.Since(lastCommit) >= c.opts.CommitInterval {
			c.commit(cl, nil)
			lastCommit = time.Now()
		}
		cl.AllowRebalance()
		deadline := lastCommit.Add(c.opts.CommitInterval)
		if !next.IsZero() && next.Before(deadline) {
			deadline = next
		}
		pollCtx, cancel := context.WithDeadline(ctx, deadline)
		c.mu.Lock()
		c.wake = cancel
		c.mu.Unlock()
		fetches := cl.PollRecords(pollCtx, 0)
		cancel()
		if fetches.IsClientClosed() {
			return kgo.ErrClientClosed
		}
		for _, fe := range fetches.Errors() {
			if errors.Is(fe.Err, context.Canceled) || errors.Is(fe.Err, context.DeadlineExceeded) {
				continue
			}
			c.report(fe.Err)
		}
		c.dispatch(fetches)
	}
}

// use is the client the consumer polls, under mu (Run and the first
// callback, whichever comes first).
func (c *Consumer[T]) use(cl *kgo.Client) {
	c.cl = cl
	c.group, _ = cl.OptValue(kgo.ConsumerGroup).(string)
}

// dispatch queues each partition's records for its goroutine; records of
// a partition waiting for its seek back are dropped (fetched again).
func (c *Consumer[T]) dispatch(fetches kgo.Fetches) {
	c.mu.Lock()
	defer c.mu.Unlock()
	fetches.EachPartition(func(fp kgo.FetchTopicPartition) {
		p := c.parts[topicPartition{fp.Topic, fp.Partition}]
		if p == nil || p.seek != nil || len(fp.Records) == 0 {
			return
		}
		p.queue = append(p.queue, fp.Records...)
		p.signal()
	})
}

// reconcile, on the poll loop's goroutine between polls: seeks the
// partitions held back to their record, and pauses each partition that is
// held back or has MaxBuffered records waiting (resumes the others). It
// answers when the next hold ends.
func (c *Consumer[T]) reconcile(cl *kgo.Client) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	var next time.Time
	pause, resume := map[string][]int32{}, map[string][]int32{}
	seeks := map[string]map[int32]kgo.EpochOffset{}
	for tp, p := range c.parts {
		if p.seek != nil {
			if seeks[tp.topic] == nil {
				seeks[tp.topic] = map[int32]kgo.EpochOffset{}
			}
			seeks[tp.topic][tp.partition] = *p.seek
		}
		held := p.seek != nil || now.Before(p.holdUntil)
		if now.Before(p.holdUntil) && (next.IsZero() || p.holdUntil.Before(next)) {
			next = p.holdUntil
		}
		want := held || len(p.queue) >= c.opts.MaxBuffered
		switch {
		case want && !p.paused:
			pause[tp.topic] = append(pause[tp.topic], tp.partition)
		case !want && p.paused:
			resume[tp.topic] = append(resume[tp.topic], tp.partition)
		default:
			continue
		}
		p.paused = want
	}
	if len(pause) > 0 {
		cl.PauseFetchPartitions(pause)
	}
	if len(seeks) > 0 {
		cl.SetOffsets(seeks)
		for tp, p := range c.parts {
			if seeks[tp.topic] != nil {
				if _, ok := seeks[tp.topic][tp.partition]; ok {
					p.seek, p.queue = nil, nil
				}
			}
		}
	}
	if len(resume) > 0 {
		cl.ResumeFetchPartitions(resume)
	}
	return next
}

// poke ends the poll in progress, so that the loop reconciles now.
func (c *Consumer[T]) poke() {
	if c.wake != nil {
		c.wake()
	}
}

// commit commits what is done in each partition (only), synchronously,
// one commit at a time; those of ended partitions are the last.
func (c *Consumer[T]) commit(cl *kgo.Client, only map[topicPartition]*partition) {
	c.commitMu.Lock()
	defer c.commitMu.Unlock()
	c.mu.Lock()
	if only == nil {
		only = c.parts
	}
	offsets := map[string]map[int32]kgo.EpochOffset{}
	var dirty []*partition
	for tp, p := range only {
		if p.done == nil || p.committed == *p.done {
			continue
		}
		if offsets[tp.topic] == nil {
			offsets[tp.topic] = map[int32]kgo.EpochOffset{}
		}
		offsets[tp.topic][tp.partition] = *p.done
		dirty = append(dirty, p)
	}
	c.mu.Unlock()
	if len(offsets) == 0 {
		return
	}
	var failed error
	cl.CommitOffsetsSync(context.Background(), offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		failed = err
		for _, t := range resp.Topics {
			for _, part := range t.Partitions {
				if e := kerr.ErrorForCode(part.ErrorCode); e != nil && failed == nil {
					failed = e
				}
			}
		}
	})
	if failed != nil {
		c.report(failed)
		return
	}
	c.mu.Lock()
	for _, p := range dirty {
		p.committed = offsets[p.tp.topic][p.tp.partition]
	}
	c.mu.Unlock()
}

func (c *Consumer[T]) report(err error) {
	if c.opts.OnError != nil && err != nil {
		c.opts.OnError(err)
	}
}
