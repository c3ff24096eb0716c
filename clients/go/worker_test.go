package idem_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/redis-idem/redis-idem/clients/go"
	"github.com/redis/go-redis/v9"
)

// runWorker is the killed worker's process (the test binary again, with
// IDEM_TEST_WORKER=addr,prefix,key): it claims the key, says so, and works
// until it is killed.
func runWorker() {
	parts := strings.Split(os.Getenv("IDEM_TEST_WORKER"), ",")
	client := redis.NewClient(&redis.Options{Addr: parts[0]})
	i, err := idem.New(client, idem.Options{Prefix: parts[1], Lease: time.Second})
	if err != nil {
		panic(err)
	}
	_, err = idem.Process(context.Background(), i, parts[2], func(ctx context.Context, job *idem.Job) (string, error) {
		fmt.Println("running", job.Attempt())
		select {}
	})
	fmt.Println("returned", err)
	os.Exit(3)
}

// forEachEdition runs test on the module and on the Functions edition
// (Redis 7.0), side by side.
func forEachEdition(t *testing.T, test func(t *testing.T, addr string)) {
	for _, cfg := range []serverConfig{configs()[0], configs()[3]} {
		t.Run(cfg.edition, func(t *testing.T) {
			t.Parallel()
			test(t, serverFor(t, cfg))
		})
	}
}

func TestKilledWorkerIsRetried(t *testing.T) {
	forEachEdition(t, func(t *testing.T, addr string) {
		prefix := fresh("killed")
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "IDEM_TEST_WORKER="+addr+","+prefix+",order")
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(out).ReadString('\n')
		if err != nil || line != "running 1\n" {
			t.Fatalf("the worker said %q (%v)", line, err)
		}
		if err := cmd.Process.Kill(); err != nil { // SIGKILL: no release, no DONE
			t.Fatal(err)
		}
		_ = cmd.Wait()
		i := newIdem(t, addr, idem.Options{Prefix: prefix})
		ran := false
		res, err := idem.Process(context.Background(), i, "order", func(ctx context.Context, job *idem.Job) (string, error) {
			ran = true
			return "charged", nil
		})
		if err != nil || !ran || res.Status != idem.StatusRetry || res.Attempt != 2 || res.Value != "charged" {
			t.Fatalf("after the kill: %+v, %v (ran %v), want RETRY attempt 2", res, err, ran)
		}
		if s := i.Stats(); s.Waits != 1 || s.Retries != 1 || s.Completed != 1 {
			t.Errorf("stats %+v", s)
		}
	})
}

var prefixes atomic.Int64

// fresh is a prefix no other test (nor another run of the same test in
// this process, -count) uses.
func fresh(what string) string { return fmt.Sprintf("%s-%d:", what, prefixes.Add(1)) }

func newIdem(t *testing.T, addr string, opts idem.Options) *idem.Idem {
	client := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { client.Close() })
	i, err := idem.New(client, opts)
	if err != nil {
		t.Fatal(err)
	}
	return i
}

// A heartbeat slower than the lease: the lease lapses, another worker
// claims, the next EXTEND is refused: the job's context is cancelled with
// ErrLeaseLost, and its DONE is refused too.
func TestLapsedLeaseCancelsTheJob(t *testing.T) {
	forEachEdition(t, func(t *testing.T, addr string) {
		prefix := fresh("lapsed")
		i := newIdem(t, addr, idem.Options{Prefix: prefix, Lease: time.Second, Heartbeat: 1500 * time.Millisecond})
		other := newIdem(t, addr, idem.Options{Prefix: prefix})
		var cause error
		var lost bool
		_, err := idem.Process(context.Background(), i, "k", func(ctx context.Context, job *idem.Job) (string, error) {
			time.Sleep(1200 * time.Millisecond)
			r, err := other.Claim(context.Background(), "k", 30*time.Second, idem.ClaimArgs{})
			if err != nil || r.Status != idem.StatusRetry {
				t.Errorf("the other claim: %+v %v", r, err)
			}
			select {
			case <-ctx.Done():
				cause, lost = context.Cause(ctx), job.Lost()
			case <-time.After(5 * time.Second):
			}
			return "late", nil
		})
		var leaseLost *idem.LeaseLostError
		if !errors.As(err, &leaseLost) || leaseLost.Attempt != 1 {
			t.Fatalf("Process: %v, want a *LeaseLostError", err)
		}
		if !errors.Is(cause, idem.ErrLeaseLost) || !lost {
			t.Errorf("the job's context: cause %v, lost %v", cause, lost)
		}
		rec, err := i.Get(context.Background(), "k")
		if err != nil || rec.State != idem.StateProcessing || rec.Attempt != 2 {
			t.Errorf("the record %+v %v", rec, err)
		}
		if s := i.Stats(); s.LeasesLost != 1 || s.Completed != 0 || s.FirstRuns != 1 {
			t.Errorf("stats %+v", s)
		}
	})
}

// Duplicates waiting in IDEM.CLAIM ... WAIT hold a connection each; they
// take at most half of the client's pool, so that the holders' DONEs (which
// end the waits) always find one. Every delivery twice at once, on a pool
// of 4: all complete, none ends Busy.
func TestWaitersLeaveTheHoldersAConnection(t *testing.T) {
	forEachEdition(t, func(t *testing.T, addr string) {
		client := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 4})
		defer client.Close()
		i, err := idem.New(client, idem.Options{Prefix: fresh("starve"), Wait: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var failed atomic.Int64
		for n := range 20 {
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := idem.Process(context.Background(), i, fmt.Sprint("order:", n), func(context.Context, *idem.Job) (int, error) {
						time.Sleep(20 * time.Millisecond)
						return n, nil
					})
					if err != nil {
						failed.Add(1)
						t.Log(err)
					}
				}()
			}
		}
		wg.Wait()
		if s := i.Stats(); failed.Load() != 0 || s.FirstRuns != 20 || s.Replays != 20 || s.Busy != 0 {
			t.Errorf("%d failed, stats %+v", failed.Load(), s)
		}
	})
}

// The heartbeat is one timer per Idem, idle until a job has run for a
// heartbeat: a short work runs with no goroutine (nor timer goroutine)
// more than there were before its call.
func TestNoGoroutinePerMessage(t *testing.T) {
	addr := serverFor(t, configs()[0])
	i := newIdem(t, addr, idem.Options{Prefix: fresh("goroutines"), Lease: 3 * time.Second})
	ctx := context.Background()
	work := func(context.Context, *idem.Job) (int, error) { return runtime.NumGoroutine(), nil }
	if _, err := idem.Process(ctx, i, "warm", work); err != nil {
		t.Fatal(err)
	}
	for n := range 50 {
		before := runtime.NumGoroutine()
		res, err := idem.Process(ctx, i, fmt.Sprint(n), work)
		if err != nil {
			t.Fatal(err)
		}
		if res.Value > before {
			t.Fatalf("message %d: %d goroutines while its work ran, %d before its call", n, res.Value, before)
		}
	}
}
