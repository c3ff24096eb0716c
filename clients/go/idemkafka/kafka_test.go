package idemkafka_test

// Against a real Kafka (brokers/launch.py) and Redis with the module: what
// brokers/scenario.py cannot tell apart. The scenario itself runs the
// consumer program of clients/go/tests/brokers.

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	idem "github.com/redis-idem/redis-idem/clients/go"
	"github.com/redis-idem/redis-idem/clients/go/idemkafka"
	"github.com/redis-idem/redis-idem/clients/go/internal/brokertest"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

func TestMain(m *testing.M) {
	code := m.Run()
	brokertest.Stop()
	os.Exit(code)
}

// fixture is a topic with records on chosen partitions, a group, and an
// Idem on a fresh Redis.
type fixture struct {
	t         *testing.T
	bootstrap string
	topic     string
	group     string
	idem      *idem.Idem
	rdb       *redis.Client
}

func newFixture(t *testing.T, opts idem.Options) *fixture {
	info := brokertest.Broker(t, "kafka")
	addr := brokertest.Redis(t, "module")
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { rdb.Close() })
	i, err := idem.New(rdb, opts)
	if err != nil {
		t.Fatal(err)
	}
	name := brokertest.Unique(strings.ReplaceAll(t.Name(), "/", "-"))
	return &fixture{t: t, bootstrap: brokertest.Field(info, "bootstrap"), topic: name, group: name + "-group", idem: i, rdb: rdb}
}

// another is an Idem of its own on the fixture's Redis.
func (f *fixture) another() *idem.Idem {
	i, err := idem.New(f.rdb, idem.Options{Lease: f.idem.Lease()})
	if err != nil {
		f.t.Fatal(err)
	}
	return i
}

// produce sends records (key "" for none) to partitions, in order.
func (f *fixture) produce(partition int32, keys ...string) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(f.bootstrap), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.AllowAutoTopicCreation())
	if err != nil {
		f.t.Fatal(err)
	}
	defer cl.Close()
	for _, k := range keys {
		r := &kgo.Record{Topic: f.topic, Partition: partition, Value: []byte(k)}
		if k != "" {
			r.Key = []byte(k)
		}
		if err := cl.ProduceSync(context.Background(), r).FirstErr(); err != nil {
			f.t.Fatal(err)
		}
	}
}

// consume runs a consumer of the fixture's group until stop is called.
func (f *fixture) consume(opts idemkafka.Options, work idemkafka.Handler[string]) (*idemkafka.Consumer[string], func()) {
	c := idemkafka.New(f.idem, work, opts)
	cl, err := kgo.NewClient(append(c.ClientOpts(), kgo.SeedBrokers(f.bootstrap), kgo.ConsumerGroup(f.group),
		kgo.ConsumeTopics(f.topic), kgo.AllowAutoTopicCreation(), kgo.SessionTimeout(6*time.Second))...)
	if err != nil {
		f.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, cl) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				f.t.Errorf("Run: %v", err)
			}
			cl.Close()
		})
	}
	f.t.Cleanup(stop)
	return c, stop
}

// committed is the group's committed offset of each partition (-1: none).
func (f *fixture) committed(partitions ...int32) []int64 {
	cl, err := kgo.NewClient(kgo.SeedBrokers(f.bootstrap))
	if err != nil {
		f.t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = f.group
	topic := kmsg.NewOffsetFetchRequestTopic()
	topic.Topic, topic.Partitions = f.topic, partitions
	req.Topics = append(req.Topics, topic)
	resp, err := req.RequestWith(context.Background(), cl)
	if err != nil {
		f.t.Fatal(err)
	}
	out := make([]int64, len(partitions))
	for n := range out {
		out[n] = -1
	}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if n := slices.Index(partitions, p.Partition); n >= 0 {
				out[n] = p.Offset
			}
		}
	}
	return out
}

