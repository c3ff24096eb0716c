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
	boom := errors.New("boom")
	cases := []struct {
		name     string
		err      error
		failed   error // the handler's own
		stopping bool
		want     Verdict
		delay    time.Duration
		report   bool
	}{
		{"done", nil, nil, false, Ack, 0, false},
		{"done, result not stored", &idem.ResultNotStoredError{Key: "k"}, nil, false, Ack, 0, false},
		{"done, OnDone failed", &idem.HookError{Hook: "on_done", Cause: errors.New("x")}, nil, false, Ack, 0, false},
		{"OnRun failed", &idem.HookError{Hook: "on_run", Cause: errors.New("x")}, nil, false, HoldBack, retry, true},
		{"exhausted", &idem.ExhaustedError{Key: "k"}, nil, false, DeadLetter, 0, false},
		{"mismatch", &idem.MismatchError{Key: "k"}, nil, false, DeadLetter, 0, false},
		{"no key", MissingKey("no header"), nil, false, DeadLetter, 0, false},
		{"busy", &idem.BusyError{Key: "k", LeaseLeft: 1500 * time.Millisecond}, nil, false, HoldBack, 1500 * time.Millisecond, false},
		{"busy, about to end", &idem.BusyError{Key: "k", LeaseLeft: time.Millisecond}, nil, false, HoldBack, MinDelay, false},
		{"work failed", boom, boom, false, HoldBack, retry, false},
		{"the server refused the claim", errors.New("NOPERM no permissions to run the 'idem.claim' command"), nil, false, HoldBack, retry, true},
		{"the server refused DONE after the work", errors.New("WRONGTYPE"), nil, false, HoldBack, retry, true},
		{"lease lost", &idem.LeaseLostError{Key: "k"}, nil, false, HoldBack, retry, false},
		{"DONE unconfirmed", &idem.DoneUnconfirmedError{Key: "k"}, nil, false, HoldBack, retry, false},
		{"not durable", &idem.NotDurableError{Key: "k", Stage: idem.StageDone}, nil, false, HoldBack, retry, false},
		{"stopping", fmt.Errorf("claim: %w", context.Canceled), nil, true, Leave, 0, false},
		{"cancelled, not stopping", context.Canceled, nil, false, HoldBack, retry, true},
	}
	for _, c := range cases {
		d := Decide(c.err, c.failed, retry, c.stopping)
		if d.Verdict != c.want || d.Delay != c.delay || d.Err != c.err || d.Report != c.report {
			t.Errorf("%s: %+v, want verdict %d delay %v report %v", c.name, d, c.want, c.delay, c.report)
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
