package idem_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	idem "github.com/redis-idem/redis-idem/clients/go"
	"github.com/redis/go-redis/v9"
)

// scanned is every key a scan lists, once each, sorted.
func scanned(t *testing.T, i *idem.Idem, opts idem.ScanOptions) []string {
	t.Helper()
	var keys []string
	it := i.Scan(context.Background(), opts)
	for it.Next(context.Background()) {
		if !slices.Contains(keys, it.Key()) {
			keys = append(keys, it.Key())
		}
	}
	if err := it.Err(); err != nil {
		t.Fatalf("scan %+v: %v", opts, err)
	}
	slices.Sort(keys)
	return keys
}

// A dead letter (MaxTries 2, two failed works) is listed by Scan, requeued,
// and completes on its next Process with attempt 3; a live lease is refused
// with ErrLiveLease. On every server config, each edition.
func TestScanAndRequeueADeadLetter(t *testing.T) {
	for _, cfg := range configs() {
		t.Run(cfg.name, func(t *testing.T) {
			if cfg.binary == "" {
				t.Skip("no binary for " + cfg.name)
			}
			t.Parallel()
			ctx := context.Background()
			addr := serverFor(t, cfg)
			prefix := fresh("op[1]*")
			i := newIdem(t, addr, idem.Options{Prefix: prefix, MaxTries: 2})
			for n := 1; n <= 2; n++ {
				_, err := idem.Process(ctx, i, "dead", func(ctx context.Context, job *idem.Job) (string, error) {
					return "", fmt.Errorf("try %d", n)
				})
				if err == nil || err.Error() != fmt.Sprintf("try %d", n) {
					t.Fatalf("try %d: %v", n, err)
				}
			}
			if _, err := idem.Process(ctx, i, "dead", func(ctx context.Context, job *idem.Job) (string, error) {
				return "never", nil
			}); !errors.Is(err, idem.ErrExhausted) {
				t.Fatalf("a third try: %v", err)
			}
			live, err := i.Claim(ctx, "live", time.Minute, idem.ClaimArgs{})
			if err != nil {
				t.Fatal(err)
			}
			done, _ := i.Claim(ctx, "done", time.Minute, idem.ClaimArgs{})
			if _, err := i.Done(ctx, "done", done.Token, idem.DoneArgs{Result: []byte(`"r"`)}); err != nil {
				t.Fatal(err)
			}
			raw := redis.NewClient(&redis.Options{Addr: addr})
			defer raw.Close()
			raw.Set(ctx, prefix+"plain", "x", time.Minute)
			raw.Set(ctx, "op-outside", "x", time.Minute) // outside the prefix: never listed

			for _, c := range []struct {
				opts idem.ScanOptions
				want []string
			}{
				{idem.ScanOptions{Count: 5}, []string{"dead", "done", "live"}},
				{idem.ScanOptions{State: idem.StateReleased, MinTries: 2}, []string{"dead"}},
				{idem.ScanOptions{State: idem.StateReleased, MinTries: 3}, nil},
				{idem.ScanOptions{State: idem.StateProcessing}, []string{"live"}},
				{idem.ScanOptions{Match: "d*", State: idem.StateDone}, []string{"done"}},
				{idem.ScanOptions{Idle: time.Hour}, nil},
			} {
				if got := scanned(t, i, c.opts); !slices.Equal(got, c.want) {
					t.Errorf("scan %+v: %q, want %q", c.opts, got, c.want)
				}
			}
			if it := i.Scan(ctx, idem.ScanOptions{Idle: 1500 * time.Millisecond}); it.Next(ctx) || it.Err() == nil {
				t.Error("an Idle of 1.5 s was sent")
			}
			rec, err := i.Get(ctx, "dead")
			if err != nil || rec.State != idem.StateReleased || rec.Attempt != 2 || rec.Tries == nil || *rec.Tries != 2 {
				t.Fatalf("the dead letter: %+v %v", rec, err)
			}

			if ok, err := i.Requeue(ctx, "dead"); !ok || err != nil {
				t.Fatalf("requeue: %v %v", ok, err)
			}
			if rec, _ := i.Get(ctx, "dead"); rec.State != idem.StateReleased || rec.Attempt != 2 || *rec.Tries != 0 {
				t.Errorf("requeued: %+v", rec)
			}
			if ok, err := i.Requeue(ctx, "absent"); ok || err != nil {
				t.Errorf("requeue of no record: %v %v", ok, err)
			}
			var liveErr *idem.ServerError
			if ok, err := i.Requeue(ctx, "live"); ok || !errors.Is(err, idem.ErrLiveLease) || !errors.As(err, &liveErr) || liveErr.Kind != idem.KindLiveLease {
				t.Errorf("requeue of a live lease: %v %v", ok, err)
			}
			if rec, _ := i.Get(ctx, "live"); rec.State != idem.StateProcessing {
				t.Errorf("the live record changed: %+v", rec)
			}
			if ok, _ := i.Release(ctx, "live", live.Token); !ok {
				t.Error("the live claim was not its holder's any more")
			}

			res, err := idem.Process(ctx, i, "dead", func(ctx context.Context, job *idem.Job) (int64, error) {
				return job.Attempt(), nil
			})
			if err != nil || res.Value != 3 {
				t.Fatalf("the next delivery: %+v %v", res, err)
			}
			if rec, _ := i.Get(ctx, "dead"); rec.State != idem.StateDone || rec.Attempt != 3 || *rec.Tries != 1 {
				t.Errorf("completed: %+v", rec)
			}
		})
	}
}

// In a cluster Scan walks every primary; Requeue goes to the key's node.
func TestScanFindsEveryPrimarysRecords(t *testing.T) {
	ctx := context.Background()
	addrs := clusterNodes(t)
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer client.Close()
	prefix := fresh("opc")
	i, err := idem.New(client, idem.Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	owners := map[string]bool{}
	for n := 0; n < 30; n++ {
		key := fmt.Sprintf("k%02d", n)
		keys = append(keys, key)
		if _, err := i.Claim(ctx, key, time.Minute, idem.ClaimArgs{}); err != nil {
			t.Fatal(err)
		}
		node, err := client.MasterForKey(ctx, prefix+key)
		if err != nil {
			t.Fatal(err)
		}
		owners[node.Options().Addr] = true
	}
	if len(owners) != 3 {
		t.Fatalf("the keys are on %d primaries, want 3", len(owners))
	}
	if got := scanned(t, i, idem.ScanOptions{State: idem.StateProcessing}); !slices.Equal(got, keys) {
		t.Errorf("scan: %q, want %q", got, keys)
	}
	if ok, err := i.Once(ctx, "marked", time.Minute); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if ok, err := i.Requeue(ctx, "marked"); !ok || err != nil {
		t.Errorf("requeue in the cluster: %v %v", ok, err)
	}
}
