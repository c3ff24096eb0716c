//! What operators do to a server with waiters on it: pause writes (`CLIENT
//! PAUSE ... WRITE`, `FAILOVER` with a lagging replica) while a lease lapses
//! or the sweeper has old shards to drop; delete, expire and flush records
//! that clients wait on; and hold thousands of waiters (their memory, the
//! `idem.max-waiters` cap). On every server `make test` runs: the same
//! answers everywhere.
#[allow(dead_code)] // each test binary uses part of common/
mod common;

use common::clock::{align_to_boundary, in_slot, sleep_until, with_retries};
use common::commands::{
    bf_add, bf_info, claim_new, claim_opts, digest, done, get_fields, idem_counters, reserve, server_ms,
};
use common::fixtures::NONE;
use common::reply::{as_bytes, as_int, as_token, f_int, f_str};
use common::server::{Server, Shutdown, aof_args, blocked_clients, wait_replicas};
use common::waiters::{claimed, waiter};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

/// A primary with an AOF (Redis 7.0 propagates to it even without a
/// replica) and a replica, in sync.
fn primary_and_replica() -> (Server, Server) {
    let primary = Server::with_args(&[], &aof_args());
    let replica = Server::start();
    replica.replicaof(&primary);
    (primary, replica)
}

/// Both alive, the replica caught up (after a full resync, if the link
/// broke), the same data on both.
fn assert_alive_and_equal(primary: &mut Server, replica: &mut Server) {
    primary.assert_alive();
    replica.assert_alive();
    let mut replica_con = replica.conn();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let info = replica.info(&mut replica_con, "replication");
        if info["master_link_status"] == "up" && info["master_sync_in_progress"] == "0" {
            break;
        }
        assert!(Instant::now() < deadline, "the replica did not sync again: {info:?}");
        thread::sleep(Duration::from_millis(50));
    }
    // WAIT counts the replicas that have this connection's last write: make
    // one, after every other write of the test.
    let mut con = primary.conn();
    let _: () = redis::cmd("SET").arg("synced").arg(1).query(&mut con).unwrap();
    wait_replicas(&mut con, 1);
    assert_eq!(digest(&mut con), digest(&mut replica.conn()), "the replica differs from the primary");
}

fn client_pause_write(con: &mut redis::Connection, ms: i64) {
    let _: () = redis::cmd("CLIENT").arg("PAUSE").arg(ms).arg("WRITE").query(con).unwrap();
}

#[test]
fn a_lease_lapsing_during_a_write_pause_is_claimed_by_its_waiter_when_the_pause_ends() {
    let (mut primary, mut replica) = primary_and_replica();
    let mut con = primary.conn();
    claim_new(&mut con, "u", 1);
    let w = waiter(&primary, "u", 10, 6000, &[]);
    client_pause_write(&mut con, 2500);
    let paused_at = Instant::now();
    // The lease lapses at about 1 s, inside the pause: the record stays as
    // it was (reads go on during a write pause), the waiter waits.
    thread::sleep(Duration::from_millis(1800));
    primary.assert_alive();
    let fields = get_fields(&mut con, "u");
    assert_eq!((f_str(&fields, "state").as_str(), f_int(&fields, "attempt")), ("expired", 1));
    assert!(!w.is_finished(), "the waiter was answered during the pause");
    // The pause ends: the waiter claims, as a CLAIM sent then would.
    let ((status, value, attempt), _) = claimed(w);
    assert_eq!((status.as_str(), attempt), ("RETRY", 2));
    assert!(paused_at.elapsed() >= Duration::from_millis(2400), "claimed {:?} into a 2.5 s pause", paused_at.elapsed());
    assert_alive_and_equal(&mut primary, &mut replica);
    assert_eq!(done(&mut con, "u", &as_token(&value), NONE), Ok(1));
    assert_alive_and_equal(&mut primary, &mut replica);
}

fn memory_usage(con: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("MEMORY").arg("USAGE").arg(key).query(con).unwrap()
}

