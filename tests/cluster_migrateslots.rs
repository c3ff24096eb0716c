//! Valkey 9's atomic slot migration (`CLUSTER MIGRATESLOTS`, issue 38): the
//! module declares it supports it, and records, filters and waiters come
//! out on the target as they were. The source sends the slot's keys as an
//! AOF-format snapshot (`IDEM.APPLY` / `IDEM.BF.LOAD` from the data types'
//! AOF rewrite) and then streams every later write (their propagated
//! effects) through its slot-migration link, which the target runs as it
//! runs its primary's stream; a client's `IDEM.APPLY` is still refused.
//!
//! On Redis (7.0, 8.2: no atomic slot migration here; Redis 8.4's own is
//! not on these machines) the module must not set Valkey's option bit,
//! which Redis may read otherwise: the test checks that it does not.
#[allow(dead_code)] // each test binary uses part of common/
mod common;

use common::cluster::{Cluster, assert_same_moved_record, key_slot, tag_where, timed_snapshot, wait_until};
use common::commands::{claim, claim_new, digest_value, done, get_fields, release};
use common::fixtures::{NONE, check_fixture_tokens, filter_snap, populate};
use common::reply::{as_token, f_int, f_str};
use common::server::{Server, ServerKind, ServerVersion};
use common::waiters::claimed;
use common::waiters::waiter;
use redis::Value;
use std::time::{Duration, Instant};

fn run(con: &mut redis::Connection, args: &[&str]) -> redis::RedisResult<Value> {
    redis::cmd(args[0]).arg(&args[1..]).query(con)
}

/// The log line the module writes at load, with what it declared.
fn load_line(server: &Server) -> String {
    let log = server.log();
    log.lines().find(|line| line.contains(" loaded. ")).unwrap_or_else(|| panic!("no load line:\n{log}")).to_string()
}

fn is_valkey_9(server: &Server) -> bool {
    ServerVersion::of(&mut server.conn()).is_at_least(ServerKind::Valkey, 9, 0)
}

