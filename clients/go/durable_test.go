package idem_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	idem "github.com/redis-idem/redis-idem/clients/go"
	"github.com/redis/go-redis/v9"
)

// In a cluster the WAIT goes to the node that ran the command, on its
// connection: a key's claim and DONE wait on its own primary only, and a
// batch over three primaries waits once per node for its claims and once
// for its completions.
func TestDurableWaitsOnTheKeysNode(t *testing.T) {
	ctx := context.Background()
	addrs := clusterNodes(t)
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer client.Close()
	i, err := idem.New(client, idem.Options{Prefix: fresh("durable-cluster"), Durable: &idem.Durable{Replicas: 0}})
	if err != nil {
		t.Fatal(err)
	}
	nodes := map[string]*redis.Client{}
	keyOn := map[string]string{} // a key per node
	for n := 0; len(keyOn) < 3; n++ {
		key := fmt.Sprintf("{k%d}", n)
		node, err := client.MasterForKey(ctx, i.Prefix()+key)
		if err != nil {
			t.Fatal(err)
		}
		addr := node.Options().Addr
		if _, ok := keyOn[addr]; !ok {
			keyOn[addr], nodes[addr] = key, redis.NewClient(&redis.Options{Addr: addr})
			defer nodes[addr].Close()
		}
	}
	waits := func() map[string]int64 {
		out := map[string]int64{}
		for addr, node := range nodes {
			out[addr] = calls(t, node)["wait"]
		}
		return out
	}
	before := waits()
	var one string
	for addr, key := range keyOn {
		one = addr
		if _, err := idem.Process(ctx, i, key, func(context.Context, *idem.Job) (int, error) { return 1, nil }); err != nil {
			t.Fatal(err)
		}
		break
	}
	after := waits()
	for addr := range nodes {
		want := int64(0)
		if addr == one {
			want = 2
		}
		if got := after[addr] - before[addr]; got != want {
			t.Errorf("%s: %d WAITs after one Process on another's key, want %d", addr, got, want)
		}
	}
	var keys []string
	for _, key := range keyOn {
		keys = append(keys, key+"batch")
	}
	items, err := idem.ProcessMany(ctx, i, keys, func(_ context.Context, job *idem.Job) (string, error) { return job.Key(), nil })
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range items {
		if it.Status != idem.BatchProcessed || it.Err != nil {
			t.Errorf("%+v", it)
		}
	}
	for addr, n := range waits() {
		if got := n - after[addr]; got != 2 {
			t.Errorf("%s: %d WAITs for a batch with one key there, want 2", addr, got)
		}
	}
}

// Fsync sends WAITAOF: on a server without it (Redis 7.0) every call ends
// NotDurable before any work ran, its claim released; on Redis 7.2+ with
// appendonly yes it completes.
func TestDurableFsync(t *testing.T) {
	for _, cfg := range []serverConfig{configs()[0], configs()[1]} {
		t.Run(cfg.name, func(t *testing.T) {
			if cfg.binary == "" {
				t.Skip("no binary for " + cfg.name)
			}
			t.Parallel()
			ctx := context.Background()
			addr := startServer(t, cfg.binary, true, false, "--appendonly", "yes", "--appendfsync", "always")
			i := newIdem(t, addr, idem.Options{Prefix: fresh("fsync"), Durable: &idem.Durable{Replicas: 0, Fsync: true}})
			ran := false
			res, err := idem.Process(ctx, i, "k", func(context.Context, *idem.Job) (string, error) {
				ran = true
				return "v", nil
			})
			if cfg.name == "redis7-module" {
				var nd *idem.NotDurableError
				if !errors.As(err, &nd) || nd.Stage != idem.StageClaim || ran {
					t.Fatalf("WAITAOF refused: %+v %v (ran %v), want NotDurable at the claim", res, err, ran)
				}
				if rec, _ := i.Get(ctx, "k"); rec == nil || rec.State != idem.StateReleased {
					t.Errorf("the claim was not released: %+v", rec)
				}
				if s := i.Stats(); s.NotDurable != 1 || s.FirstRuns != 0 || s.Released != 0 {
					t.Errorf("stats %+v", s)
				}
				return
			}
			if err != nil || res.Value != "v" || !ran {
				t.Fatalf("%+v %v", res, err)
			}
			if rec, _ := i.Get(ctx, "k"); rec == nil || rec.State != idem.StateDone {
				t.Errorf("the record %+v", rec)
			}
		})
	}
}

