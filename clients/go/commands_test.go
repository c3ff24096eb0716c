package idem_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	idem "github.com/redis-idem/redis-idem/clients/go"
	"github.com/redis/go-redis/v9"
)

func TestTypedCommands(t *testing.T) {
	forEachEdition(t, func(t *testing.T, addr string) {
		ctx := context.Background()
		prefix := fresh("typed")
		i := newIdem(t, addr, idem.Options{Prefix: prefix})
		module := strings.HasSuffix(t.Name(), "module")
		ed, err := i.Edition(ctx)
		if want := map[bool]idem.Edition{true: idem.EditionModule, false: idem.EditionFunctions}[module]; err != nil || ed != want {
			t.Fatalf("edition %v %v, want %v", ed, err, want)
		}
		if _, err := i.Claim(ctx, "k", 1500*time.Millisecond, idem.ClaimArgs{}); err == nil {
			t.Error("a lease of 1.5 s was sent")
		}
		c, err := i.Claim(ctx, "k", 30*time.Second, idem.ClaimArgs{Payload: []byte("p")})
		if err != nil || c.Status != idem.StatusNew || c.Attempt != 1 || len(c.Token) != 32 {
			t.Fatalf("claim %+v %v", c, err)
		}
		busy, _ := i.Claim(ctx, "k", 30*time.Second, idem.ClaimArgs{Payload: []byte("p")})
		if busy.Status != idem.StatusBusy || busy.LeaseLeft <= 25*time.Second {
			t.Errorf("busy %+v", busy)
		}
		if m, _ := i.Claim(ctx, "k", 30*time.Second, idem.ClaimArgs{Payload: []byte("q")}); m.Status != idem.StatusMismatch {
			t.Errorf("mismatch %+v", m)
		}
		if err := i.Extend(ctx, "k", c.Token, 60*time.Second); err != nil {
			t.Error(err)
		}
		rec, err := i.Get(ctx, "k")
		if err != nil || rec.State != idem.StateProcessing || rec.LeaseLeft <= 55*time.Second || rec.ClaimedAt.IsZero() || len(rec.Fingerprint) != 32 {
			t.Errorf("get %+v %v", rec, err)
		}
		code, err := i.Done(ctx, "k", c.Token, idem.DoneArgs{Result: []byte("r")})
		if err != nil || code != 1 || !code.Completed() || code.ResultDropped() {
			t.Errorf("done %v %v", code, err)
		}
		if code, err := i.Done(ctx, "k", c.Token, idem.DoneArgs{}); err != nil || code.Completed() {
			t.Errorf("done again %v %v", code, err)
		}
		var stale *idem.ServerError
		if err := i.Extend(ctx, "k", c.Token, time.Minute); !errors.As(err, &stale) || stale.Kind != idem.KindStale || !errors.Is(err, idem.ErrStale) {
			t.Errorf("extend after done: %v", err)
		}
		if replay, _ := i.Claim(ctx, "k", 30*time.Second, idem.ClaimArgs{}); replay.Status != idem.StatusDone || string(replay.Result) != "r" {
			t.Errorf("replay %+v", replay)
		}
		if rec, err := i.Get(ctx, "none"); rec != nil || err != nil {
			t.Errorf("get of no record %+v %v", rec, err)
		}
		if ok, err := i.Once(ctx, "o", time.Minute); !ok || err != nil {
			t.Errorf("once %v %v", ok, err)
		}
		if ok, _ := i.Once(ctx, "o", time.Minute); ok {
			t.Error("once twice")
		}
		c2, _ := i.Claim(ctx, "r", 30*time.Second, idem.ClaimArgs{})
		if ok, err := i.Release(ctx, "r", c2.Token); !ok || err != nil {
			t.Errorf("release %v %v", ok, err)
		}
		c3, _ := i.Claim(ctx, "big", 30*time.Second, idem.ClaimArgs{})
		if _, err := i.Done(ctx, "big", c3.Token, idem.DoneArgs{Result: make([]byte, 1<<20+1)}); !errors.Is(err, idem.ErrResultTooLarge) {
			t.Errorf("a result over idem.max-result: %v", err)
		}
		raw := redis.NewClient(&redis.Options{Addr: addr})
		defer raw.Close()
		raw.Set(ctx, prefix+"str", "x", 0)
		var wrong *idem.ServerError
		if _, err := i.Claim(ctx, "str", 30*time.Second, idem.ClaimArgs{}); !errors.As(err, &wrong) || wrong.Kind != idem.KindWrongType {
			t.Errorf("claim of a string: %v", err)
		}
		_, mclaimErr := i.MClaim(ctx, []string{"{m}1", "{m}2"}, 30*time.Second, idem.MClaimArgs{})
		_, bfErr := i.BFAdd(ctx, "{m}seen", "a")
		_, waitErr := i.Claim(ctx, "w", 30*time.Second, idem.ClaimArgs{Wait: time.Second})
		if !module {
			for _, err := range []error{mclaimErr, bfErr, waitErr} {
				var required *idem.ServerError
				if !errors.As(err, &required) || required.Kind != idem.KindModuleRequired || !errors.Is(err, idem.ErrModuleRequired) {
					t.Errorf("the Functions edition: %v, want ModuleRequired", err)
				}
			}
			return
		}
		if mclaimErr != nil || bfErr != nil || waitErr != nil {
			t.Fatal(mclaimErr, bfErr, waitErr)
		}
		if seen, _ := i.BFExists(ctx, "{m}seen", "a"); !seen {
			t.Error("bf.exists after bf.add")
		}
		if info, err := i.BFInfo(ctx, "{m}seen"); err != nil || info.Items != 1 || len(info.Shards) != 1 || info.Shard != 24*time.Hour {
			t.Errorf("bf.info %+v %v", info, err)
		}
		again, err := i.MClaim(ctx, []string{"{m}1", "{m}3"}, 30*time.Second, idem.MClaimArgs{})
		if err != nil || again[0].Status != idem.StatusBusy || again[1].Status != idem.StatusNew {
			t.Fatalf("mclaim %+v %v", again, err)
		}
		answers, err := i.MDone(ctx, []idem.DoneItem{{Key: "{m}3", Token: again[1].Token, Result: []byte("3")}}, idem.MDoneArgs{})
		if err != nil || !answers[0].Code.Completed() {
			t.Errorf("mdone %+v %v", answers, err)
		}
	})
}

