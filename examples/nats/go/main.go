// A NATS JetStream consumer with redis-idem's Go adapter (idemnats, on
// nats.go's jetstream).
//
// Usage: go run . 127.0.0.1:6379 nats://127.0.0.1:4222
//
// It makes the stream "ORDERS" (subjects ORDERS.>) and the durable
// consumer "billing" of ORDERS.in, publishes five orders each twice
// without a Nats-Msg-Id (as a publisher's retry after the duplicate window
// would: only the Idem-Key header says they are one), then consumes until
// Ctrl-C: each order is charged once. Dead letters go to ORDERS.dlq.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	idem "github.com/redis-idem/redis-idem/clients/go"
	"github.com/redis-idem/redis-idem/clients/go/idemnats"
	"github.com/redis/go-redis/v9"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: go run . <redis host:port> <nats url>")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	consumer, err := idem.New(redis.NewClient(&redis.Options{Addr: os.Args[1]}), idem.Options{Prefix: "example:", MaxTries: 5})
	check(err)
	nc, err := nats.Connect(os.Args[2])
	check(err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	check(err)
	_, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"ORDERS.>"}})
	check(err)
	cons, err := js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{Durable: "billing",
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 15 * time.Second, FilterSubject: "ORDERS.in"})
	check(err)
	for n := range 10 {
		msg := &nats.Msg{Subject: "ORDERS.in", Data: []byte(`{"cents":1250}`), Header: nats.Header{}}
		msg.Header.Set(idemnats.KeyHeader, fmt.Sprintf("order-%d", n%5))
		_, err := js.PublishMsg(ctx, msg)
		check(err)
	}
	c := idemnats.New(consumer, js, func(ctx context.Context, job *idem.Job, msg jetstream.Msg) (string, error) {
		fmt.Printf("charged %s (%s), attempt %d\n", msg.Headers().Get(idemnats.KeyHeader), msg.Data(), job.Attempt())
		return "charged", nil
	}, idemnats.Options{})
	cc, err := cons.Consume(c.MessageHandler(context.Background()), jetstream.PullMaxMessages(8))
	check(err)
	<-ctx.Done()
	cc.Stop()
	<-cc.Closed()
	fmt.Printf("%+v\n", c.Stats())
}

func check(err error) {
	if err != nil {
		panic(err)
	}
}
