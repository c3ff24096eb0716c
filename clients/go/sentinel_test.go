package idem_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	idem "github.com/redis-idem/redis-idem/clients/go"
	"github.com/redis/go-redis/v9"
)

// A Sentinel failover with work in flight, through go-redis's failover
// client, with Durable{Replicas: 1}: 8 workers take deliveries (a quarter
// of them duplicates) while the Sentinel promotes the replica. A delivery
// that fails is redelivered until it is acknowledged. Nothing acknowledged
// is ever run again, and a key's fencing number is never granted twice:
// every claim a work acted on was on the replica that became the primary.
func TestSentinelFailoverWithWorkInFlight(t *testing.T) {
	forEachEdition(t, func(t *testing.T, _ string) {
		cfg := configs()[0]
		if t.Name() != "TestSentinelFailoverWithWorkInFlight/module" {
			cfg = configs()[3]
		}
		primary, replica := startPair(t, cfg)
		sentinel := startSentinel(t, cfg.binary, primary)
		client := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "mymaster", SentinelAddrs: []string{sentinel}})
		defer client.Close()
		i, err := idem.New(client, idem.Options{Prefix: fresh("failover"), Wait: 20 * time.Second,
			Durable: &idem.Durable{Replicas: 1, Timeout: 500 * time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		runs := map[string][]int64{}     // the attempts each key's work ran with
		acked := map[string]bool{}       // acknowledged: done, or a replay
		ranAfterAck := map[string]bool{} // a work that ran once its key was acknowledged
		failures := map[string]int{}     // why deliveries were not acknowledged
		deliveries := make(chan string, 64)
		redeliver := make(chan string, 4096)
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for key := range deliveries {
					_, err := idem.Process(context.Background(), i, key, func(ctx context.Context, job *idem.Job) (string, error) {
						mu.Lock()
						runs[key] = append(runs[key], job.Attempt())
						if acked[key] {
							ranAfterAck[key] = true
						}
						mu.Unlock()
						time.Sleep(5 * time.Millisecond)
						return key, nil
					})
					mu.Lock()
					if err == nil {
						acked[key] = true
					} else {
						failures[kind(err)]++
						redeliver <- key
					}
					mu.Unlock()
				}
			}()
		}
		switched := make(chan error, 1)
		go func() {
			time.Sleep(time.Second)
			switched <- sentinelFailover(context.Background(), sentinel, primary, replica)
		}()
		n, after := 0, -1
		for after != 0 {
			key := fmt.Sprint("order:", n)
			if n > 4 && rand.IntN(4) == 0 {
				key = fmt.Sprint("order:", rand.IntN(n))
			}
			deliveries <- key
			n++
			select {
			case err := <-switched:
				if err != nil {
					t.Fatal(err)
				}
				after = 100 // then a hundred more
			default:
				if after > 0 {
					after--
				}
			}
			time.Sleep(2 * time.Millisecond)
		}
		deadline := time.Now().Add(60 * time.Second)
		for time.Now().Before(deadline) {
			select {
			case key := <-redeliver:
				deliveries <- key
				continue
			case <-time.After(500 * time.Millisecond):
			}
			mu.Lock()
			pending := len(redeliver)
			mu.Unlock()
			if pending == 0 {
				break
			}
		}
		close(deliveries)
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for key, attempts := range runs {
			seen := map[int64]bool{}
			for _, a := range attempts {
				if seen[a] {
					t.Errorf("%s: attempt %d granted twice (runs %v)", key, a, attempts)
				}
				seen[a] = true
			}
			if !acked[key] {
				t.Errorf("%s was never acknowledged", key)
			}
		}
		if len(ranAfterAck) > 0 {
			t.Errorf("works ran again after their key was acknowledged: %v", ranAfterAck)
		}
		// Without Durable the same run has works run again after their key
		// was acknowledged, and attempts granted twice: the writes the old
		// primary took after the switch are lost.
		t.Logf("%d deliveries, %d keys; not acknowledged (then redelivered): %v; stats %+v", n, len(runs), failures, i.Stats())
	})
}

// kind names an error for the test's log.
func kind(err error) string {
	for _, e := range []error{idem.ErrNotDurable, idem.ErrBusy, idem.ErrDoneUnconfirmed, idem.ErrLeaseLost} {
		if errors.Is(err, e) {
			return e.Error()
		}
	}
	return err.Error()
}

// go-redis's failover cluster client (a *redis.ClusterClient whose one
// shard the Sentinel names): Process, ProcessMany and Durable's WAIT on
// the primary's connection, before and after a failover.
func TestFailoverClusterClient(t *testing.T) {
	t.Parallel()
	cfg := configs()[0]
	primary, replica := startPair(t, cfg)
	sentinel := startSentinel(t, cfg.binary, primary)
	client := redis.NewFailoverClusterClient(&redis.FailoverOptions{MasterName: "mymaster", SentinelAddrs: []string{sentinel}})
	defer client.Close()
	i, err := idem.New(client, idem.Options{Prefix: fresh("failover-cluster"), Durable: &idem.Durable{Replicas: 1}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	work := func(_ context.Context, job *idem.Job) (string, error) { return job.Key(), nil }
	check := func(round string) {
		res, err := idem.Process(ctx, i, round+":one", work)
		if err != nil || res.Value != round+":one" || res.Replayed {
			t.Fatalf("%s: Process %+v %v", round, res, err)
		}
		items, err := idem.ProcessMany(ctx, i, []string{round + ":a", round + ":b", round + ":one"}, work)
		if err != nil || items[0].Status != idem.BatchProcessed || items[1].Status != idem.BatchProcessed ||
			items[2].Status != idem.BatchReplayed || items[2].Value != round+":one" {
			t.Fatalf("%s: ProcessMany %+v %v", round, items, err)
		}
	}
	check("before")
	if err := sentinelFailover(ctx, sentinel, primary, replica); err != nil {
		t.Fatal(err)
	}
	// The first claim after the switch may meet the demoted primary
	// (READONLY): it is sent again, and reaches the new one.
	check("after")
	if res, err := idem.Process(ctx, i, "before:one", work); err != nil || !res.Replayed {
		t.Errorf("a record of the old primary on the new one: %+v %v", res, err)
	}
}
