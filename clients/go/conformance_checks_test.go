package idem_test

// What the conformance runner compares: a step's outcome with its expect.

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"

	idem "github.com/redis-idem/redis-idem/clients/go"
)

// errName is the error's name in docs/clients.md's table, "Work" for the
// work's own.
func errName(err error) string {
	for _, e := range []struct {
		name string
		err  error
	}{
		{"Hook", idem.ErrHook}, {"ResultNotStored", idem.ErrResultNotStored}, {"Busy", idem.ErrBusy},
		{"Mismatch", idem.ErrMismatch}, {"Exhausted", idem.ErrExhausted}, {"LeaseLost", idem.ErrLeaseLost},
		{"DoneUnconfirmed", idem.ErrDoneUnconfirmed}, {"Stale", idem.ErrStale}, {"WrongType", idem.ErrWrongType},
		{"ResultTooLarge", idem.ErrResultTooLarge}, {"ModuleRequired", idem.ErrModuleRequired},
		{"NotInstalled", idem.ErrNotInstalled}, {"NotDurable", idem.ErrNotDurable}, {"LiveLease", idem.ErrLiveLease},
	} {
		if errors.Is(err, e.err) {
			return e.name
		}
	}
	return "Work"
}

func errResult(err error) any {
	var hook *idem.HookError
	var notStored *idem.ResultNotStoredError
	var unconfirmed *idem.DoneUnconfirmedError
	var notDurable *idem.NotDurableError
	switch {
	case errors.As(err, &hook):
		return hook.Result
	case errors.As(err, &notStored):
		return notStored.Result
	case errors.As(err, &unconfirmed):
		return unconfirmed.Result
	case errors.As(err, &notDurable):
		return notDurable.Result
	}
	return nil
}

// jsonEqual compares two values as JSON values.
func jsonEqual(a, b any) bool {
	norm := func(v any) any {
		data, err := json.Marshal(v)
		if err != nil {
			return fmt.Sprintf("unencodable %T", v)
		}
		var out any
		_ = json.Unmarshal(data, &out)
		return out
	}
	return reflect.DeepEqual(norm(a), norm(b))
}

func (r *runner) checkError(at string, e map[string]any, err error) {
	want, ok := e["error"]
	switch {
	case !ok && err != nil:
		r.t.Errorf("%s: unexpected error %v", at, err)
	case ok && err == nil:
		r.t.Errorf("%s: no error, want %v", at, want)
	case ok && errName(err) != want:
		r.t.Errorf("%s: error %s (%v), want %v", at, errName(err), err, want)
	case ok && want == "Work" && e["message"] != nil && err.Error() != e["message"]:
		r.t.Errorf("%s: message %q, want %q", at, err.Error(), e["message"])
	}
}

func (r *runner) checkCall(at string, e map[string]any, c *bgCall) {
	r.checkError(at, e, c.err)
	for k, want := range e {
		var got any
		switch k {
		case "error", "message":
			continue
		case "value":
			got = c.res.Value
			if _, ok := got.(charge); c.typed && !ok {
				r.t.Errorf("%s: a typed call's value is a %T, not a charge", at, got)
			}
		case "replayed":
			got = c.res.Replayed
		case "status":
			got = string(c.res.Status)
		case "attempt":
			got = float64(c.res.Attempt)
		case "result_stored":
			got = c.res.ResultStored
		case "ran":
			got = c.w.ran
		case "lost_seen":
			got = c.w.lostSeen
		case "job_key":
			got = c.w.jobKey
		case "owner":
			var busy *idem.BusyError
			if !errors.As(c.err, &busy) {
				r.t.Errorf("%s: owner of %v, want a Busy", at, c.err)
				continue
			}
			got = nullable(busy.Owner)
		case "stage":
			var nd *idem.NotDurableError
			if !errors.As(c.err, &nd) {
				r.t.Errorf("%s: stage of %v, want a NotDurable", at, c.err)
				continue
			}
			got = string(nd.Stage)
		case "error_result":
			got = errResult(c.err)
		case "lease_left_ms_min":
			var busy *idem.BusyError
			if !errors.As(c.err, &busy) || busy.LeaseLeft < ms(want) {
				r.t.Errorf("%s: lease left %v, want at least %v ms", at, busy, want)
			}
			continue
		default:
			r.t.Fatalf("%s: unknown expectation %s", at, k)
		}
		if !jsonEqual(got, want) {
			r.t.Errorf("%s: %s = %v, want %v (the call's error: %v)", at, k, got, want, c.err)
		}
	}
}

