package idemstreams_test

// Against Redis with the module and with the Functions edition: what
// brokers/scenario.py cannot tell apart. The scenario itself runs the
// consumer program of clients/go/tests/brokers.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/redis-idem/redis-idem/clients/go"
	"github.com/redis-idem/redis-idem/clients/go/idemstreams"
	"github.com/redis-idem/redis-idem/clients/go/internal/brokertest"
	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) {
	code := m.Run()
	brokertest.Stop()
	os.Exit(code)
}

// forEachEdition runs test on a fresh Redis of each edition, with a stream
// "s" and its group "g".
func forEachEdition(t *testing.T, test func(t *testing.T, rdb *redis.Client)) {
	for _, edition := range brokertest.Editions {
		t.Run(edition, func(t *testing.T) {
			t.Parallel()
			rdb := redis.NewClient(&redis.Options{Addr: brokertest.Redis(t, edition)})
			t.Cleanup(func() { rdb.Close() })
			if err := rdb.XGroupCreateMkStream(context.Background(), "s", "g", "0").Err(); err != nil {
				t.Fatal(err)
			}
			test(t, rdb)
		})
	}
}

func newIdem(t *testing.T, rdb *redis.Client, opts idem.Options) *idem.Idem {
	i, err := idem.New(rdb, opts)
	if err != nil {
		t.Fatal(err)
	}
	return i
}

func add(t *testing.T, rdb *redis.Client, key string) {
	values := map[string]any{"body": key}
	if key != "" {
		values[idemstreams.KeyField] = key
	}
	if err := rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: "s", Values: values}).Err(); err != nil {
		t.Fatal(err)
	}
}

