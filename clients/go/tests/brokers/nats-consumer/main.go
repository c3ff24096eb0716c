// The go-nats consumer of brokers/scenario.py: idemnats's handler on a
// durable pull consumer.
package main

import (
	"context"
	"log"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	idem "github.com/redis-idem/redis-idem/clients/go"
	"github.com/redis-idem/redis-idem/clients/go/idemnats"
	"github.com/redis-idem/redis-idem/clients/go/tests/brokers/scenario"
)

func main() {
	env := scenario.Load()
	ctx := scenario.UntilTerm()
	nc, err := nats.Connect(env.BrokerString("url"))
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	// AckWait longer than the Idem's Wait (10 s): a message waiting for a
	// duplicate's holder is not redelivered meanwhile.
	cons, err := js.CreateOrUpdateConsumer(ctx, env.Source, jetstream.ConsumerConfig{Durable: env.Group,
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 12 * time.Second, FilterSubject: env.Source + ".in"})
	if err != nil {
		log.Fatal(err)
	}
	c := idemnats.New(env.Idem(), js, func(ctx context.Context, job *idem.Job, msg jetstream.Msg) (scenario.Result, error) {
		return env.Work(ctx, job, msg.Data())
	}, idemnats.Options{OnError: func(err error) { log.Print(err) }})
	// One message at a time (one Consume): the scenario watches what each
	// member is at work on.
	cc, err := cons.Consume(c.MessageHandler(context.Background()), jetstream.PullMaxMessages(4))
	if err != nil {
		log.Fatal(err)
	}
	<-ctx.Done()
	cc.Stop()
	<-cc.Closed()
	log.Printf("member %s: %+v", env.Member, c.Stats())
}