#[test]
fn the_sweeper_drops_old_shards_only_after_a_write_pause() {
    let (mut primary, mut replica) = primary_and_replica();
    let mut con = primary.conn();
    with_retries("sweeper and write pause", |attempt| {
        let key = format!("sw{attempt}");
        reserve(&mut con, &key, "0.01", 10_000, &["WINDOW", "4", "SHARD", "1"]);
        // Shards start on whole seconds of the server's clock: "a"'s
        // shard, begun at `second`, leaves the window just after
        // `second + 4 s`, "b"'s a second or more later. Unaligned, "a"
        // could leave as early as 3 s after it was added, before the pause.
        let second = align_to_boundary(&mut con, 1000, 50);
        assert_eq!(bf_add(&mut con, &key, "a"), 1);
        sleep_until(&mut con, second + 3000);
        assert_eq!(bf_add(&mut con, &key, "b"), 1);
        let with_both = memory_usage(&mut con, &key);
        client_pause_write(&mut con, 2000);
        let paused_at = server_ms(&mut con);
        in_slot(paused_at, paused_at, second + 3000, second + 3900, "pause before \"a\" leaves")?;
        // "a"'s shard leaves the window within the pause; nothing may drop it.
        sleep_until(&mut con, second + 4300);
        primary.assert_alive();
        let checked_at = server_ms(&mut con);
        assert_eq!(memory_usage(&mut con, &key), with_both, "a shard was dropped during the pause");
        in_slot(checked_at, checked_at, second + 4000, paused_at + 2000, "check inside the pause")?;
        // After the pause the sweeper drops it (on the primary, then on
        // the replica from its effect), well before the key expires.
        let deadline = Instant::now() + Duration::from_secs(3);
        while memory_usage(&mut con, &key) == with_both {
            assert!(Instant::now() < deadline, "the old shard was never dropped");
            thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(bf_info(&mut con, &key).shards.len(), 1);
        Ok(())
    });
    assert_alive_and_equal(&mut primary, &mut replica);
}

fn signal(s: &Server, which: &str) {
    let pid = s.pid().expect("a running server").to_string();
    let status = Command::new("kill").arg(format!("-{which}")).arg(pid).status().unwrap();
    assert!(status.success(), "kill -{which}");
}

/// `FAILOVER` pauses writes until the replica has caught up, here never
/// (it is stopped): the lease lapses in the pause, and the failover times
/// out and gives up, after which the waiter claims.
#[test]
fn a_failover_that_times_out_while_a_lease_lapses_leaves_the_primary_alive() {
    let (mut primary, mut replica) = primary_and_replica();
    let mut con = primary.conn();
    claim_new(&mut con, "u", 1);
    let w = waiter(&primary, "u", 10, 8000, &[]);
    signal(&replica, "STOP");
    // A write the stopped replica cannot acknowledge: it lags.
    let _: () = redis::cmd("SET").arg("lag").arg("1").query(&mut con).unwrap();
    let _: () = redis::cmd("FAILOVER").arg("TIMEOUT").arg(3000).query(&mut con).unwrap();
    thread::sleep(Duration::from_millis(2000));
    primary.assert_alive();
    let info = primary.info(&mut con, "replication");
    assert_eq!(info["master_failover_state"], "waiting-for-sync");
    assert!(!w.is_finished(), "the waiter was answered while the failover paused writes");
    let ((status, _, attempt), _) = claimed(w);
    assert_eq!((status.as_str(), attempt), ("RETRY", 2));
    signal(&replica, "CONT");
    assert_eq!(primary.info(&mut con, "replication")["role"], "master");
    assert_alive_and_equal(&mut primary, &mut replica);
}

/// A record that goes away wakes its waiter at once with `NEW`, on every
/// server: Redis 7.2+ and Valkey wake the clients blocked on a deleted key
/// themselves; Redis 7.0 does not, and the module hears of it (keyspace
/// events, the flush event) and wakes them.
/// `later`: how long after `vanish` the record is gone for the server (an
/// expiry: its TTL, and one cycle of active expiry, `hz` 10 a second).
fn a_vanishing_record_wakes_its_waiter(later: Duration, vanish: impl FnOnce(&mut redis::Connection)) {
    let s = Server::start();
    let mut con = s.conn();
    let holder = claim_new(&mut con, "k", 30);
    let w = waiter(&s, "k", 30, 5000, &[]);
    let started = Instant::now();
    vanish(&mut con);
    let ((status, value, attempt), _) = claimed(w);
    let woken_after = started.elapsed();
    assert_eq!((status.as_str(), attempt), ("NEW", 1));
    assert!(woken_after < later + Duration::from_millis(100), "woken after {woken_after:?}");
    let token = as_token(&value);
    assert_ne!(token, holder);
    assert_eq!(f_str(&get_fields(&mut con, "k"), "state"), "processing");
    assert_eq!(done(&mut con, "k", &token, NONE), Ok(1));
    assert_eq!(blocked_clients(&mut con), 0);
}

#[test]
fn a_deleted_record_wakes_its_waiter_with_new() {
    a_vanishing_record_wakes_its_waiter(Duration::ZERO, |con| {
        let _: i64 = redis::cmd("DEL").arg("k").query(con).unwrap();
    });
}

#[test]
fn an_expired_record_wakes_its_waiter_with_new() {
    a_vanishing_record_wakes_its_waiter(Duration::from_millis(20 + 100), |con| {
        let _: i64 = redis::cmd("PEXPIRE").arg("k").arg(20).query(con).unwrap();
    });
}

#[test]
fn a_flushed_record_wakes_its_waiter_with_new() {
    a_vanishing_record_wakes_its_waiter(Duration::ZERO, |con| {
        let _: () = redis::cmd("FLUSHDB").query(con).unwrap();
    });
}

#[test]
fn a_record_renamed_away_wakes_its_waiter_with_new() {
    a_vanishing_record_wakes_its_waiter(Duration::ZERO, |con| {
        let _: () = redis::cmd("RENAME").arg("k").arg("elsewhere").query(con).unwrap();
    });
}

/// Three waiters on a deleted key: the longest claims it, the other two
/// wait on the new holder and get its result; the replica and the AOF
/// receive the claim (on Redis 7.0 it is made in a timeout callback).
#[test]
fn waiters_on_a_deleted_record_claim_it_once() {
    let (mut s, mut replica) = primary_and_replica();
    let mut con = s.conn();
    claim_new(&mut con, "k", 30);
    let waiters: Vec<_> = (0..3).map(|_| waiter(&s, "k", 30, 10_000, &[])).collect();
    let _: i64 = redis::cmd("DEL").arg("k").query(&mut con).unwrap();
    let mut waiters = waiters.into_iter();
    let ((status, value, attempt), _) = claimed(waiters.next().unwrap());
    assert_eq!((status.as_str(), attempt), ("NEW", 1), "the longest waiter");
    thread::sleep(Duration::from_millis(100));
    assert_eq!(blocked_clients(&mut con), 2, "the others wait on the new holder");
    assert_eq!(done(&mut con, "k", &as_token(&value), ("RESULT", "r")), Ok(1));
    for w in waiters {
        let ((status, value, attempt), _) = claimed(w);
        assert_eq!((status.as_str(), as_bytes(&value), attempt), ("DONE", Some(b"r".to_vec()), 1));
    }
    assert_alive_and_equal(&mut s, &mut replica);
    s.restart(Shutdown::NoSave);
    assert_eq!(f_str(&get_fields(&mut s.conn(), "k"), "state"), "done", "replayed from the AOF");
}

/// A waiter whose time is up as the lease lapses answers what a CLAIM
/// answers then: `BUSY` with time left on the lease, or the claim; never
/// `BUSY 0`.
#[test]
fn time_up_as_the_lease_lapses_never_answers_busy_with_nothing_left() {
    let s = Server::start();
    let mut con = s.conn();
    for round in 0..6 {
        let key = format!("k{round}");
        claim_new(&mut con, &key, 1);
        // The waiter's time and the lease end within a few ms of each other.
        let ((status, value, attempt), _) = claimed(waiter(&s, &key, 30, 1000 - 2 * round, &[]));
        match status.as_str() {
            "BUSY" => assert!(as_int(&value) > 0 && attempt == 1, "round {round}: BUSY {value:?} {attempt}"),
            "RETRY" => assert_eq!(attempt, 2, "round {round}"),
            other => panic!("round {round}: {other}"),
        }
    }
}

/// What one client costs in `used_memory` when `n` of them are blocked by
/// `command`, connections included; and what is left of it 3 s after they
/// left.
fn per_blocked_client(s: &Server, n: usize, command: &[u8]) -> (f64, i64) {
    use std::io::Write;
    let mut con = s.conn();
    let used = |con: &mut redis::Connection| -> i64 { s.info(con, "memory")["used_memory"].parse().unwrap() };
    let before = used(&mut con);
    let mut clients: Vec<_> = (0..n).map(|_| std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap()).collect();
    for client in &mut clients {
        client.write_all(command).unwrap();
    }
    wait_for_blocked_for(&mut con, n as i64, Duration::from_secs(30));
    let blocked = used(&mut con);
    drop(clients);
    wait_for_blocked_for(&mut con, 0, Duration::from_secs(30));
    thread::sleep(Duration::from_secs(3));
    ((blocked - before) as f64 / n as f64, used(&mut con) - before)
}

fn wait_for_blocked_for(con: &mut redis::Connection, n: i64, limit: Duration) {
    let deadline = Instant::now() + limit;
    while blocked_clients(con) != n {
        assert!(Instant::now() < deadline, "expected {n} blocked clients");
        thread::sleep(Duration::from_millis(20));
    }
}

/// A waiter costs what a `BLPOP` client costs, plus what the server itself
/// allocates for every client a module blocks: two clients of its own
/// (`moduleAllocTempClient`, for the reply and for thread-safe contexts),
/// each with a 16 KiB reply buffer, on Redis 7.0, 8.2 and Valkey 9.1. What
/// the module adds is under a kilobyte. Measured here (2026-12): 35.4 KB
/// over BLPOP on Redis 7.0.15 and 8.2.3, 34.4 KB on Valkey 9.1.
#[test]
fn a_waiter_costs_a_blpop_client_and_the_servers_two_module_clients() {
    const N: usize = 400;
    /// The server's two clients: 2 x (16 KiB buffer + the client struct).
    const SERVER_MODULE_CLIENTS: f64 = 2.0 * (16_384.0 + 2_048.0);
    const OURS: f64 = 1_024.0;
    let s = Server::with_args(&[], &["--latency-tracking", "no"]);
    let mut con = s.conn();
    claim_new(&mut con, "k", 600);
    let (blpop, blpop_left) = per_blocked_client(&s, N, b"BLPOP list 60\r\n");
    let (waiter, waiter_left) = per_blocked_client(&s, N, b"IDEM.CLAIM k 600 WAIT 60000\r\n");
    eprintln!("per client: BLPOP {blpop:.0} B, IDEM.CLAIM WAIT {waiter:.0} B ({:.2}x)", waiter / blpop);
    assert!(
        waiter - blpop <= SERVER_MODULE_CLIENTS + OURS,
        "a waiter costs {waiter:.0} B, a BLPOP client {blpop:.0} B: the module adds more than {OURS} B"
    );
    // What the module holds goes at once; the server frees its pooled
    // module clients at most 50 per cron tick, keeping 8.
    assert!(blpop_left < 64 * 1024 && waiter_left < 256 * 1024, "left after: {blpop_left} B, {waiter_left} B");
    assert_eq!(blocked_clients(&mut con), 0);
}

#[test]
fn past_max_waiters_a_claim_answers_as_without_wait() {
    let s = Server::with_args(&["max-waiters", "2"], &[]);
    let mut con = s.conn();
    claim_new(&mut con, "k", 30);
    let waiters: Vec<_> = (0..2).map(|_| waiter(&s, "k", 30, 10_000, &[])).collect();
    let started = Instant::now();
    let (status, value, attempt) = claim_opts(&mut con, "k", 30, &["WAIT", "10000"]);
    assert_eq!((status.as_str(), attempt), ("BUSY", 1));
    assert!(as_int(&value) > 0);
    assert!(started.elapsed() < Duration::from_secs(2), "the third waiter waited");
    assert_eq!(idem_counters(&mut con)["wait_refused"], 1);
    let _: () = redis::cmd("CONFIG").arg("SET").arg("idem.max-waiters").arg("0").query(&mut con).unwrap();
    assert_eq!(claim_opts(&mut con, "k", 30, &["WAIT", "10000"]).0, "BUSY");
    assert_eq!(idem_counters(&mut con)["wait_refused"], 2);
    let _: () =
        redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("normal").arg("SKIPME").arg("yes").query(&mut con).unwrap();
    for w in waiters {
        assert!(w.join().unwrap().0.is_err());
    }
    assert_eq!(blocked_clients(&mut con), 0);
}

/// A record changed under its waiter and writes paused in one step: the
/// wake-up the change owes (on Redis 7.0 the module's own, from a timer)
/// comes due inside the pause, where the waiter's claim must not be
/// written; it claims when the pause ends, the primary alive and its
/// replica equal.
fn a_change_just_before_a_write_pause_is_claimed_when_the_pause_ends(change: &[&str]) {
    let (mut primary, mut replica) = primary_and_replica();
    let mut con = primary.conn();
    claim_new(&mut con, "d", 30);
    let w = waiter(&primary, "d", 10, 8000, &[]);
    let _: () = redis::pipe()
        .atomic()
        .cmd(change[0])
        .arg(&change[1..])
        .ignore()
        .cmd("CLIENT")
        .arg("PAUSE")
        .arg(2000)
        .arg("WRITE")
        .ignore()
        .query(&mut con)
        .unwrap();
    let paused_at = Instant::now();
    thread::sleep(Duration::from_millis(1000));
    primary.assert_alive();
    assert!(!w.is_finished(), "the waiter was answered during the pause");
    let ((status, value, attempt), _) = claimed(w);
    assert_eq!((status.as_str(), attempt), ("NEW", 1));
    assert!(paused_at.elapsed() >= Duration::from_millis(1900), "claimed {:?} into a 2 s pause", paused_at.elapsed());
    assert_alive_and_equal(&mut primary, &mut replica);
    assert_eq!(done(&mut con, "d", &as_token(&value), NONE), Ok(1));
    assert_alive_and_equal(&mut primary, &mut replica);
}

#[test]
fn a_record_deleted_just_before_a_write_pause_is_claimed_by_its_waiter_when_the_pause_ends() {
    a_change_just_before_a_write_pause_is_claimed_when_the_pause_ends(&["DEL", "d"]);
}

#[test]
fn a_record_swapped_away_just_before_a_write_pause_is_claimed_by_its_waiter_when_the_pause_ends() {
    a_change_just_before_a_write_pause_is_claimed_when_the_pause_ends(&["SWAPDB", "0", "5"]);
}