func (r *runner) checkItem(at string, e map[string]any, it idem.BatchItem[any]) {
	if _, ok := e["error"]; ok || it.Status == idem.BatchFailed || it.Status == idem.BatchError {
		r.checkError(at, e, it.Err)
	}
	for k, want := range e {
		var got any
		switch k {
		case "error", "message":
			continue
		case "key":
			got = it.Key
		case "status":
			got = string(it.Status)
		case "value":
			got = it.Value
		case "attempt":
			got = float64(it.Attempt)
		case "result_stored":
			got = it.ResultStored
		default:
			r.t.Fatalf("%s: unknown expectation %s", at, k)
		}
		if !jsonEqual(got, want) {
			r.t.Errorf("%s: %s = %v, want %v", at, k, got, want)
		}
	}
}

func (r *runner) checkClaim(at string, e map[string]any, reply idem.ClaimReply) {
	r.checkError(at, e, reply.Err)
	if want, ok := e["status"]; ok && string(reply.Status) != want {
		r.t.Errorf("%s: status %s, want %v", at, reply.Status, want)
	}
	if want, ok := e["attempt"]; ok && float64(reply.Attempt) != want {
		r.t.Errorf("%s: attempt %d, want %v", at, reply.Attempt, want)
	}
}

func (r *runner) checkDone(at string, e map[string]any, a idem.DoneAnswer) {
	r.checkError(at, e, a.Err)
	if want, ok := e["completed"]; ok && a.Code.Completed() != want {
		r.t.Errorf("%s: completed %v (%d), want %v", at, a.Code.Completed(), a.Code, want)
	}
}

func (r *runner) settleMany(at string, s map[string]any) {
	var done []idem.DoneItem
	var release []idem.ReleaseItem
	for _, raw := range s["items"].([]any) {
		it := raw.([]any)
		key, token := it[0].(string), r.token(it[1].(string))
		d := idem.DoneItem{Key: key, Token: token}
		if len(it) > 2 {
			d.Result = []byte(it[2].(string))
		}
		done, release = append(done, d), append(release, idem.ReleaseItem{Key: key, Token: token})
	}
	exp, _ := s["expect"].([]any)
	if s["op"] == "done_many" {
		answers, err := r.i.DoneMany(r.ctx, done, 0)
		if err != nil {
			r.t.Fatalf("%s: %v", at, err)
		}
		for n, e := range exp {
			r.checkDone(fmt.Sprintf("%s item %d", at, n), e.(map[string]any), answers[n])
		}
		return
	}
	answers, err := r.i.ReleaseMany(r.ctx, release)
	if err != nil {
		r.t.Fatalf("%s: %v", at, err)
	}
	for n, e := range exp {
		if want := e.(map[string]any)["released"]; want != nil && answers[n].Released != want {
			r.t.Errorf("%s item %d: released %v, want %v", at, n, answers[n].Released, want)
		}
	}
}

func (r *runner) checkGet(at string, expect any, rec *idem.Record) {
	if expect == nil {
		if rec != nil {
			r.t.Errorf("%s: a record %+v, want none", at, rec)
		}
		return
	}
	if rec == nil {
		r.t.Fatalf("%s: no record, want %v", at, expect)
	}
	for k, want := range expect.(map[string]any) {
		var got any
		switch k {
		case "state":
			got = string(rec.State)
		case "attempt":
			got = float64(rec.Attempt)
		case "result":
			if rec.Result != nil {
				got = string(rec.Result)
			}
		case "owner":
			got = nullable(rec.Owner)
			if want == "$default" {
				want = defaultOwner()
			}
		default:
			r.t.Fatalf("%s: unknown field %s", at, k)
		}
		if got != want {
			r.t.Errorf("%s: %s = %v, want %v", at, k, got, want)
		}
	}
}

func (r *runner) checkStats(want map[string]any) {
	s := r.i.Stats()
	got := map[string]uint64{
		"first_runs": s.FirstRuns, "retries": s.Retries, "replays": s.Replays, "waits": s.Waits,
		"busy": s.Busy, "completed": s.Completed, "released": s.Released, "leases_lost": s.LeasesLost,
		"results_dropped": s.ResultsDropped, "mismatches": s.Mismatches, "exhausted": s.Exhausted,
		"not_durable": s.NotDurable,
	}
	for name := range want {
		if _, ok := got[name]; !ok && name != "extends_min" {
			r.t.Errorf("stats: unknown counter %s", name)
		}
	}
	for name, n := range got {
		w, _ := want[name].(float64)
		if float64(n) != w {
			r.t.Errorf("stats: %s = %d, want %v (all: %+v)", name, n, w, s)
		}
	}
	if min, ok := want["extends_min"].(float64); ok && float64(s.Extends) < min {
		r.t.Errorf("stats: extends = %d, want at least %v", s.Extends, min)
	}
}

// nullable is a text the library gives as "" for none, as JSON's null.
func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// defaultOwner is docs/clients.md's default OWNER of this process.
func defaultOwner() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s:%d", host, os.Getpid())
}
