package idem

// The decisions that need no server: batch planning, the polling backoff,
// DONE's codes, the whole-seconds rule.

import (
	"fmt"
	"slices"
	"testing"
	"time"
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
		i := &Idem{readTimeout: c.readTimeout}
		if got := i.waitPiece(c.left); got != c.want {
			t.Errorf("read timeout %v, %v left: %v, want %v", c.readTimeout, c.left, got, c.want)
		}
	}
}