// run runs a consumer until the test ends.
func run(t *testing.T, i *idem.Idem, name string, opts idemstreams.Options, work idemstreams.Handler[string]) *idemstreams.Consumer[string] {
	c := idemstreams.New(i, "s", "g", name, work, opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return c
}

// settled: nothing pending and nothing undelivered, read in one MULTI (two
// calls let a read land between them: XPENDING 0 before it, lag 0 after).
func settled(t *testing.T, rdb *redis.Client) func() bool {
	return func() bool {
		ctx := context.Background()
		var pending *redis.XPendingCmd
		var groups *redis.XInfoGroupsCmd
		_, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
			pending = p.XPending(ctx, "s", "g")
			groups = p.XInfoGroups(ctx, "s")
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		g := groups.Val()
		return pending.Val().Count == 0 && len(g) == 1 && g[0].Lag == 0
	}
}

// all holds when each of conditions holds, tried in order.
func all(conditions ...func() bool) func() bool {
	return func() bool {
		for _, ok := range conditions {
			if !ok() {
				return false
			}
		}
		return true
	}
}

// describe says who the server is and what its group "g" has read, for a
// failure's message.
func describe(rdb *redis.Client) string {
	ctx := context.Background()
	info, _ := rdb.InfoMap(ctx, "server").Result()
	full, err := rdb.XInfoStreamFull(ctx, "s", 10).Result()
	if err != nil {
		return fmt.Sprintf("server pid %s, XINFO STREAM: %v", info["Server"]["process_id"], err)
	}
	out := fmt.Sprintf("server pid %s, entries added %d, length %d", info["Server"]["process_id"], full.EntriesAdded, full.Length)
	for _, g := range full.Groups {
		out += fmt.Sprintf("; group %s entries read %d, last delivered %s, consumers:", g.Name, g.EntriesRead, g.LastDeliveredID)
		for _, c := range g.Consumers {
			out += fmt.Sprintf(" %s (seen %v ago)", c.Name, time.Since(c.SeenTime).Round(time.Millisecond))
		}
	}
	return out
}

// A work three times as long as ClaimIdle: each heartbeat resets its
// entry's idle time, so the other consumer never takes it over.
func TestHeartbeatKeepsTheEntry(t *testing.T) {
	forEachEdition(t, func(t *testing.T, rdb *redis.Client) {
		var works atomic.Int64
		work := func(ctx context.Context, job *idem.Job, e redis.XMessage) (string, error) {
			works.Add(1)
			time.Sleep(3 * time.Second)
			return "", nil
		}
		opts := idem.Options{Lease: time.Second}
		// a takes nothing over itself (which would reset the idle time
		// too): only its heartbeat keeps the entry.
		a := run(t, newIdem(t, rdb, opts), "a", idemstreams.Options{ClaimIdle: time.Hour, Block: 500 * time.Millisecond}, work)
		add(t, rdb, "long")
		brokertest.WaitFor(t, "a to start", func() bool { return works.Load() == 1 })
		b := run(t, newIdem(t, rdb, opts), "b", idemstreams.Options{}, work)
		// The consumer counts an entry once its XACK has replied: after
		// the server's state that settled() reads.
		brokertest.WaitFor(t, "the entry acknowledged", all(settled(t, rdb), func() bool { return a.Stats().Acknowledged == 1 }))
		if sa, sb := a.Stats(), b.Stats(); works.Load() != 1 || sa.Acknowledged != 1 || sb.Waits+sb.Replays+sb.Busy != 0 {
			t.Errorf("works %d, a %+v, b %+v: want b never to take the entry over", works.Load(), sa, sb)
		}
	})
}

// An entry whose key another worker holds is left pending (not
// acknowledged, not spun on) and taken over with XAUTOCLAIM once idle for
// ClaimIdle; it runs once the holder's lease lapsed.
func TestBusyLeftPending(t *testing.T) {
	forEachEdition(t, func(t *testing.T, rdb *redis.Client) {
		i := newIdem(t, rdb, idem.Options{Lease: time.Second, Wait: idem.Off})
		if _, err := i.Claim(context.Background(), "held", 2*time.Second, idem.ClaimArgs{}); err != nil {
			t.Fatal(err)
		}
		add(t, rdb, "held")
		var works atomic.Int64
		c := run(t, i, "a", idemstreams.Options{}, func(ctx context.Context, job *idem.Job, e redis.XMessage) (string, error) {
			works.Add(1)
			return "", nil
		})
		brokertest.WaitFor(t, "the entry acknowledged", all(settled(t, rdb), func() bool { return c.Stats().Acknowledged == 1 }))
		if s := c.Stats(); works.Load() != 1 || s.HeldBack == 0 || s.HeldBack > 3 || s.Acknowledged != 1 {
			t.Errorf("works %d, stats %+v: want it held back once or twice (ClaimIdle apart), then done; %s", works.Load(), s, describe(rdb))
		}
	})
}

// An entry without a key and one that fails every try: added to s:dlq
// with where they came from and the error, and acknowledged.
func TestDeadLetters(t *testing.T) {
	forEachEdition(t, func(t *testing.T, rdb *redis.Client) {
		i := newIdem(t, rdb, idem.Options{Lease: time.Second, MaxTries: 1})
		add(t, rdb, "")
		add(t, rdb, "poison")
		c := run(t, i, "a", idemstreams.Options{}, func(ctx context.Context, job *idem.Job, e redis.XMessage) (string, error) {
			return "", errors.New("cannot do it")
		})
		brokertest.WaitFor(t, "both entries acknowledged", all(settled(t, rdb), func() bool { return c.Stats().DeadLettered == 2 }))
		letters, err := rdb.XRange(context.Background(), "s:dlq", "-", "+").Result()
		if err != nil || len(letters) != 2 {
			t.Fatalf("dead letters %v, %v", letters, err)
		}
		for n, want := range []struct{ key, err string }{{"", "no key"}, {"poison", "tries"}} {
			v := letters[n].Values
			key, _ := v[idemstreams.KeyField].(string)
			errText, _ := v[idemstreams.ErrorField].(string)
			if key != want.key || v[idemstreams.OriginalIDField] == nil || !strings.Contains(errText, want.err) {
				t.Errorf("dead letter %d: %v", n, v)
			}
		}
		if s := c.Stats(); s.DeadLettered != 2 || s.Exhausted != 1 {
			t.Errorf("stats %+v", s)
		}
	})
}

// A claim the server refuses (the record's key holds a string: WRONGTYPE)
// is nobody's failure the handler could know of: OnError hears of it, and
// the entry is left pending (not acknowledged, not run), to come again.
func TestARefusedClaimIsReportedAndLeftPending(t *testing.T) {
	forEachEdition(t, func(t *testing.T, rdb *redis.Client) {
		i := newIdem(t, rdb, idem.Options{Lease: time.Second})
		brokertest.Must(t, rdb.Set(context.Background(), "taken", "a string", 0).Err())
		add(t, rdb, "taken")
		var works atomic.Int64
		reported := make(chan error, 16)
		opts := idemstreams.Options{ClaimIdle: time.Hour, OnError: func(err error) {
			select {
			case reported <- err:
			default:
			}
		}}
		c := run(t, i, "a", opts, func(ctx context.Context, job *idem.Job, e redis.XMessage) (string, error) {
			works.Add(1)
			return "", nil
		})
		select {
		case err := <-reported:
			if !strings.Contains(err.Error(), "WRONGTYPE") {
				t.Errorf("OnError told %v, want the server's WRONGTYPE", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("OnError was not told of the refused claim")
		}
		brokertest.WaitFor(t, "the entry held back", func() bool { return c.Stats().HeldBack > 0 })
		p, err := rdb.XPending(context.Background(), "s", "g").Result()
		brokertest.Must(t, err)
		if s := c.Stats(); p.Count != 1 || works.Load() != 0 || s.Acknowledged != 0 || s.HeldBack != 1 {
			t.Errorf("pending %d, works %d, stats %+v: want the entry pending, never run nor acknowledged", p.Count, works.Load(), s)
		}
	})
}
