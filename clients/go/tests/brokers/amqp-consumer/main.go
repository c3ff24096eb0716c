// The go-rabbitmq consumer of brokers/scenario.py: idemamqp on a quorum
// queue.
package main

import (
	"context"
	"log"

	amqp "github.com/rabbitmq/amqp091-go"
	idem "github.com/redis-idem/redis-idem/clients/go"
	"github.com/redis-idem/redis-idem/clients/go/idemamqp"
	"github.com/redis-idem/redis-idem/clients/go/tests/brokers/scenario"
)

func main() {
	env := scenario.Load()
	ctx := scenario.UntilTerm()
	conn, err := amqp.Dial(env.BrokerString("url"))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		log.Fatal(err)
	}
	// One delivery at a time (Concurrency's default): the scenario watches
	// what each member is at work on.
	if err := ch.Qos(4, 0, false); err != nil {
		log.Fatal(err)
	}
	c, err := idemamqp.New(env.Idem(), ch, env.Source,
		func(ctx context.Context, job *idem.Job, d *amqp.Delivery) (scenario.Result, error) {
			return env.Work(ctx, job, d.Body)
		}, idemamqp.Options{OnError: func(err error) { log.Print(err) }})
	if err != nil {
		log.Fatal(err)
	}
	deliveries, err := ch.Consume(env.Source, "", false, false, false, false, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx, deliveries); err != nil {
		log.Print(err)
	}
	ch.Close()
	log.Printf("member %s: %+v", env.Member, c.Stats())
}
