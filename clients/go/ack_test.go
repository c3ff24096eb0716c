package idem_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/redis-idem/redis-idem/clients/go"
	"github.com/redis/go-redis/v9"
)

// sentLog records the commands a client sends (each round trip's, by
// name), as the server gets them.
type sentLog struct {
	mu    sync.Mutex
	names []string
}

func (l *sentLog) DialHook(next redis.DialHook) redis.DialHook { return next }

func (l *sentLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		l.add(cmd)
		return next(ctx, cmd)
	}
}

func (l *sentLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			l.add(c)
		}
		return next(ctx, cmds)
	}
}

func (l *sentLog) add(cmd redis.Cmder) {
	l.mu.Lock()
	defer l.mu.Unlock()
	name := strings.ToUpper(cmd.Name())
	if name == "FCALL" {
		name += " " + cmd.Args()[1].(string)
	}
	l.names = append(l.names, name)
}

func (l *sentLog) since(n int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.names[n:]...)
}

func (l *sentLog) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.names)
}

// streamEntry makes a stream with a group and one entry read by consumer
// c1: the entry's id, pending.
func streamEntry(t *testing.T, client *redis.Client, stream string) string {
	ctx := context.Background()
	if err := client.XGroupCreateMkStream(ctx, stream, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	id := client.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"k", "v"}}).Val()
	if err := client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c1", Streams: []string{stream, ">"}}).Err(); err != nil {
		t.Fatal(err)
	}
	return id
}

func pending(t *testing.T, client *redis.Client, stream string) int64 {
	p, err := client.XPending(context.Background(), stream, "g").Result()
	if err != nil {
		t.Fatal(err)
	}
	return p.Count
}

