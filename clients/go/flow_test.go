package idem

// The decisions that need no server: batch planning, the polling backoff,
// DONE's codes, the whole-seconds rule, what a claim's answer means and
// how a work's value is settled, each from the replies given.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestBatchesChunkAndKeepKeyOrder(t *testing.T) {
	keys := make([]string, 2*MaxBatch+1)
	for j := range keys {
		keys[j] = fmt.Sprint(j)
	}
	groups := batches(keys, false, nil)
	if len(groups) != 3 || len(groups[0]) != MaxBatch || len(groups[1]) != MaxBatch || len(groups[2]) != 1 {
		t.Fatalf("%d groups", len(groups))
	}
	if flat := slices.Concat(groups...); !slices.IsSorted(flat) || len(flat) != len(keys) {
		t.Error("the groups are not the keys in order")
	}
	if len(batches(nil, true, nil)) != 0 {
		t.Error("no keys, no batch")
	}
}

func TestBatchesBySlotAndClass(t *testing.T) {
	keys := []string{"{a}1", "{b}1", "{a}2", "{a}3", "{b}2"}
	got := batches(keys, true, func(j int) int { return j % 2 })
	// By (slot, class), in the order of each group's first key: {a}1 and
	// {a}2 share slot and class 0; {a}3 is class 1; {b}1 class 1, {b}2 class 0.
	want := [][]int{{0, 2}, {1}, {3}, {4}}
	if !slices.EqualFunc(got, want, slices.Equal[[]int]) {
		t.Errorf("got %v, want %v", got, want)
	}
	if got := batches(keys, false, nil); len(got) != 1 {
		t.Errorf("one server: one batch, got %v", got)
	}
}

func TestBackoffPauses(t *testing.T) {
	var b backoff
	last := time.Duration(0)
	for n := range 12 {
		p := b.pause(time.Hour, time.Hour)
		ceiling := min(10*time.Millisecond<<n, time.Second)
		if p > ceiling || p < ceiling/2 {
			t.Errorf("pause %d: %v, want within [%v, %v]", n, p, ceiling/2, ceiling)
		}
		last = p
	}
	if last < 500*time.Millisecond {
		t.Errorf("it did not reach 1 s: %v", last)
	}
	if p := b.pause(30*time.Millisecond, time.Hour); p > 30*time.Millisecond {
		t.Errorf("past the holder's lease end: %v", p)
	}
	if p := b.pause(time.Hour, 5*time.Millisecond); p > 5*time.Millisecond {
		t.Errorf("past the deadline: %v", p)
	}
}

func TestDoneCodes(t *testing.T) {
	for _, c := range []struct {
		code                       DoneCode
		completed, result, bloomed bool
	}{{0, false, false, false}, {1, true, false, false}, {3, true, true, false}, {5, true, false, true}, {7, true, true, true}} {
		if c.code.Completed() != c.completed || c.code.ResultDropped() != c.result || c.code.BloomDropped() != c.bloomed {
			t.Errorf("%d decoded wrong", c.code)
		}
	}
}

func TestWholeSeconds(t *testing.T) {
	for d, ok := range map[time.Duration]bool{time.Second: true, 30 * time.Second: true, 0: false, 1500 * time.Millisecond: false, -time.Second: false} {
		if _, err := seconds("lease", d); (err == nil) != ok {
			t.Errorf("%v: %v", d, err)
		}
	}
	if _, err := New(nil, Options{Lease: 2500 * time.Millisecond}); err == nil {
		t.Error("New took a lease of 2.5 s")
	}
}

func TestWaitPieces(t *testing.T) {
	for _, c := range []struct{ readTimeout, left, want time.Duration }{
		{5 * time.Second, 10 * time.Second, 4 * time.Second},
		{5 * time.Second, time.Second, time.Second},
		{time.Second, 10 * time.Second, 500 * time.Millisecond},
		{0, time.Hour, time.Hour},
	} {
		c0 := &core{settings: settings{readTimeout: c.readTimeout}}
		if got := c0.waitPiece(c.left); got != c.want {
			t.Errorf("read timeout %v, %v left: %v, want %v", c.readTimeout, c.left, got, c.want)
		}
	}
}

func testCore(s settings) *core {
	if s.codec == nil {
		s.codec = JSONCodec{}
	}
	if s.doneRetries == 0 {
		s.doneRetries = 5
	}
	c := &core{settings: s}
	c.ed.Store(int32(EditionModule))
	return c
}

