package idem

import (
	"context"
	"sync"
	"time"
)

// heartbeat is an instance's one timer for every job at work: it does
// nothing until a job has run for a heartbeat, then extends the jobs due,
// pipelined. A job that ends before its first heartbeat costs a map
// insertion and a deletion, no goroutine and no timer of its own.
type heartbeat struct {
	every time.Duration // 0: none
	beat  func(due []*Job)
	mu    sync.Mutex
	jobs  map[*Job]struct{}
	timer *time.Timer
	armed bool
}

func newHeartbeat(every time.Duration, beat func(due []*Job)) *heartbeat {
	return &heartbeat{every: every, beat: beat, jobs: map[*Job]struct{}{}}
}

// add registers jobs that start their work now.
func (h *heartbeat) add(jobs ...*Job) {
	if h.every <= 0 || len(jobs) == 0 {
		return
	}
	due := time.Now().Add(h.every)
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, j := range jobs {
		j.due = due
		h.jobs[j] = struct{}{}
	}
	if !h.armed {
		h.armed = true
		if h.timer == nil {
			h.timer = time.AfterFunc(h.every, h.fire)
		} else {
			h.timer.Reset(h.every)
		}
	}
}

// remove ends the jobs' heartbeat: an EXTEND of theirs still in flight
// changes nothing for them (see has).
func (h *heartbeat) remove(jobs ...*Job) {
	if h.every <= 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, j := range jobs {
		delete(h.jobs, j)
	}
}

// has: the job is still at work.
func (h *heartbeat) has(job *Job) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.jobs[job]
	return ok
}

// fire extends the jobs due, then sleeps until the next one is due (or
// until a job is added, when none is left).
func (h *heartbeat) fire() {
	now := time.Now()
	h.mu.Lock()
	var due []*Job
	for j := range h.jobs {
		if !j.due.After(now) {
			due = append(due, j)
		}
	}
	h.mu.Unlock()
	if len(due) > 0 {
		h.beat(due)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	now = time.Now()
	var next time.Time
	for j := range h.jobs {
		if !j.due.After(now) {
			j.due = now.Add(h.every)
		}
		if next.IsZero() || j.due.Before(next) {
			next = j.due
		}
	}
	if next.IsZero() {
		h.armed = false
		return
	}
	h.timer.Reset(max(next.Sub(now), time.Millisecond))
}

// beat sends the due jobs' EXTENDs in one pipeline. A connection error:
// the next beat tries again.
func (i *Idem) beat(due []*Job) {
	ed := i.core.edition()
	cmds := make([][]any, len(due))
	keys := make([]string, len(due))
	for n, job := range due {
		cmds[n] = i.core.keyCmd(ed, "IDEM.EXTEND", "idem_extend", job.key, job.token, i.core.leaseSecs)
		keys[n] = job.key
	}
	ctx, cancel := context.WithTimeout(context.Background(), i.core.lease)
	defer cancel()
	sent := time.Now()
	for n, r := range i.roundTrip(ctx, cmds, keys, false, false) {
		if r.err == nil {
			due[n].heldFrom(sent, i.core.lease)
		}
		i.core.onExtend(due[n], r.err, i.beats.has(due[n]))
	}
}