func TestSlotMatchesClusterKeyslot(t *testing.T) {
	t.Parallel()
	node := redis.NewClient(&redis.Options{Addr: clusterNodes(t)[0]})
	defer node.Close()
	keys := []string{"", "a", "{a}1", "{}x", "x{}", "{{a}}", "a{b}c{d}", "{b", "}a{", "orders:12345", "\xff\x00\x01"}
	for range 200 {
		b := make([]byte, rand.IntN(20))
		for j := range b {
			b[j] = "ab{}xyz\x00é"[rand.IntN(10)]
		}
		keys = append(keys, string(b))
	}
	for _, k := range keys {
		want, err := node.ClusterKeySlot(context.Background(), k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := idem.Slot(k); int64(got) != want {
			t.Errorf("slot(%q) = %d, CLUSTER KEYSLOT says %d", k, got, want)
		}
	}
}

// A wait longer than the client's read timeout is sent in pieces that fit.
func TestWaitLongerThanReadTimeout(t *testing.T) {
	t.Parallel()
	addr := serverFor(t, configs()[0])
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: time.Second})
	defer client.Close()
	prefix := fresh("pieces")
	i, _ := idem.New(client, idem.Options{Prefix: prefix, Wait: 5 * time.Second})
	holder := newIdem(t, addr, idem.Options{Prefix: prefix})
	c, _ := holder.Claim(ctx, "k", 30*time.Second, idem.ClaimArgs{})
	go func() {
		time.Sleep(2500 * time.Millisecond)
		holder.Done(ctx, "k", c.Token, idem.DoneArgs{Result: []byte(`"theirs"`)})
	}()
	res, err := idem.Process(ctx, i, "k", func(context.Context, *idem.Job) (string, error) { return "mine", nil })
	if err != nil || !res.Replayed || res.Value != "theirs" {
		t.Fatalf("%+v %v", res, err)
	}
}

func TestPanicIsReleasedThenGoesOn(t *testing.T) {
	forEachEdition(t, func(t *testing.T, addr string) {
		ctx := context.Background()
		i := newIdem(t, addr, idem.Options{Prefix: fresh("panic")})
		func() {
			defer func() {
				if p := recover(); p != "boom" {
					t.Errorf("recovered %v, want the work's panic", p)
				}
			}()
			idem.Process(ctx, i, "k", func(context.Context, *idem.Job) (int, error) { panic("boom") })
			t.Error("Process returned")
		}()
		if rec, _ := i.Get(ctx, "k"); rec == nil || rec.State != idem.StateReleased {
			t.Errorf("after the panic: %+v", rec)
		}
		if s := i.Stats(); s.Released != 1 || s.FirstRuns != 1 {
			t.Errorf("stats %+v", s)
		}
	})
}

// A batch over MaxBatch keys goes as two MCLAIMs and two MDONEs.
func TestProcessManyInChunks(t *testing.T) {
	t.Parallel()
	cfg := configs()[0]
	cfg.name += "-chunks" // a server of its own: its commandstats are counted
	addr := serverFor(t, cfg)
	ctx := context.Background()
	i := newIdem(t, addr, idem.Options{Prefix: fresh("chunks")})
	raw := redis.NewClient(&redis.Options{Addr: addr})
	defer raw.Close()
	before := calls(t, raw)
	keys := make([]string, idem.MaxBatch+1)
	for j := range keys {
		keys[j] = fmt.Sprint(j)
	}
	items, err := idem.ProcessMany(ctx, i, keys, func(_ context.Context, job *idem.Job) (string, error) { return job.Key(), nil })
	if err != nil || len(items) != len(keys) {
		t.Fatal(len(items), err)
	}
	for j, it := range items {
		if it.Status != idem.BatchProcessed || it.Value != keys[j] || !it.ResultStored {
			t.Fatalf("item %d: %+v", j, it)
		}
	}
	after := calls(t, raw)
	for _, cmd := range []string{"idem.mclaim", "idem.mdone"} {
		if n := after[cmd] - before[cmd]; n != 2 {
			t.Errorf("%s called %d times, want 2", cmd, n)
		}
	}
}

// calls is INFO commandstats' calls of each command, by lowercase name.
func calls(t *testing.T, node *redis.Client) map[string]int64 {
	r := &runner{t: t, ctx: context.Background(), nodes: []*redis.Client{node}, tp: topology{primaries: []string{node.Options().Addr}}}
	return r.commandCalls()
}

// The consumer example in examples/clients/go builds and runs.
func TestConsumerExample(t *testing.T) {
	t.Parallel()
	addr := serverFor(t, configs()[0])
	gocmd, err := exec.LookPath("go")
	if err != nil {
		gocmd = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	cmd := exec.Command(gocmd, "run", ".", addr, "25")
	cmd.Dir = "../../examples/clients/go"
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "go: processed=25 duplicates=25 ") {
		t.Fatalf("%s: %v", out, err)
	}
}