/// The state of the migration jobs of a node (`CLUSTER GETSLOTMIGRATIONS`),
/// as (state, message) pairs.
fn migrations(con: &mut redis::Connection) -> Vec<(String, String)> {
    let jobs: Vec<Value> = redis::cmd("CLUSTER").arg("GETSLOTMIGRATIONS").query(con).unwrap();
    jobs.into_iter()
        .map(|job| {
            let fields: std::collections::HashMap<String, Value> = redis::from_redis_value(&job).unwrap();
            let text = |name: &str| match fields.get(name) {
                Some(Value::BulkString(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
                Some(Value::SimpleString(text)) => text.clone(),
                other => format!("{other:?}"),
            };
            (text("state"), text("message"))
        })
        .collect()
}

#[test]
fn the_module_declares_atomic_slot_migration_on_valkey_only() {
    let s = Server::start();
    let line = load_line(&s);
    let expected =
        if is_valkey_9(&s) || ServerVersion::of(&mut s.conn()).kind == ServerKind::Valkey { "yes" } else { "no" };
    assert!(line.contains(&format!("Valkey's atomic slot migration declared: {expected}.")), "{line}");
}

/// Records in every state (processing, expired, released, retried, done
/// with and without a result, with a fingerprint, marked once, requeued),
/// a filter, and a client waiting on a migrating key; writes made while
/// the migration streams; then `CLUSTER MIGRATESLOTS`.
#[test]
fn migrateslots_moves_records_filters_and_waiters() {
    let probe = Server::start();
    if !is_valkey_9(&probe) {
        eprintln!("CLUSTER MIGRATESLOTS is Valkey 9's: nothing to migrate on {}", probe.version());
        return;
    }
    drop(probe);
    let cluster = Cluster::start();
    let topo = cluster.topology();
    let primaries = topo.primaries();
    let (source, target) = (primaries[0].clone(), primaries[1].clone());
    let tag = tag_where("asm", |slot| source.owns(slot));
    let slot = key_slot(&tag);
    let key = |base: &str| format!("{{{tag}}}:{base}");
    let mut sc = cluster.conn(source.port);

    // Records in every state, a requeued one, a filter.
    let fixture = populate(&mut sc, &format!("{{{tag}}}:"));
    let requeued = key("rec:requeued");
    let token = claim_new(&mut sc, &requeued, 600);
    assert_eq!(done(&mut sc, &requeued, &token, ("RESULT", "redo")), Ok(1));
    assert_eq!(run(&mut sc, &["IDEM.REQUEUE", &requeued]).unwrap(), Value::Int(1));
    let seen = key("seen");
    let items: Vec<String> = (0..300).map(|i| format!("item-{i}")).collect();
    let _: () =
        redis::cmd("IDEM.BF.RESERVE").arg(&seen).arg(0.001).arg(100).arg("WINDOW").arg(3).query(&mut sc).unwrap();
    let _: Vec<i64> = redis::cmd("IDEM.BF.MADD").arg(&seen).arg(&items).query(&mut sc).unwrap();
    let mut probes = items.clone();
    probes.extend((0..50).map(|i| format!("absent-{i}")));
    // A holder, and a client waiting on its key; another whose holder's
    // lease lapses while the migration streams (the waiter's claim, a
    // write of a timer, reaches the target through the stream).
    let busy = key("busy");
    let holder = claim_new(&mut sc, &busy, 600);
    let source_server = cluster.server(source.port);
    let blocked = waiter(source_server, &busy, 60, 30_000, &[]);
    let lapsing = key("lapsing");
    claim_new(&mut sc, &lapsing, 4);
    let lapses_at = Instant::now() + Duration::from_secs(4);
    let retrying = waiter(source_server, &lapsing, 600, 30_000, &[]);

    let mut records = fixture.keys.clone();
    records.extend([requeued.clone(), busy.clone()]);
    let before: Vec<_> = records.iter().map(|k| timed_snapshot(&mut sc, k)).collect();
    let filter_before = filter_snap(&mut sc, &seen, &probes);
    let keys_in_slot: i64 = redis::cmd("CLUSTER").arg("COUNTKEYSINSLOT").arg(slot).query(&mut sc).unwrap();

    // The migration holds before its final pause, so that writes made now
    // reach the target through its stream.
    let _: () = redis::cmd("DEBUG").arg("SLOTMIGRATION").arg("PREVENT-PAUSE").arg(1).query(&mut sc).unwrap();
    let started: Value = redis::cmd("CLUSTER")
        .arg("MIGRATESLOTS")
        .arg("SLOTSRANGE")
        .arg(slot)
        .arg(slot)
        .arg("NODE")
        .arg(&target.id)
        .query(&mut sc)
        .unwrap_or_else(|e| panic!("CLUSTER MIGRATESLOTS refused: {e}"));
    assert_eq!(started, Value::Okay);
    wait_until("the migration streaming", Duration::from_secs(30), || {
        // PREVENT-PAUSE holds the export streaming, before its pause.
        migrations(&mut sc).iter().any(|(state, _)| state == "waiting-to-pause")
    });
    assert!(Instant::now() + Duration::from_millis(500) < lapses_at, "{lapsing}'s lease lapsed before the stream");
    let streamed = key("streamed");
    let streamed_token = claim_new(&mut sc, &streamed, 600);
    assert_eq!(done(&mut sc, &streamed, &streamed_token, ("RESULT", "via-stream")), Ok(1));
    let _: i64 = redis::cmd("IDEM.BF.ADD").arg(&seen).arg("streamed-item").query(&mut sc).unwrap();
    let ((status, retry_token, attempt), _) = claimed(retrying);
    assert_eq!((status.as_str(), attempt), ("RETRY", 2), "{lapsing}'s waiter while the migration streamed");
    let streamed_before = timed_snapshot(&mut sc, &streamed);
    let lapsed_before = timed_snapshot(&mut sc, &lapsing);
    let _: () = redis::cmd("DEBUG").arg("SLOTMIGRATION").arg("PREVENT-PAUSE").arg(0).query(&mut sc).unwrap();
    let moved_at = Instant::now();
    wait_until("the migration to succeed", Duration::from_secs(60), || {
        let jobs = migrations(&mut sc);
        assert!(!jobs.iter().any(|(state, _)| state == "failed"), "the migration failed: {jobs:?}");
        jobs.iter().any(|(state, _)| state == "success")
    });
    cluster.wait_stable("after CLUSTER MIGRATESLOTS");
    let topo = cluster.topology();
    assert_eq!(topo.owner(slot).id, target.id, "slot {slot} owned by the target");

    // The waiter got an answer a library resends (MOVED), not a hang.
    let (reply, waited) = blocked.join().unwrap();
    let error = reply.expect_err("the waiter on a migrated key was answered with a claim on the source");
    let code = error.code().unwrap_or_default().to_string();
    assert!(["MOVED", "TRYAGAIN", "UNBLOCKED", "ASK"].contains(&code.as_str()), "the waiter got {error}");
    assert!(waited < Duration::from_secs(25), "the waiter waited {waited:?}");
    eprintln!("waiter answered {code} {:?} after the migration ended", moved_at.elapsed());

    // On the target: every record and the filter as they were.
    let mut tc = cluster.conn(target.port);
    for (b, k) in before.iter().zip(&records) {
        assert_same_moved_record(b, &timed_snapshot(&mut tc, k), 300, 0, "after CLUSTER MIGRATESLOTS");
    }
    assert_same_moved_record(&streamed_before, &timed_snapshot(&mut tc, &streamed), 300, 0, "streamed");
    assert_same_moved_record(&lapsed_before, &timed_snapshot(&mut tc, &lapsing), 300, 0, "claimed by a waiter");
    // The filter as it was, plus the item added while the slot streamed.
    let filter_after = filter_snap(&mut tc, &seen, &probes);
    let (b, a) = (filter_before.info.clone().unwrap(), filter_after.info.clone().unwrap());
    assert_eq!(
        (a.error_rate, a.capacity, a.window, a.shard, a.expansion),
        (b.error_rate, b.capacity, b.window, b.shard, b.expansion)
    );
    assert_eq!((a.items, a.starts()), (b.items + 1, b.starts()), "IDEM.BF.INFO {seen}");
    assert_eq!(filter_after.answers, filter_before.answers, "IDEM.BF.MEXISTS {seen}");
    assert_eq!(filter_after.pexpiretime, filter_before.pexpiretime, "PEXPIRETIME {seen}");
    let streamed_item: i64 = redis::cmd("IDEM.BF.EXISTS").arg(&seen).arg("streamed-item").query(&mut tc).unwrap();
    assert_eq!(streamed_item, 1);
    let on_target: i64 = redis::cmd("CLUSTER").arg("COUNTKEYSINSLOT").arg(slot).query(&mut tc).unwrap();
    assert_eq!(on_target, keys_in_slot + 1, "the slot's keys on the target");

    // The source holds nothing of the slot, nor does its replica.
    for port in [Some(source.port), topo.replicas_of(&source.id).first().map(|r| r.port)].into_iter().flatten() {
        let left: i64 = redis::cmd("CLUSTER").arg("COUNTKEYSINSLOT").arg(slot).query(&mut cluster.conn(port)).unwrap();
        assert_eq!(left, 0, "keys of slot {slot} left on {port}");
    }
    // The target's replica holds the same records and filter.
    let replica = topo.replicas_of(&target.id)[0].port;
    let mut rc = cluster.conn(replica);
    let _: Value = redis::cmd("WAIT").arg(1).arg(5000).query(&mut tc).unwrap();
    for k in records.iter().chain([&seen, &streamed, &lapsing]) {
        assert_eq!(digest_value(&mut rc, k), digest_value(&mut tc, k), "{k} on the target's replica");
    }

    // The tokens still work on the target; the requeued record is retried.
    check_fixture_tokens(&mut tc, &fixture, |k| k.to_string());
    let (status, _, attempt) = claim(&mut tc, &requeued, 60);
    assert_eq!((status.as_str(), attempt), ("RETRY", 2), "{requeued}");
    // The waiter's resend waits on the target, and gets the holder's DONE.
    let resent = waiter(cluster.server(target.port), &busy, 60, 30_000, &[]);
    assert_eq!(done(&mut tc, &busy, &holder, ("RESULT", "finished")), Ok(1));
    let (reply, _) = resent.join().unwrap();
    let answer: (String, Value, i64) = redis::from_redis_value(&reply.unwrap()).unwrap();
    assert_eq!(answer, ("DONE".into(), Value::BulkString(b"finished".to_vec()), 1));
    assert_eq!(release(&mut tc, &streamed, &streamed_token), 0, "{streamed} is done");
    assert_eq!(f_str(&get_fields(&mut tc, &streamed), "state"), "done");
    // The waiter's claim made while streaming holds on the target.
    assert_eq!(done(&mut tc, &lapsing, &as_token(&retry_token), NONE), Ok(1));
    assert_eq!(f_int(&get_fields(&mut tc, &lapsing), "attempt"), 2);

    // A client still cannot plant a record on the target.
    let error = run(&mut tc, &["IDEM.APPLY", &key("planted"), "x"]).expect_err("a client's IDEM.APPLY");
    assert!(error.to_string().contains("internal command"), "{error}");
}
