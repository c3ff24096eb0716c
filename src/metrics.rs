//! `INFO idem`: one counter per reply kind.

use std::cell::Cell;

macro_rules! metrics {
    ($($variant:ident => $name:literal,)*) => {
        #[derive(Clone, Copy)]
        pub enum Metric { $($variant,)* }
        const NAMES: &[&str] = &[$($name,)*];
    };
}

metrics! {
    ClaimNew => "claim_new",
    ClaimSeen => "claim_seen",
    ClaimMismatch => "claim_mismatch",
    ClaimDone => "claim_done",
    ClaimBusy => "claim_busy",
    ClaimExhausted => "claim_exhausted",
    ClaimRetry => "claim_retry",
    DoneCompleted => "done_completed",
    DoneAlready => "done_already",
    DoneStale => "done_stale",
    DoneResultDropped => "done_result_dropped",
    DoneBloomDropped => "done_bloom_dropped",
    ReleaseOk => "release_ok",
    ReleaseMiss => "release_miss",
    ExtendOk => "extend_ok",
    ExtendStale => "extend_stale",
    OnceNew => "once_new",
    OnceExists => "once_exists",
    BfAddNew => "bf_add_new",
    BfAddSeen => "bf_add_seen",
    BfExistsHit => "bf_exists_hit",
    BfExistsMiss => "bf_exists_miss",
    WaitStarted => "wait_started",
    WaitDone => "wait_done",
    WaitClaimed => "wait_claimed",
    WaitTimeout => "wait_timeout",
    WaitUnblocked => "wait_unblocked",
    WaitRefused => "wait_refused",
    RequeueOk => "requeue_ok",
    RequeueMiss => "requeue_miss",
    RequeueBusy => "requeue_busy",
}

thread_local! {
    /// Commands and INFO both run on Redis's main thread: plain cells, no
    /// atomic read-modify-write on the hot path.
    static COUNTERS: [Cell<u64>; NAMES.len()] = const { [const { Cell::new(0) }; NAMES.len()] };
}

pub fn count(metric: Metric) {
    COUNTERS.with(|counters| {
        let counter = &counters[metric as usize];
        counter.set(counter.get() + 1);
    });
}

/// The `INFO idem` fields: each counter's name and value.
pub fn fields(field: &mut dyn FnMut(&str, u64)) {
    COUNTERS.with(|counters| {
        for (name, counter) in NAMES.iter().zip(counters) {
            field(name, counter.get());
        }
    });
}
