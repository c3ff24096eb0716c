package idemnats_test

// Against a real NATS server with JetStream (brokers/launch.py) and Redis
// with the module: what brokers/scenario.py cannot tell apart. The
// scenario itself runs the consumer program of clients/go/tests/brokers.

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	idem "github.com/redis-idem/redis-idem/clients/go"
	"github.com/redis-idem/redis-idem/clients/go/idemnats"
	"github.com/redis-idem/redis-idem/clients/go/internal/brokertest"
	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) {
	code := m.Run()
	brokertest.Stop()
	os.Exit(code)
}

// fixture is a stream (subjects <stream>.>), a durable consumer of
// <stream>.in with ackWait, and an Idem on a fresh Redis.
type fixture struct {
	t      *testing.T
	js     jetstream.JetStream
	stream string
	cons   jetstream.Consumer
	idem   *idem.Idem
}

func newFixture(t *testing.T, opts idem.Options, ackWait time.Duration) *fixture {
	info := brokertest.Broker(t, "nats")
	rdb := redis.NewClient(&redis.Options{Addr: brokertest.Redis(t, "module")})
	t.Cleanup(func() { rdb.Close() })
	i, err := idem.New(rdb, opts)
	brokertest.Must(t, err)
	nc, err := nats.Connect(brokertest.Field(info, "url"))
	brokertest.Must(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	brokertest.Must(t, err)
	name := strings.NewReplacer("/", "_", ".", "_").Replace(brokertest.Unique(t.Name()))
	ctx := context.Background()
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}})
	brokertest.Must(t, err)
	cons, err := js.CreateOrUpdateConsumer(ctx, name, jetstream.ConsumerConfig{Durable: "g",
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait, FilterSubject: name + ".in"})
	brokertest.Must(t, err)
	return &fixture{t: t, js: js, stream: name, cons: cons, idem: i}
}

func (f *fixture) publish(key string) {
	msg := &nats.Msg{Subject: f.stream + ".in", Data: []byte(key), Header: nats.Header{}}
	if key != "" {
		msg.Header.Set(idemnats.KeyHeader, key)
	}
	_, err := f.js.PublishMsg(context.Background(), msg)
	brokertest.Must(f.t, err)
}

func (f *fixture) info() *jetstream.ConsumerInfo {
	info, err := f.cons.Info(context.Background())
	brokertest.Must(f.t, err)
	return info
}

// A work three times as long as the consumer's AckWait: each heartbeat
// sends InProgress, so the server never redelivers it (two Consume, one
// of which would get the redelivery).
func TestInProgressFollowsTheLease(t *testing.T) {
	f := newFixture(t, idem.Options{Lease: time.Second}, time.Second)
	var works atomic.Int64
	c := idemnats.New(f.idem, f.js, func(ctx context.Context, job *idem.Job, msg jetstream.Msg) (string, error) {
		works.Add(1)
		time.Sleep(3 * time.Second)
		return "", nil
	}, idemnats.Options{})
	for range 2 {
		cc, err := f.cons.Consume(c.MessageHandler(context.Background()))
		brokertest.Must(t, err)
		t.Cleanup(func() { cc.Stop(); <-cc.Closed() })
	}
	f.publish("long")
	brokertest.WaitFor(t, "the ack", func() bool { return c.Stats().Acknowledged == 1 })
	if info, s := f.info(), c.Stats(); info.NumRedelivered != 0 || works.Load() != 1 || s.Busy != 0 || s.Extends < 4 {
		t.Errorf("redelivered %d, works %d, stats %+v: want one delivery kept in progress by the heartbeat",
			info.NumRedelivered, works.Load(), s)
	}
}

// dropTerm is a message whose Term is lost on its way.
type dropTerm struct{ jetstream.Msg }

func (dropTerm) TermWithReason(string) error { return nil }

// A message without a key and one that fails every try: Term, and a copy
// to <stream>.dlq with its key, where it came from and the error; a
// dead letter sent again (its Term lost, the message redelivered) is
// dropped as a duplicate by the stream.
func TestDeadLettersOnce(t *testing.T) {
	f := newFixture(t, idem.Options{Lease: time.Second, MaxTries: 1}, time.Second)
	f.publish("")
	f.publish("poison")
	c := idemnats.New(f.idem, f.js, func(ctx context.Context, job *idem.Job, msg jetstream.Msg) (string, error) {
		return "", errors.New("cannot do it")
	}, idemnats.Options{})
	handle := func(n int, lose bool) {
		batch, err := f.cons.Fetch(n, jetstream.FetchMaxWait(5*time.Second))
		brokertest.Must(t, err)
		for msg := range batch.Messages() {
			if lose {
				c.Handle(context.Background(), dropTerm{msg})
			} else {
				c.Handle(context.Background(), msg)
			}
		}
	}
	handle(2, false) // the keyless one dead-lettered; poison fails its one try
	handle(1, true)  // poison exhausted; its Term lost
	handle(1, false) // poison again after AckWait: its dead letter a duplicate
	brokertest.WaitFor(t, "nothing pending", func() bool { info := f.info(); return info.NumPending+uint64(info.NumAckPending) == 0 })
	sub, err := f.js.OrderedConsumer(context.Background(), f.stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{f.stream + ".dlq"}})
	brokertest.Must(t, err)
	batch, err := sub.Fetch(10, jetstream.FetchMaxWait(time.Second))
	brokertest.Must(t, err)
	var letters []jetstream.Msg
	for msg := range batch.Messages() {
		letters = append(letters, msg)
	}
	if len(letters) != 2 {
		t.Fatalf("%d dead letters, want 2", len(letters))
	}
	for n, want := range []struct{ key, seq, err string }{{"", "1", "no key"}, {"poison", "2", "tries"}} {
		h := letters[n].Headers()
		if h.Get(idemnats.KeyHeader) != want.key || h.Get(idemnats.OriginalSubjectHeader) != f.stream+".in" ||
			h.Get(idemnats.OriginalSequenceHeader) != want.seq || !strings.Contains(h.Get(idemnats.ErrorHeader), want.err) {
			t.Errorf("dead letter %d: %v", n, h)
		}
	}
	if s := c.Stats(); s.DeadLettered != 3 || s.HeldBack != 1 {
		t.Errorf("stats %+v: want 3 dead letters sent (one a duplicate), one failure held back", s)
	}
}