// A record whose key another worker holds: its partition waits (the record
// sought back and paused for the holder's lease left, not spun on), the
// records after it wait behind it, the other partitions go on.
func TestBusyHoldsItsPartitionOnly(t *testing.T) {
	f := newFixture(t, idem.Options{Lease: 2 * time.Second, Wait: idem.Off})
	var did brokertest.Log
	c, _ := f.consume(idemkafka.Options{}, func(ctx context.Context, job *idem.Job, r *kgo.Record) (string, error) {
		did.Add(string(r.Key))
		return "", nil
	})
	// The topic made and the group joined first (seconds on a loaded
	// machine: the Python twin of this test once took 10 s), so that the
	// holder's lease below is measured against this consumer alone.
	f.produce(1, "warm")
	brokertest.WaitFor(t, "the warm-up record acknowledged", func() bool { return c.Stats().Acknowledged == 1 })
	if _, err := f.idem.Claim(context.Background(), "held", 8*time.Second, idem.ClaimArgs{}); err != nil {
		t.Fatal(err)
	}
	f.produce(0, "held", "after-held")
	f.produce(1, "free-1", "free-2")
	// A work's record is acknowledged (and counted) after the work returns.
	brokertest.WaitFor(t, "every record acknowledged", func() bool { return c.Stats().Acknowledged >= 5 })
	got := did.Snapshot()
	if slices.Index(got, "free-2") > slices.Index(got, "held") || slices.Index(got, "held") > slices.Index(got, "after-held") {
		t.Errorf("works ran in the order %v: want partition 1 before the held key, and partition 0 in order", got)
	}
	if s := c.Stats(); s.HeldBack == 0 || s.HeldBack > 3 || s.Busy != s.HeldBack || s.Acknowledged != 5 {
		t.Errorf("stats %+v: want the held record given back once or twice (its lease left, no spin), 5 acknowledged", s)
	}
	brokertest.WaitFor(t, "the commits", func() bool { return slices.Equal(f.committed(0, 1), []int64{2, 3}) })
}

// A dead-lettered record's offset is committed at once, not at the next
// CommitInterval: a member that died before then would have the
// partition's next owner dead-letter it again (the scenario saw a poison
// key twice in the dead-letter topic after its SIGKILL).
func TestDeadLetterCommittedAtOnce(t *testing.T) {
	f := newFixture(t, idem.Options{Lease: 2 * time.Second, MaxTries: 2})
	f.produce(2, "poison")
	c, _ := f.consume(idemkafka.Options{CommitInterval: time.Hour}, func(ctx context.Context, job *idem.Job, r *kgo.Record) (string, error) {
		return "", errors.New("cannot do it")
	})
	brokertest.WaitFor(t, "the dead letter", func() bool { return c.Stats().DeadLettered == 1 })
	brokertest.WaitFor(t, "its commit, with no periodic one", func() bool { return f.committed(2)[0] == 1 })
}

// A record's dead letter is sent once: a partition's next owner that reads
// the record again (the commit after the letter lost: here a second group
// from the topic's start) finds the letter's record done and sends none
// (the scenario saw a poison key twice in the dead-letter topic).
func TestDeadLetterSentOnce(t *testing.T) {
	f := newFixture(t, idem.Options{Lease: 2 * time.Second, MaxTries: 1})
	f.produce(0, "poison", "fine")
	work := func(ctx context.Context, job *idem.Job, r *kgo.Record) (string, error) {
		if string(r.Key) == "poison" {
			return "", errors.New("cannot do it")
		}
		return "ok", nil
	}
	first, stopFirst := f.consume(idemkafka.Options{}, work)
	brokertest.WaitFor(t, "the first group past both records", func() bool { return first.Stats().Acknowledged == 1 })
	stopFirst()
	again, err := idem.New(f.rdb, idem.Options{Lease: 2 * time.Second, MaxTries: 1})
	if err != nil {
		t.Fatal(err)
	}
	f.idem = again // the next owner's own counters
	f.group += "-again"
	second, stopSecond := f.consume(idemkafka.Options{}, func(ctx context.Context, job *idem.Job, r *kgo.Record) (string, error) {
		t.Errorf("record %q ran again", r.Key)
		return "", nil
	})
	brokertest.WaitFor(t, "the second group past both records", func() bool { return f.committed(0)[0] == 2 })
	stopSecond()
	if s := second.Stats(); s.DeadLettered != 1 || s.Acknowledged != 1 {
		t.Errorf("the second group: %+v, want the poison record dead-lettered (its letter found done) and one replay", s)
	}
	if r, err := f.idem.Get(context.Background(), "kafka-dead-letter:"+f.topic+":0:0"); err != nil || r == nil || r.State != idem.StateDone {
		t.Errorf("the letter's record: %+v %v, want done", r, err)
	}
	if letters := f.read(f.topic + "-dlt"); len(letters) != 1 {
		t.Errorf("%d dead letters, want 1", len(letters))
	}
}

