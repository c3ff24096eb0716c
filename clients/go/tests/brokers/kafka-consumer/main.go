// The go-kafka consumer of brokers/scenario.py: idemkafka's poll loop.
package main

import (
	"context"
	"log"
	"time"

	idem "github.com/redis-idem/redis-idem/clients/go"
	"github.com/redis-idem/redis-idem/clients/go/idemkafka"
	"github.com/redis-idem/redis-idem/clients/go/tests/brokers/scenario"
	"github.com/twmb/franz-go/pkg/kgo"
)

func main() {
	env := scenario.Load()
	ctx := scenario.UntilTerm()
	work := func(ctx context.Context, job *idem.Job, r *kgo.Record) (scenario.Result, error) {
		return env.Work(ctx, job, r.Value)
	}
	// One record at a time across the partitions: the scenario watches
	// what each member is at work on.
	c := idemkafka.New(env.Idem(), work, idemkafka.Options{MaxInFlight: 1, OnError: func(err error) { log.Print(err) }})
	cl, err := kgo.NewClient(append(c.ClientOpts(),
		kgo.SeedBrokers(env.BrokerString("bootstrap")), kgo.ConsumerGroup(env.Group), kgo.ConsumeTopics(env.Source),
		// A dead member is seen in seconds.
		kgo.SessionTimeout(6*time.Second), kgo.HeartbeatInterval(time.Second),
	)...)
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx, cl); err != nil {
		log.Print(err)
	}
	cl.Close()
	log.Printf("member %s: %+v", env.Member, c.Stats())
}