// A replay waits for its replicas too: on a primary with none, a key done
// (by the typed commands, which send no WAIT) replays as NotDurable at the
// done stage, with the stored result, the work not run, nothing released;
// ProcessMany's item the same.
func TestDurableReplayNotAcknowledged(t *testing.T) {
	cfg := configs()[0]
	ctx := context.Background()
	addr := startServer(t, cfg.binary, true, false)
	i := newIdem(t, addr, idem.Options{Prefix: fresh("durable-replay"), Durable: &idem.Durable{Replicas: 1, Timeout: 50 * time.Millisecond}})
	for _, key := range []string{"k", "m"} {
		c, err := i.Claim(ctx, key, time.Minute, idem.ClaimArgs{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := i.Done(ctx, key, c.Token, idem.DoneArgs{Result: []byte(`"stored"`)}); err != nil {
			t.Fatal(err)
		}
	}
	ran := false
	res, err := idem.Process(ctx, i, "k", func(context.Context, *idem.Job) (string, error) {
		ran = true
		return "again", nil
	})
	var nd *idem.NotDurableError
	if !errors.As(err, &nd) || nd.Stage != idem.StageDone || nd.Result != "stored" || res.Value != "stored" || !res.Replayed || ran {
		t.Fatalf("a replay not acknowledged: %+v %v (ran %v)", res, err, ran)
	}
	if rec, _ := i.Get(ctx, "k"); rec == nil || rec.State != idem.StateDone {
		t.Errorf("the record %+v", rec)
	}
	items, err := idem.ProcessMany(ctx, i, []string{"m"}, func(context.Context, *idem.Job) (string, error) { return "again", nil })
	if err != nil || items[0].Status != idem.BatchNotDurable || items[0].Value != "stored" || !errors.As(items[0].Err, &nd) || nd.Stage != idem.StageDone {
		t.Fatalf("a batch replay not acknowledged: %+v %v", items, err)
	}
	if s := i.Stats(); s.NotDurable != 2 || s.Replays != 0 || s.Released != 0 {
		t.Errorf("stats %+v", s)
	}
}

// ClaimMany reads its WAIT as Process reads a claim's (one rule in the
// core, docs/clients.md's Durability): on a primary with one replica, a
// key answered done is a replay while the replica acknowledges it, and
// NotDurable at the done stage, its stored Result kept, when two replicas
// are asked for (nothing released); a key granted in that batch is
// NotDurable at the claim stage and released.
func TestDurableClaimManyReadsAReplaysWait(t *testing.T) {
	for _, cfg := range configs() {
		if cfg.binary == "" {
			continue
		}
		t.Run(cfg.name, func(t *testing.T) {
			ctx := context.Background()
			primary, _ := startPair(t, cfg)
			prefix := fresh("durable-claim-many")
			plain := newIdem(t, primary, idem.Options{Prefix: prefix})
			c, err := plain.Claim(ctx, "d", time.Minute, idem.ClaimArgs{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := plain.Done(ctx, "d", c.Token, idem.DoneArgs{Result: []byte(`"stored"`)}); err != nil {
				t.Fatal(err)
			}
			asking := func(replicas int) *idem.Idem {
				return newIdem(t, primary, idem.Options{Prefix: prefix, Durable: &idem.Durable{Replicas: replicas, Timeout: 2 * time.Second}})
			}
			one := asking(1)
			claims, err := one.ClaimMany(ctx, []string{"d", "n1"}, time.Minute, nil)
			if err != nil || claims[0].Err != nil || claims[0].Status != idem.StatusDone || string(claims[0].Result) != `"stored"` ||
				claims[1].Err != nil || claims[1].Status != idem.StatusNew {
				t.Fatalf("acknowledged: %+v %v", claims, err)
			}
			if s := one.Stats(); s.NotDurable != 0 {
				t.Errorf("stats %+v", s)
			}
			two := asking(2)
			claims, err = two.ClaimMany(ctx, []string{"d", "n2"}, time.Minute, nil)
			if err != nil {
				t.Fatal(err)
			}
			var nd *idem.NotDurableError
			if !errors.As(claims[0].Err, &nd) || nd.Stage != idem.StageDone || nd.Acknowledged != 1 || string(claims[0].Result) != `"stored"` {
				t.Errorf("a replay not acknowledged: %+v", claims[0])
			}
			if !errors.As(claims[1].Err, &nd) || nd.Stage != idem.StageClaim || nd.Acknowledged != 1 {
				t.Errorf("a claim not acknowledged: %+v", claims[1])
			}
			if s := two.Stats(); s.NotDurable != 2 {
				t.Errorf("stats %+v", s)
			}
			if rec, _ := plain.Get(ctx, "d"); rec == nil || rec.State != idem.StateDone {
				t.Errorf("d: %+v", rec)
			}
			if rec, _ := plain.Get(ctx, "n2"); rec == nil || rec.State != idem.StateReleased {
				t.Errorf("n2: %+v", rec)
			}
		})
	}
}
