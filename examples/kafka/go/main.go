// A Kafka consumer with redis-idem's Go adapter (idemkafka, on franz-go).
//
// Usage: go run . 127.0.0.1:6379 127.0.0.1:9092
//
// It sends five orders to the topic "orders", each twice (a producer's
// retry: the same key, a new offset), then consumes them in the group
// "billing" until Ctrl-C: each order is charged once, and its offsets are
// committed once they are done. A topic's dead letters go to "orders-dlt".
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"

	idem "github.com/redis-idem/redis-idem/clients/go"
	"github.com/redis-idem/redis-idem/clients/go/idemkafka"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: go run . <redis host:port> <kafka host:port>")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	consumer, err := idem.New(redis.NewClient(&redis.Options{Addr: os.Args[1]}), idem.Options{Prefix: "example:", MaxTries: 5})
	check(err)
	c := idemkafka.New(consumer, func(ctx context.Context, job *idem.Job, r *kgo.Record) (string, error) {
		fmt.Printf("charged %s (%s), attempt %d\n", r.Key, r.Value, job.Attempt())
		return "charged", nil
	}, idemkafka.Options{})
	cl, err := kgo.NewClient(append(c.ClientOpts(), kgo.SeedBrokers(os.Args[2]), kgo.AllowAutoTopicCreation(),
		kgo.ConsumerGroup("billing"), kgo.ConsumeTopics("orders"))...)
	check(err)
	defer cl.Close()
	for n := range 10 {
		r := &kgo.Record{Topic: "orders", Key: fmt.Appendf(nil, "order-%d", n%5), Value: []byte(`{"cents":1250}`)}
		check(cl.ProduceSync(ctx, r).FirstErr())
	}
	check(c.Run(ctx, cl))
	fmt.Printf("%+v\n", c.Stats())
}

func check(err error) {
	if err != nil {
		panic(err)
	}
}
