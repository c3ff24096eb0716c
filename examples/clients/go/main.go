// A minimal redis-idem consumer with the Go library.
//
// Usage: go run . 127.0.0.1:6379 [messages]
//
// Each message is delivered twice at once, as a broker redelivers; each is
// processed once however often it comes: idem.Process claims the message's
// business key, runs the work while the library keeps the lease alive, and
// records the result (or gives the claim back when the work fails, so a
// retry can run at once). A copy that arrives while another is at work
// waits for it and gets its result. It prints how many deliveries did the
// work and how many were duplicates.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	idem "github.com/redis-idem/redis-idem/clients/go"
	"github.com/redis/go-redis/v9"
)

type receipt struct {
	Order   int   `json:"order"`
	Charged int   `json:"charged"`
	Attempt int64 `json:"attempt"`
}

// charge is the business work: it must not run twice for one order.
func charge(ctx context.Context, order int, attempt int64) (receipt, error) {
	select {
	case <-time.After(20 * time.Millisecond):
	case <-ctx.Done(): // the lease was lost: stop early, the result is not kept
		return receipt{}, context.Cause(ctx)
	}
	return receipt{Order: order, Charged: 100 * order, Attempt: attempt}, nil
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: go run . host:port [messages]")
		os.Exit(2)
	}
	messages := 10
	if len(os.Args) > 2 {
		messages, _ = strconv.Atoi(os.Args[2])
	}
	client := redis.NewClient(&redis.Options{Addr: os.Args[1]})
	defer client.Close()
	consumer, err := idem.New(client, idem.Options{Prefix: "example-go:" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":", Wait: 5 * time.Second})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	var processed, duplicates atomic.Int64
	var wg sync.WaitGroup
	for order := 1; order <= messages; order++ {
		for range 2 { // every message delivered twice, at once
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := idem.Process(ctx, consumer, "order:"+strconv.Itoa(order),
					func(ctx context.Context, job *idem.Job) (receipt, error) {
						// job.Attempt() fences writes downstream.
						return charge(ctx, order, job.Attempt())
					})
				switch {
				case errors.Is(err, idem.ErrBusy):
					// Still at work elsewhere: do not acknowledge; it comes back.
				case err != nil:
					fmt.Fprintln(os.Stderr, "order", order, err)
				case res.Replayed:
					duplicates.Add(1) // acknowledge: res.Value is the first copy's receipt
				default:
					processed.Add(1)
				}
			}()
		}
	}
	wg.Wait()
	s := consumer.Stats()
	fmt.Printf("go: processed=%d duplicates=%d (waited %d)\n", processed.Load(), duplicates.Load(), s.Waits)
}
