// The Go library's bench program (bench/clients/README.md): idem.Process
// against the hand-made SET NX PX + SET XX pair on the same go-redis
// client, at N messages in flight (N goroutines sharing one client).
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"

	idem "github.com/redis-idem/redis-idem/clients/go"
	"github.com/redis/go-redis/v9"
)

// result is every message's work's value: {"n": i}.
type result struct {
	N int `json:"n"`
}

func main() {
	url := flag.String("url", "redis://127.0.0.1:6379", "the server")
	impl := flag.String("impl", "idem", "idem or pair")
	scenario := flag.String("scenario", "first", "first (new keys) or replay")
	inflight := flag.Int("inflight", 1, "messages in flight at once")
	messages := flag.Int("messages", 3000, "messages to time")
	prefix := flag.String("prefix", "b:", "every key is prefix + index")
	edition := flag.String("edition", "module", "module or functions")
	batch := flag.String("batch", "", "on or off (default: the library's)")
	profile := flag.String("cpuprofile", "", "write the timed part's CPU profile here")
	flag.Parse()

	opt, err := redis.ParseURL(*url)
	if err != nil {
		fail(err)
	}
	client := redis.NewClient(opt)
	defer client.Close()
	ctx := context.Background()
	var one func(key string, n int) error
	switch *impl {
	case "idem":
		opts := idem.Options{Edition: idem.EditionModule}
		if *edition == "functions" {
			opts.Edition = idem.EditionFunctions
		}
		switch *batch {
		case "on":
			opts.Batch = idem.BatchOn
		case "off":
			opts.Batch = idem.BatchOff
		}
		i, err := idem.New(client, opts)
		if err != nil {
			fail(err)
		}
		one = func(key string, n int) error {
			_, err := idem.Process(ctx, i, key, func(context.Context, *idem.Job) (result, error) {
				return result{N: n}, nil
			})
			return err
		}
	case "pair":
		one = func(key string, n int) error { return pair(ctx, client, *scenario, key, n) }
	default:
		fail(fmt.Errorf("--impl %s: idem or pair", *impl))
	}
	run(one, *prefix+"warm:", 200, *inflight)
	if *profile != "" {
		f, err := os.Create(*profile)
		if err != nil {
			fail(err)
		}
		_ = pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	start := time.Now()
	run(one, *prefix, *messages, *inflight)
	seconds := time.Since(start).Seconds()
	out, _ := json.Marshal(map[string]any{"seconds": seconds, "messages": *messages})
	fmt.Println(string(out))
}

// run does messages 0..count-1 under prefix, inflight at a time.
func run(one func(key string, n int) error, prefix string, count, inflight int) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range inflight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := int(next.Add(1) - 1); n < count; n = int(next.Add(1) - 1) {
				if err := one(fmt.Sprint(prefix, n), n); err != nil {
					fail(err)
				}
			}
		}()
	}
	wg.Wait()
}

// pair is the hand-made equivalent: SET NX PX, the work, SET XX EX; a key
// taken already (and every replay) is one GET and its decoding.
func pair(ctx context.Context, c *redis.Client, scenario, key string, n int) error {
	if scenario == "first" {
		token := make([]byte, 16)
		_, _ = rand.Read(token)
		ok, err := c.SetNX(ctx, key, hex.EncodeToString(token), 30*time.Second).Result()
		if err != nil {
			return err
		}
		if ok {
			data, err := json.Marshal(result{N: n})
			if err != nil {
				return err
			}
			return c.SetXX(ctx, key, data, 24*time.Hour).Err()
		}
	}
	data, err := c.Get(ctx, key).Bytes()
	if err != nil {
		return err
	}
	var r result
	if err := json.Unmarshal(data, &r); err != nil {
		return errors.New("a replay that is not a result: " + string(data))
	}
	return nil
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench/clients/go:", err)
	os.Exit(1)
}
