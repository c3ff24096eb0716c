// A Redis Streams consumer with redis-idem's Go adapter (idemstreams).
//
// Usage: go run . 127.0.0.1:6379 [worker name]
//
// It adds five orders to the stream "orders", each twice (a producer's
// retry: the same idem-key, a new entry id), then consumes them in the
// group "billing" until Ctrl-C: each order is charged once, its XACK sent
// with its DONE. Start a second worker with another name beside it: the
// entries one leaves pending (a crash, a stop) the other takes over.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"

	idem "github.com/redis-idem/redis-idem/clients/go"
	"github.com/redis-idem/redis-idem/clients/go/idemstreams"
	"github.com/redis/go-redis/v9"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: go run . <redis host:port> [worker name]")
		os.Exit(2)
	}
	name := "worker-1"
	if len(os.Args) > 2 {
		name = os.Args[2]
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	client := redis.NewClient(&redis.Options{Addr: os.Args[1]})
	consumer, err := idem.New(client, idem.Options{Prefix: "example:", MaxTries: 5})
	check(err)
	if err := client.XGroupCreateMkStream(ctx, "orders", "billing", "0").Err(); err != nil && !redis.HasErrorPrefix(err, "BUSYGROUP") {
		panic(err)
	}
	for n := range 10 {
		check(client.XAdd(ctx, &redis.XAddArgs{Stream: "orders",
			Values: []any{idemstreams.KeyField, fmt.Sprintf("order-%d", n%5), "body", `{"cents":1250}`}}).Err())
	}
	c := idemstreams.New(consumer, "orders", "billing", name, func(ctx context.Context, job *idem.Job, e redis.XMessage) (string, error) {
		fmt.Printf("charged %s (%s), attempt %d\n", e.Values[idemstreams.KeyField], e.Values["body"], job.Attempt())
		return "charged", nil
	}, idemstreams.Options{})
	check(c.Run(ctx))
	fmt.Printf("%+v\n", c.Stats())
}

func check(err error) {
	if err != nil {
		panic(err)
	}
}
