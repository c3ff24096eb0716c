package idemamqp_test

// Against a real RabbitMQ (brokers/launch.py) and Redis with the module:
// what brokers/scenario.py cannot tell apart. The scenario itself runs the
// consumer program of clients/go/tests/brokers.

import (
	"context"
	"errors"
	"os"
	"slices"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	idem "github.com/redis-idem/redis-idem/clients/go"
	"github.com/redis-idem/redis-idem/clients/go/idemamqp"
	"github.com/redis-idem/redis-idem/clients/go/internal/brokertest"
	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) {
	code := m.Run()
	brokertest.Stop()
	os.Exit(code)
}

// fixture is a quorum queue made with QueueArguments (its dead-letter
// exchange <queue>.dlx into <queue>.dlq), a channel, and an Idem on a
// fresh Redis.
type fixture struct {
	t     *testing.T
	conn  *amqp.Connection
	ch    *amqp.Channel
	queue string
	idem  *idem.Idem
}

func newFixture(t *testing.T, opts idem.Options) *fixture {
	info := brokertest.Broker(t, "rabbitmq")
	rdb := redis.NewClient(&redis.Options{Addr: brokertest.Redis(t, "module")})
	t.Cleanup(func() { rdb.Close() })
	i, err := idem.New(rdb, opts)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := amqp.Dial(brokertest.Field(info, "url"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q := brokertest.Unique(t.Name())
	brokertest.Must(t, ch.ExchangeDeclare(q+".dlx", "fanout", true, false, false, false, nil))
	_, err = ch.QueueDeclare(q+".dlq", true, false, false, false, nil)
	brokertest.Must(t, err)
	brokertest.Must(t, ch.QueueBind(q+".dlq", "", q+".dlx", false, nil))
	_, err = ch.QueueDeclare(q, true, false, false, false, idemamqp.QueueArguments(i, q+".dlx"))
	brokertest.Must(t, err)
	return &fixture{t: t, conn: conn, ch: ch, queue: q, idem: i}
}

func (f *fixture) publish(ids ...string) {
	for _, id := range ids {
		brokertest.Must(f.t, f.ch.PublishWithContext(context.Background(), "", f.queue, false, false,
			amqp.Publishing{MessageId: id, Body: []byte(id), DeliveryMode: amqp.Persistent}))
	}
}

// consume runs a consumer on a channel of its own until the test ends.
func (f *fixture) consume(opts idemamqp.Options, work idemamqp.Handler[string]) *idemamqp.Consumer[string] {
	ch, err := f.conn.Channel()
	brokertest.Must(f.t, err)
	brokertest.Must(f.t, ch.Qos(4, 0, false))
	c, err := idemamqp.New(f.idem, ch, f.queue, work, opts)
	brokertest.Must(f.t, err)
	deliveries, err := ch.Consume(f.queue, "", false, false, false, false, nil)
	brokertest.Must(f.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx, deliveries); close(done) }()
	f.t.Cleanup(func() { cancel(); <-done; ch.Close() })
	return c
}

// counts is how many messages each of the fixture's queues holds (ready
// and unacknowledged), by name.
func (f *fixture) counts(names ...string) []int {
	out := make([]int, len(names))
	for n, name := range names {
		q, err := f.ch.QueueDeclarePassive(name, true, false, false, false, nil)
		brokertest.Must(f.t, err)
		out[n] = q.Messages
	}
	return out
}

// A message whose key another worker holds goes through the retry queue
// of its holder's lease left (acknowledged there, neither spun on nor
// requeued at once) and comes back, x-death saying so; the held key runs
// once its holder's lease lapsed.
func TestBusyGoesThroughARetryQueue(t *testing.T) {
	f := newFixture(t, idem.Options{Lease: 2 * time.Second, Wait: idem.Off})
	if _, err := f.idem.Claim(context.Background(), "held", 3*time.Second, idem.ClaimArgs{}); err != nil {
		t.Fatal(err)
	}
	f.publish("held", "free")
	var did brokertest.Log
	c := f.consume(idemamqp.Options{}, func(ctx context.Context, job *idem.Job, d *amqp.Delivery) (string, error) {
		deaths, _ := d.Headers["x-death"].([]any)
		did.Add(d.MessageId + map[bool]string{true: "+x-death", false: ""}[len(deaths) > 0])
		return "", nil
	})
	// A work's delivery is acknowledged (and counted) after the work returns.
	brokertest.WaitFor(t, "both acknowledged", func() bool { return c.Stats().Acknowledged >= 2 })
	if got := did.Snapshot(); !slices.Equal(got, []string{"free", "held+x-death"}) {
		t.Errorf("works %v, want free, then held back from a retry queue", got)
	}
	if s := c.Stats(); s.HeldBack == 0 || s.HeldBack > 3 || s.Acknowledged != 2 {
		t.Errorf("stats %+v: want the held message given back once or twice (its lease left, no spin)", s)
	}
	// At most 3 s of lease left: the 3.2 s retry queue.
	brokertest.WaitFor(t, "the queues empty", func() bool {
		return slices.Equal(f.counts(f.queue, f.queue+".retry.3200"), []int{0, 0})
	})
}

// A message without a message_id and one that fails every try are
// rejected to the queue's dead-letter exchange (x-death: rejected from
// the queue); the others go on.
func TestDeadLettersToTheExchange(t *testing.T) {
	f := newFixture(t, idem.Options{Lease: 2 * time.Second, MaxTries: 2})
	f.publish("", "poison", "fine")
	var did brokertest.Log
	c := f.consume(idemamqp.Options{}, func(ctx context.Context, job *idem.Job, d *amqp.Delivery) (string, error) {
		did.Add(d.MessageId)
		if d.MessageId == "poison" {
			return "", errors.New("cannot do it")
		}
		return "", nil
	})
	brokertest.WaitFor(t, "two dead letters", func() bool { return f.counts(f.queue + ".dlq")[0] == 2 })
	var letters []string
	for range 2 {
		d, ok, err := f.ch.Get(f.queue+".dlq", true)
		brokertest.Must(t, err)
		if !ok {
			t.Fatal("a dead letter went missing")
		}
		deaths, _ := d.Headers["x-death"].([]any)
		first, _ := deaths[0].(amqp.Table)
		if first["queue"] != f.queue || first["reason"] != "rejected" {
			t.Errorf("dead letter %q: x-death %v", d.MessageId, deaths)
		}
		letters = append(letters, d.MessageId)
	}
	slices.Sort(letters)
	if !slices.Equal(letters, []string{"", "poison"}) || !slices.Contains(did.Snapshot(), "fine") {
		t.Errorf("dead letters %q, works %v", letters, did.Snapshot())
	}
	if s := c.Stats(); s.DeadLettered != 2 || s.Exhausted != 1 || s.Acknowledged != 1 {
		t.Errorf("stats %+v", s)
	}
}

// QueueArguments' delivery-limit is above MaxTries (the broker would
// dead-letter first, without the error), and the broker takes them.
func TestQueueArgumentsKeepTheDeliveryLimitAboveMaxTries(t *testing.T) {
	for _, tries := range []int{0, 3, 50} {
		f := newFixture(t, idem.Options{MaxTries: tries})
		args := idemamqp.QueueArguments(f.idem, f.queue+".dlx")
		if limit := args["x-delivery-limit"].(int64); limit <= int64(tries) || limit < 20 {
			t.Errorf("MaxTries %d: delivery-limit %d", tries, limit)
		}
	}
}