// WithAck: the XACK goes with the DONE that completes the record: on the
// module in its round trip (one script, no XACK of its own), on the
// Functions edition right after the DONE; a replay does not send it.
func TestWithAckRunsWithTheDone(t *testing.T) {
	forEachEdition(t, func(t *testing.T, addr string) {
		log := &sentLog{}
		client := redis.NewClient(&redis.Options{Addr: addr})
		defer client.Close()
		client.AddHook(log)
		prefix := fresh("ack")
		i, err := idem.New(client, idem.Options{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		stream := prefix + "stream"
		id := streamEntry(t, client, stream)
		ack := idem.WithAck(idem.AckCmd{Name: "XACK", Keys: []string{stream}, Args: []any{"g", id}})
		work := func(ctx context.Context, job *idem.Job) (int, error) { return 7, nil }
		if _, err := i.Edition(context.Background()); err != nil {
			t.Fatal(err)
		}
		from := log.len()
		out, err := idem.Process(context.Background(), i, "order", work, ack)
		if err != nil || !out.Acked || out.Value != 7 {
			t.Fatalf("Process: %+v, %v", out, err)
		}
		sent := strings.ToUpper(strings.Join(log.since(from), ","))
		if n := pending(t, client, stream); n != 0 {
			t.Errorf("%d entries still pending after the DONE", n)
		}
		if editionOf(t, i) == "module" {
			// EVAL after a NOSCRIPT (the script not cached yet).
			sent = strings.TrimSuffix(sent, ",EVAL")
		}
		want := map[string]string{"module": "IDEM.CLAIM,EVALSHA", "functions": "FCALL IDEM_CLAIM,FCALL IDEM_DONE,XACK"}
		if sent != want[editionOf(t, i)] {
			t.Errorf("sent %s, want %s", sent, want[editionOf(t, i)])
		}
		from = log.len()
		out, err = idem.Process(context.Background(), i, "order", work, ack)
		if err != nil || !out.Replayed || out.Acked {
			t.Fatalf("the replay: %+v, %v", out, err)
		}
		if sent := log.since(from); len(sent) != 1 {
			t.Errorf("the replay sent %v, want its claim only", sent)
		}
		if editionOf(t, i) == "module" { // the script is loaded now: EVALSHA alone
			id2 := client.XAdd(context.Background(), &redis.XAddArgs{Stream: stream, Values: []any{"k", "v"}}).Val()
			client.XReadGroup(context.Background(), &redis.XReadGroupArgs{Group: "g", Consumer: "c1", Streams: []string{stream, ">"}})
			from = log.len()
			out, err = idem.Process(context.Background(), i, "order2", work,
				idem.WithAck(idem.AckCmd{Name: "XACK", Keys: []string{stream}, Args: []any{"g", id2}}))
			if sent := strings.Join(log.since(from), ","); err != nil || !out.Acked || sent != "IDEM.CLAIM,EVALSHA" {
				t.Errorf("second DONE with its ack: %+v, %v, sent %s", out, err, sent)
			}
		}
	})
}

func editionOf(t *testing.T, i *idem.Idem) string {
	ed, err := i.Edition(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return ed.String()
}

// A DONE refused (the lease lapsed and another worker claimed the key)
// runs no ack: the message stays pending for the claim that holds it.
func TestWithAckNotOnALostLease(t *testing.T) {
	forEachEdition(t, func(t *testing.T, addr string) {
		prefix := fresh("ack-lost")
		client := redis.NewClient(&redis.Options{Addr: addr})
		defer client.Close()
		i, err := idem.New(client, idem.Options{Prefix: prefix, Lease: time.Second, Heartbeat: idem.Off})
		if err != nil {
			t.Fatal(err)
		}
		other := newIdem(t, addr, idem.Options{Prefix: prefix, Wait: idem.Off})
		stream := prefix + "stream"
		id := streamEntry(t, client, stream)
		out, err := idem.Process(context.Background(), i, "order", func(ctx context.Context, job *idem.Job) (int, error) {
			time.Sleep(1200 * time.Millisecond) // the lease lapses
			_, err := other.Claim(context.Background(), "order", 30*time.Second, idem.ClaimArgs{})
			return 1, err
		}, idem.WithAck(idem.AckCmd{Name: "XACK", Keys: []string{stream}, Args: []any{"g", id}}))
		if !errors.Is(err, idem.ErrLeaseLost) || out.Acked {
			t.Fatalf("Process: %+v, %v; want ErrLeaseLost, not acked", out, err)
		}
		if n := pending(t, client, stream); n != 1 {
			t.Errorf("%d entries pending, want the one (its new holder's)", n)
		}
	})
}

// WithBeat is called after each heartbeat that extended the job's lease.
func TestWithBeatFollowsTheHeartbeat(t *testing.T) {
	forEachEdition(t, func(t *testing.T, addr string) {
		i := newIdem(t, addr, idem.Options{Prefix: fresh("beat"), Lease: time.Second, Heartbeat: 200 * time.Millisecond})
		var beats atomic.Int64
		_, err := idem.Process(context.Background(), i, "order", func(ctx context.Context, job *idem.Job) (int, error) {
			time.Sleep(900 * time.Millisecond)
			return 1, nil
		}, idem.WithBeat(func(*idem.Job) { beats.Add(1) }))
		if err != nil {
			t.Fatal(err)
		}
		if n, extends := beats.Load(), i.Stats().Extends; n < 3 || uint64(n) != extends {
			t.Errorf("%d beats for %d extends in 900 ms of a 200 ms heartbeat", n, extends)
		}
	})
}

// Check: nil while the lease is known held; once past the lease with no
// EXTEND (a paused process, a late heartbeat), an error before any
// heartbeat found the lease lost, so that an effect is not written late.
func TestCheckPastTheDeadline(t *testing.T) {
	forEachEdition(t, func(t *testing.T, addr string) {
		i := newIdem(t, addr, idem.Options{Prefix: fresh("check"), Lease: time.Second, Heartbeat: idem.Off})
		beating := newIdem(t, addr, idem.Options{Prefix: fresh("check"), Lease: time.Second, Heartbeat: 200 * time.Millisecond})
		var before, after, extended error
		idem.Process(context.Background(), i, "order", func(ctx context.Context, job *idem.Job) (int, error) {
			before = job.Check()
			time.Sleep(1100 * time.Millisecond)
			after = job.Check()
			return 1, nil
		})
		idem.Process(context.Background(), beating, "order", func(ctx context.Context, job *idem.Job) (int, error) {
			time.Sleep(1500 * time.Millisecond)
			extended = job.Check()
			return 1, nil
		})
		if before != nil || !errors.Is(after, idem.ErrLeaseLost) || extended != nil {
			t.Errorf("Check: at the start %v, past the lease %v (want ErrLeaseLost), with heartbeats %v", before, after, extended)
		}
	})
}
