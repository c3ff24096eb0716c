//! The heartbeat's bookkeeping, without I/O: one per instance, for all of
//! its jobs. A job running costs an entry in a map (added before the work,
//! removed after it); the instance's one thread (sync) or task (tokio)
//! wakes every half `heartbeat` and EXTENDs only the jobs that have run
//! for `heartbeat` since their claim or their latest extension. Short work
//! never meets it; nothing is spawned per message.
use crate::cmd::{self, Edition};
use crate::options::Job;
use crate::ride::Ride;
use redis::Cmd;
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

struct Beat {
    job: Job,
    token: String,
    due: Instant,
    /// What rides with each EXTEND (a broker adapter's; none by default).
    ride: Ride,
}

/// One EXTEND due now.
pub(crate) struct Due {
    pub id: u64,
    pub job: Job,
    pub extend: Cmd,
    /// The job's [`Ride::with_extend`] commands, to send with `extend`.
    pub ride: Ride,
}

pub(crate) struct Beats {
    every: Duration,
    jobs: Mutex<HashMap<u64, Beat>>,
    next: AtomicU64,
    started: AtomicBool,
}

/// The entries one call added; removed with [`Beats::remove`].
#[derive(Debug, Default)]
pub(crate) struct Ticket(Vec<u64>);

impl Beats {
    pub fn new(every: Duration) -> Beats {
        Beats { every, jobs: Mutex::new(HashMap::new()), next: AtomicU64::new(0), started: AtomicBool::new(false) }
    }

    /// How often the instance's thread or task looks for due beats.
    pub fn tick(&self) -> Duration {
        (self.every / 2).max(Duration::from_millis(1))
    }

    /// Adds the jobs; true the first time, when the caller starts the
    /// instance's thread or task. Without a heartbeat, nothing.
    /// `ride`'s `with_extend` goes with each of their EXTENDs.
    pub fn add<'a>(&self, jobs: impl IntoIterator<Item = (&'a Job, &'a str)>, ride: &Ride) -> (Ticket, bool) {
        if self.every.is_zero() {
            return (Ticket::default(), false);
        }
        let due = Instant::now() + self.every;
        let mut ids = Vec::new();
        if let Ok(mut map) = self.jobs.lock() {
            for (job, token) in jobs {
                let id = self.next.fetch_add(1, Ordering::Relaxed);
                map.insert(id, Beat { job: job.clone(), token: token.to_string(), due, ride: ride.for_extend() });
                ids.push(id);
            }
        }
        let start = !ids.is_empty() && !self.started.swap(true, Ordering::Relaxed);
        (Ticket(ids), start)
    }

    /// The work ended: its jobs are not extended any more.
    pub fn remove(&self, ticket: Ticket) {
        if ticket.0.is_empty() {
            return;
        }
        if let Ok(mut map) = self.jobs.lock() {
            for id in ticket.0 {
                map.remove(&id);
            }
        }
    }

    /// One job found lost: not extended any more.
    pub fn forget(&self, id: u64) {
        if let Ok(mut map) = self.jobs.lock() {
            map.remove(&id);
        }
    }

    /// The EXTENDs due now (each job's next one moved on by `heartbeat`).
    pub fn due(&self, edition: Edition, lease: Duration) -> Vec<Due> {
        let now = Instant::now();
        let Ok(mut map) = self.jobs.lock() else { return Vec::new() };
        map.iter_mut()
            .filter(|(_, beat)| beat.due <= now)
            .filter_map(|(id, beat)| {
                beat.due = now + self.every;
                let extend = cmd::extend(edition, &beat.job.record, &beat.token, lease).ok()?;
                Some(Due { id: *id, job: beat.job.clone(), extend, ride: beat.ride.clone() })
            })
            .collect()
    }
}