// A record without a key and one that fails every try: both dead-lettered
// to <topic>-dlt, same partition, with Spring Kafka's headers; the
// partition goes on past them.
func TestDeadLetters(t *testing.T) {
	f := newFixture(t, idem.Options{Lease: 2 * time.Second, MaxTries: 2})
	f.produce(3, "", "poison", "fine")
	var did brokertest.Log
	c, _ := f.consume(idemkafka.Options{}, func(ctx context.Context, job *idem.Job, r *kgo.Record) (string, error) {
		did.Add(string(r.Key))
		if string(r.Key) == "poison" {
			return "", errors.New("cannot do it")
		}
		return "ok", nil
	})
	brokertest.WaitFor(t, "the partition past the dead letters", func() bool { return slices.Contains(did.Snapshot(), "fine") })
	brokertest.WaitFor(t, "the commit", func() bool { return f.committed(3)[0] == 3 })
	letters := f.read(f.topic + "-dlt")
	if len(letters) != 2 {
		t.Fatalf("%d dead letters, want 2", len(letters))
	}
	for n, want := range []struct {
		key    string
		offset uint64
		err    string
	}{{"", 0, "no key"}, {"poison", 1, "tries"}} {
		r := letters[n]
		h := map[string][]byte{}
		for _, kv := range r.Headers {
			h[kv.Key] = kv.Value
		}
		if string(r.Key) != want.key || r.Partition != 3 || string(h["kafka_dlt-original-topic"]) != f.topic ||
			binary.BigEndian.Uint32(h["kafka_dlt-original-partition"]) != 3 ||
			binary.BigEndian.Uint64(h["kafka_dlt-original-offset"]) != want.offset ||
			!strings.Contains(string(h["kafka_dlt-exception-message"]), want.err) ||
			string(h["kafka_dlt-original-consumer-group"]) != f.group {
			t.Errorf("dead letter %d: key %q partition %d headers %q", n, r.Key, r.Partition, h)
		}
	}
	if s := c.Stats(); s.DeadLettered != 2 || s.Acknowledged != 1 || s.Exhausted != 1 {
		t.Errorf("stats %+v", s)
	}
}

// read is every record of topic.
func (f *fixture) read(topic string) []*kgo.Record {
	cl, err := kgo.NewClient(kgo.SeedBrokers(f.bootstrap), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		f.t.Fatal(err)
	}
	defer cl.Close()
	var out []*kgo.Record
	for idle := 0; idle < 5; {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		fetches := cl.PollFetches(ctx)
		cancel()
		if fetches.NumRecords() == 0 {
			idle++
		}
		out = append(out, fetches.Records()...)
	}
	return out
}

// A partition revoked when a member joins: what its old owner did is
// committed before the partition goes (its periodic commit is off here),
// and the new owner starts there.
func TestRevokeCommitsWhatIsDone(t *testing.T) {
	f := newFixture(t, idem.Options{Lease: 2 * time.Second})
	keys := func(prefix string) []string {
		var out []string
		for n := range 20 {
			out = append(out, prefix+string(rune('a'+n)))
		}
		return out
	}
	for p := range int32(6) {
		f.produce(p, keys(string(rune('0'+p)))...)
	}
	var did brokertest.Log
	work := func(ctx context.Context, job *idem.Job, r *kgo.Record) (string, error) {
		did.Add(string(r.Key))
		return "", nil
	}
	first, _ := f.consume(idemkafka.Options{CommitInterval: time.Hour}, work)
	brokertest.WaitFor(t, "the first member's works", func() bool { return len(did.Snapshot()) == 120 })
	if got := f.committed(0, 1, 2, 3, 4, 5); !slices.Equal(got, []int64{-1, -1, -1, -1, -1, -1}) {
		t.Fatalf("committed %v before any revoke, want nothing (the periodic commit is off)", got)
	}
	f.idem = f.another() // the second member's own counters
	second, stopSecond := f.consume(idemkafka.Options{CommitInterval: time.Hour}, work)
	// The cooperative rebalance revokes some partitions of the first
	// member: each is committed at 20 before it goes, so the second one
	// replays nothing.
	brokertest.WaitFor(t, "a revoke's commits", func() bool {
		n := 0
		for _, o := range f.committed(0, 1, 2, 3, 4, 5) {
			if o == 20 {
				n++
			}
		}
		return n >= 2
	})
	stopSecond()
	if s := second.Stats(); s.Replays != 0 || s.FirstRuns != 0 {
		t.Errorf("the second member ran or replayed records: %+v", s)
	}
	if s := first.Stats(); s.FirstRuns != 120 || s.Acknowledged != 120 || len(did.Snapshot()) != 120 {
		t.Errorf("the first member: %+v", s)
	}
}
