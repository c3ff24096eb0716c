package idem

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Idem runs the consumer loop and the typed commands on one client. It is
// safe for concurrent use; make one per process (or per settings) and
// share it: its heartbeat timer and its batches are per instance.
type Idem struct {
	client redis.UniversalClient
	opts   Options // as given: the middleware derives its own from them
	core   *core
	beats  *heartbeat
	claims *coalescer[claimItem, claimAnswer] // nil: Batch off
	dones  *coalescer[DoneItem, doneAnswer]   // nil: Batch off
	edMu   sync.Mutex
	// blocking holds a place for each claim blocked in WAIT.
	blocking chan struct{}
}

// New makes an Idem on a go-redis client: a single server
// (*redis.Client), a cluster (*redis.ClusterClient), or a Sentinel
// failover client (redis.NewFailoverClient, redis.NewFailoverClusterClient).
// It sends nothing: the edition is asked at the first command (unless
// Options.Edition names it). Its only error is an invalid option.
func New(client redis.UniversalClient, opts Options) (*Idem, error) {
	s, err := resolve(client, opts)
	if err != nil {
		return nil, err
	}
	i := &Idem{client: client, opts: opts, core: &core{settings: s}, blocking: make(chan struct{}, s.blockers)}
	i.core.ed.Store(int32(opts.Edition))
	i.beats = newHeartbeat(s.heartbeat, i.beat)
	if s.batch {
		i.claims = &coalescer[claimItem, claimAnswer]{round: i.claimRound}
		i.dones = &coalescer[DoneItem, doneAnswer]{round: i.doneRound}
	}
	return i, nil
}

// Stats is a snapshot of the counters.
func (i *Idem) Stats() Stats {
	c := &i.core.stats
	return Stats{
		FirstRuns: c.firstRuns.Load(), Retries: c.retries.Load(), Replays: c.replays.Load(),
		Waits: c.waits.Load(), Busy: c.busy.Load(), Completed: c.completed.Load(),
		Released: c.released.Load(), LeasesLost: c.leasesLost.Load(),
		ResultsDropped: c.resultsDropped.Load(), Mismatches: c.mismatches.Load(),
		Exhausted: c.exhausted.Load(), Extends: c.extends.Load(), NotDurable: c.notDurable.Load(),
	}
}

// Prefix is the instance's key prefix.
func (i *Idem) Prefix() string { return i.core.prefix }

// Owner is the OWNER this instance's claims carry.
func (i *Idem) Owner() string { return i.core.owner }

// Options are the options the instance was made with, as given (New
// fills the defaults in itself): an Idem of other settings on the same
// client is New(i.Client(), o) with o changed.
func (i *Idem) Options() Options { return i.opts }

// Client is the go-redis client the instance sends its commands on.
func (i *Idem) Client() redis.UniversalClient { return i.client }

// Lease is the lease of the instance's claims.
func (i *Idem) Lease() time.Duration { return i.core.lease }

// MaxTries is the instance's MaxTries (0: no limit).
func (i *Idem) MaxTries() int { return i.core.maxTries }

// Edition is the edition the server has, asked once (COMMAND INFO
// IDEM.CLAIM, then FCALL_RO idem_edition 0) and kept: the module when it
// has both.
func (i *Idem) Edition(ctx context.Context) (Edition, error) {
	if ed := i.core.edition(); ed != EditionAuto {
		return ed, nil
	}
	i.edMu.Lock()
	defer i.edMu.Unlock()
	if ed := i.core.edition(); ed != EditionAuto {
		return ed, nil
	}
	info, err := i.client.Do(ctx, "COMMAND", "INFO", "IDEM.CLAIM").Slice()
	if err != nil {
		return EditionAuto, err
	}
	ed := EditionModule
	if len(info) != 1 || info[0] == nil {
		if err := i.client.Do(ctx, "FCALL_RO", "idem_edition", 0).Err(); err != nil {
			if strings.Contains(strings.ToLower(err.Error()), "function not found") {
				return EditionAuto, &ServerError{Kind: KindNotInstalled, Message: ErrNotInstalled.Error()}
			}
			return EditionAuto, err
		}
		ed = EditionFunctions
	}
	i.core.ed.Store(int32(ed))
	return ed, nil
}
