// A RabbitMQ consumer with redis-idem's Go adapter (idemamqp, on
// amqp091-go).
//
// Usage: go run . 127.0.0.1:6379 amqp://guest:guest@127.0.0.1:5672/
//
// It declares the quorum queue "orders" (its dead letters through the
// exchange "orders.dlx" into "orders.dlq"), publishes five orders each
// twice (a publisher's retry: the same message_id), then consumes until
// Ctrl-C: each order is charged once; a Busy or failed one comes back
// through a retry queue "orders.retry.<ms>".
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"

	amqp "github.com/rabbitmq/amqp091-go"
	idem "github.com/redis-idem/redis-idem/clients/go"
	"github.com/redis-idem/redis-idem/clients/go/idemamqp"
	"github.com/redis/go-redis/v9"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: go run . <redis host:port> <amqp url>")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	consumer, err := idem.New(redis.NewClient(&redis.Options{Addr: os.Args[1]}), idem.Options{Prefix: "example:", MaxTries: 5})
	check(err)
	conn, err := amqp.Dial(os.Args[2])
	check(err)
	defer conn.Close()
	ch, err := conn.Channel()
	check(err)
	check(ch.ExchangeDeclare("orders.dlx", "fanout", true, false, false, false, nil))
	_, err = ch.QueueDeclare("orders.dlq", true, false, false, false, nil)
	check(err)
	check(ch.QueueBind("orders.dlq", "", "orders.dlx", false, nil))
	_, err = ch.QueueDeclare("orders", true, false, false, false, idemamqp.QueueArguments(consumer, "orders.dlx"))
	check(err)
	for n := range 10 {
		check(ch.PublishWithContext(ctx, "", "orders", false, false, amqp.Publishing{
			MessageId: fmt.Sprintf("order-%d", n%5), Body: []byte(`{"cents":1250}`), DeliveryMode: amqp.Persistent}))
	}
	check(ch.Qos(8, 0, false))
	c, err := idemamqp.New(consumer, ch, "orders", func(ctx context.Context, job *idem.Job, d *amqp.Delivery) (string, error) {
		fmt.Printf("charged %s (%s), attempt %d\n", d.MessageId, d.Body, job.Attempt())
		return "charged", nil
	}, idemamqp.Options{Concurrency: 8})
	check(err)
	deliveries, err := ch.Consume("orders", "", false, false, false, false, nil)
	check(err)
	check(c.Run(ctx, deliveries))
	fmt.Printf("%+v\n", c.Stats())
}

func check(err error) {
	if err != nil {
		panic(err)
	}
}