var errConn = errors.New("connection reset")

func TestSettleResendsThenUnconfirmed(t *testing.T) {
	c := testCore(settings{})
	job := &Job{key: "k", token: "t", attempt: 1}
	s, n := c.startSettle(job, "v")
	sends := 0
	var pauses []time.Duration
	for n.send {
		sends++
		pauses = append(pauses, n.pause)
		n = c.onDone(s, 0, errConn, acked{})
	}
	var unconfirmed *DoneUnconfirmedError
	if !n.finished || !errors.As(n.err, &unconfirmed) || unconfirmed.Result != "v" {
		t.Fatalf("after %d sends: %+v", sends, n)
	}
	if sends != 6 || !slices.Equal(pauses, []time.Duration{0, 50 * time.Millisecond, 100 * time.Millisecond,
		200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond}) {
		t.Errorf("%d sends, pauses %v", sends, pauses)
	}
	if st := c.stats.completed.Load(); st != 0 {
		t.Errorf("an unconfirmed DONE counted as completed: %d", st)
	}
}

func TestSettleResentZeroIsCheckedWithGet(t *testing.T) {
	for _, own := range []bool{true, false} {
		c := testCore(settings{})
		job := &Job{key: "k", token: "t", attempt: 2}
		s, _ := c.startSettle(job, 7)
		n := c.onDone(s, 0, errConn, acked{})
		if !n.send || n.pause != 50*time.Millisecond {
			t.Fatalf("a lost reply: %+v", n)
		}
		if n = c.onDone(s, 0, nil, acked{}); !n.get {
			t.Fatalf("0 to a resent DONE: %+v, want a GET", n)
		}
		rec := &Record{State: StateDone, Attempt: 2, Result: []byte("7")}
		if !own {
			rec.Attempt = 3
		}
		n = c.onChecked(s, rec, nil)
		if own && (!n.finished || n.err != nil || !n.stored || c.stats.completed.Load() != 1) {
			t.Errorf("its own completion: %+v", n)
		}
		if !own && (!errors.Is(n.err, ErrLeaseLost) || c.stats.leasesLost.Load() != 1 || c.stats.completed.Load() != 0) {
			t.Errorf("another's completion: %+v", n)
		}
	}
}

func TestSettleFirstZeroOrStaleIsLeaseLost(t *testing.T) {
	for _, err := range []error{nil, &ServerError{Kind: KindStale, Message: "STALE"}} {
		c := testCore(settings{})
		s, _ := c.startSettle(&Job{key: "k", token: "t", attempt: 1}, 1)
		if n := c.onDone(s, 0, err, acked{}); !n.finished || !errors.Is(n.err, ErrLeaseLost) {
			t.Errorf("%v: %+v", err, n)
		}
	}
}

func TestSettleOversizeAndOtherErrors(t *testing.T) {
	for _, policy := range []Oversize{OversizeComplete, OversizeError} {
		c := testCore(settings{oversize: policy})
		s, _ := c.startSettle(&Job{key: "k", token: "t", attempt: 1}, "big")
		n := c.onDone(s, 0, &ServerError{Kind: KindResultTooLarge, Message: "ERR RESULT is larger than idem.max-result"}, acked{})
		if !n.send || s.doneItem().Result != nil {
			t.Fatalf("too large: %+v, want DONE without RESULT", n)
		}
		n = c.onDone(s, 1, nil, acked{})
		if !n.finished || n.stored || c.stats.resultsDropped.Load() != 1 || c.stats.completed.Load() != 1 {
			t.Errorf("%v: %+v", policy, n)
		}
		if got := errors.Is(n.err, ErrResultNotStored); got != (policy == OversizeError) {
			t.Errorf("%v: error %v", policy, n.err)
		}
	}
	c := testCore(settings{})
	s, _ := c.startSettle(&Job{key: "k", token: "t", attempt: 1}, 1)
	wrong := &ServerError{Kind: KindWrongType, Message: "WRONGTYPE"}
	if n := c.onDone(s, 0, wrong, acked{}); !n.finished || n.err != wrong || c.stats.completed.Load() != 0 {
		t.Errorf("WRONGTYPE to DONE: %+v, want that error and no completion", n)
	}
	s, _ = c.startSettle(&Job{key: "k", token: "t", attempt: 1}, make(chan int))
	if s.doneItem().Result != nil || s.dropped != "unserializable" {
		t.Errorf("an unencodable value: %+v", s)
	}
}

