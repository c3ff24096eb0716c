package broker

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	idem "github.com/redis-idem/redis-idem/clients/go"
)

// Each outcome of Process to what the adapters do (docs/clients.md,
// "Consumers of brokers").
func TestDecide(t *testing.T) {
	retry := 2 * time.Second
	cases := []struct {
		name     string
		err      error
		stopping bool
		want     Verdict
		delay    time.Duration
	}{
		{"done", nil, false, Ack, 0},
		{"done, result not stored", &idem.ResultNotStoredError{Key: "k"}, false, Ack, 0},
		{"done, OnDone failed", &idem.HookError{Hook: "on_done", Cause: errors.New("x")}, false, Ack, 0},
		{"OnRun failed", &idem.HookError{Hook: "on_run", Cause: errors.New("x")}, false, HoldBack, retry},
		{"exhausted", &idem.ExhaustedError{Key: "k"}, false, DeadLetter, 0},
		{"mismatch", &idem.MismatchError{Key: "k"}, false, DeadLetter, 0},
		{"no key", MissingKey("no header"), false, DeadLetter, 0},
		{"busy", &idem.BusyError{Key: "k", LeaseLeft: 1500 * time.Millisecond}, false, HoldBack, 1500 * time.Millisecond},
		{"busy, about to end", &idem.BusyError{Key: "k", LeaseLeft: time.Millisecond}, false, HoldBack, MinDelay},
		{"work failed", errors.New("boom"), false, HoldBack, retry},
		{"lease lost", &idem.LeaseLostError{Key: "k"}, false, HoldBack, retry},
		{"DONE unconfirmed", &idem.DoneUnconfirmedError{Key: "k"}, false, HoldBack, retry},
		{"not durable", &idem.NotDurableError{Key: "k", Stage: idem.StageDone}, false, HoldBack, retry},
		{"stopping", fmt.Errorf("claim: %w", context.Canceled), true, Leave, 0},
		{"cancelled, not stopping", context.Canceled, false, HoldBack, retry},
	}
	for _, c := range cases {
		d := Decide(c.err, retry, c.stopping)
		if d.Verdict != c.want || d.Delay != c.delay || d.Err != c.err {
			t.Errorf("%s: %+v, want verdict %d delay %v", c.name, d, c.want, c.delay)
		}
	}
}

func TestBackoff(t *testing.T) {
	got := []time.Duration{Backoff(100*time.Millisecond, 0), Backoff(100*time.Millisecond, 1),
		Backoff(100*time.Millisecond, 4), Backoff(100*time.Millisecond, 40), Backoff(time.Minute, 0)}
	want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 1600 * time.Millisecond, MaxRetryDelay, MaxRetryDelay}
	for n := range got {
		if got[n] != want[n] {
			t.Errorf("Backoff: %v, want %v", got, want)
			break
		}
	}
}