func TestSettleNotDurable(t *testing.T) {
	c := testCore(settings{durable: &Durable{Replicas: 2, Timeout: time.Second}})
	s, _ := c.startSettle(&Job{key: "k", token: "t", attempt: 1}, "v")
	n := c.onDone(s, 1, nil, acked{replicas: 1})
	var nd *NotDurableError
	if !errors.As(n.err, &nd) || nd.Stage != StageDone || nd.Acknowledged != 1 || nd.Result != "v" ||
		c.stats.completed.Load() != 1 || c.stats.notDurable.Load() != 1 {
		t.Errorf("%+v %+v", n, nd)
	}
}

// A replay under durable waits for its replicas too (docs/clients.md,
// Durability): fewer is NotDurable at the done stage, with nothing to release.
func TestReplayNotDurable(t *testing.T) {
	ctx := context.Background()
	c := testCore(settings{durable: &Durable{Replicas: 1}})
	a := c.startAcquire(ctx, "k")
	done := ClaimReply{Status: StatusDone, Attempt: 1, Result: []byte(`"v"`)}
	st := c.onClaim(&a, done, nil, acked{replicas: 0})
	var nd *NotDurableError
	if !errors.As(st.err, &nd) || nd.Stage != StageDone || st.release || st.replay ||
		c.stats.replays.Load() != 0 || c.stats.notDurable.Load() != 1 {
		t.Errorf("a replay not acknowledged: %+v %+v", st, nd)
	}
	if st := c.onClaim(&a, done, nil, acked{replicas: 1}); st.err != nil || !st.replay || c.stats.replays.Load() != 1 {
		t.Errorf("a replay acknowledged: %+v", st)
	}
}

func TestOnClaimDecisions(t *testing.T) {
	ctx := context.Background()
	c := testCore(settings{wait: time.Second, durable: &Durable{Replicas: 1}})
	a := c.startAcquire(ctx, "k")
	granted := ClaimReply{Status: StatusNew, Token: "t", Attempt: 1}
	if st := c.onClaim(&a, granted, nil, acked{replicas: 0}); !st.release || !errors.Is(st.err, ErrNotDurable) ||
		c.stats.firstRuns.Load() != 0 || c.stats.notDurable.Load() != 1 {
		t.Errorf("not acknowledged: %+v", st)
	}
	if st := c.onClaim(&a, granted, nil, acked{replicas: 1}); st.job == nil || c.stats.firstRuns.Load() != 1 {
		t.Errorf("acknowledged: %+v", st)
	}
	busy := ClaimReply{Status: StatusBusy, LeaseLeft: time.Minute}
	for range 3 {
		if st := c.onClaim(&a, busy, nil, acked{}); !st.again || st.wait <= 0 {
			t.Errorf("busy with time left: %+v", st)
		}
	}
	if c.stats.waits.Load() != 1 {
		t.Errorf("waits %d, want 1", c.stats.waits.Load())
	}
	var unblocked redis.Error = replyErr("UNBLOCKED client unblocked via CLIENT UNBLOCK")
	if st := c.onClaim(&a, ClaimReply{}, unblocked, acked{}); !st.again || st.pause <= 0 {
		t.Errorf("UNBLOCKED: %+v", st)
	}
	a.deadline = time.Now()
	if st := c.onClaim(&a, busy, nil, acked{}); !errors.Is(st.err, ErrBusy) || c.stats.busy.Load() != 1 {
		t.Errorf("busy at the end: %+v", st)
	}
	if st := c.onClaim(&a, ClaimReply{}, unblocked, acked{}); st.again || st.err != unblocked {
		t.Errorf("UNBLOCKED with no time left: %+v", st)
	}
	if st := c.onClaim(&a, ClaimReply{Status: StatusMismatch}, nil, acked{}); !errors.Is(st.err, ErrMismatch) {
		t.Errorf("mismatch: %+v", st)
	}
}

func TestReleasedIsCountedOnlyWhenGivenUp(t *testing.T) {
	calls := 0
	c := testCore(settings{hooks: Hooks{OnRelease: func(*Job, error) { calls++ }}})
	c.released(&Job{}, false, errConn)
	c.released(&Job{}, true, errConn)
	if c.stats.released.Load() != 1 || calls != 2 {
		t.Errorf("released %d, hook calls %d", c.stats.released.Load(), calls)
	}
}

// replyErr is an error answer of the server, as go-redis gives one.
type replyErr string

func (e replyErr) Error() string { return string(e) }
func (replyErr) RedisError()     {}
