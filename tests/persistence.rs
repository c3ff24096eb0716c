//! Records and filters survive every way Redis persists or moves a key:
//! RDB (DEBUG RELOAD, SAVE + restart), AOF (rewritten, and replayed command
//! by command), DUMP/RESTORE, COPY and MIGRATE, with every field (every
//! bit) exact. Corrupt payloads are in tests/hostile_input.rs.
#[allow(dead_code)] // each test binary uses part of common/
mod common;

use common::cluster::migrate_copy;
use common::*;
use std::time::Duration;

/// lease_ms / pttl are relative to "now": allow for the time a reload takes.
const TOL_MS: i64 = 5000;

#[test]
fn debug_reload_keeps_every_field() {
    let mut s = Server::start();
    let mut con = s.conn();
    let fx = populate(&mut con, "");
    let keys = fx.key_refs();
    let before = snapshot_all(&mut con, &keys);
    let digest_before = digest(&mut con);
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut con).expect("DEBUG RELOAD");
    s.assert_alive();
    let after = snapshot_all(&mut con, &keys);
    assert_same_records(&before, &after, TOL_MS, "DEBUG RELOAD");
    assert_eq!(digest(&mut con), digest_before, "DEBUG DIGEST changed across DEBUG RELOAD");
    check_fixture_tokens(&mut con, &fx, |k| k.to_string());
}

#[test]
fn digest_value_reflects_the_record() {
    let s = Server::start();
    let mut con = s.conn();
    let t = claim_new_opts(&mut con, "a", 600, &["PAYLOAD", "x"]);
    claim_new(&mut con, "b", 600);
    let da = digest_value(&mut con, "a");
    let db = digest_value(&mut con, "b");
    assert_ne!(da, db, "two different records have the same DEBUG DIGEST-VALUE");
    assert_ne!(da.trim_matches('0'), "", "DEBUG DIGEST-VALUE is all zeros: no digest callback?");
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut con).unwrap();
    assert_eq!(digest_value(&mut con, "a"), da, "digest changed across DEBUG RELOAD");
    assert_eq!(done(&mut con, "a", &t, ("RESULT", "r")), Ok(1));
    assert_ne!(digest_value(&mut con, "a"), da, "digest did not change when the record did");
}

#[test]
fn save_and_restart() {
    let mut s = Server::start();
    let mut con = s.conn();
    let fx = populate(&mut con, "");
    let keys = fx.key_refs();
    let before = snapshot_all(&mut con, &keys);
    let digest_before = digest(&mut con);
    let _: () = redis::cmd("SAVE").query(&mut con).expect("SAVE");
    drop(con);
    s.restart(Shutdown::NoSave);
    let mut con = s.conn();
    let after = snapshot_all(&mut con, &keys);
    assert_same_records(&before, &after, TOL_MS, "SAVE + restart");
    assert_eq!(digest(&mut con), digest_before, "DEBUG DIGEST changed across SAVE + restart");
    check_fixture_tokens(&mut con, &fx, |k| k.to_string());

    // And a SHUTDOWN SAVE after those changes.
    let before = snapshot_all(&mut con, &keys);
    drop(con);
    s.restart(Shutdown::Save);
    let mut con = s.conn();
    assert_same_records(&before, &snapshot_all(&mut con, &keys), TOL_MS, "SHUTDOWN SAVE + restart");
}

#[test]
fn aof_rewrite_without_rdb_preamble_and_restart() {
    let mut s = Server::with_args(&[], &aof_args());
    let mut con = s.conn();
    let fx = populate(&mut con, "");
    let keys = fx.key_refs();
    let before = snapshot_all(&mut con, &keys);
    let digest_before = digest(&mut con);
    s.bgrewriteaof(&mut con);
    s.assert_alive();
    // The rewritten base file is a command file, not an RDB.
    let aofdir = s.dir.join("appendonlydir");
    let base: Vec<_> = std::fs::read_dir(&aofdir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".base."))
        .collect();
    assert!(base.iter().any(|n| n.ends_with(".base.aof")), "no .base.aof in {aofdir:?}: {base:?}");
    drop(con);
    s.restart(Shutdown::NoSave);
    let mut con = s.conn();
    let after = snapshot_all(&mut con, &keys);
    assert_same_records(&before, &after, TOL_MS, "AOF rewrite + restart");
    assert_eq!(digest(&mut con), digest_before, "DEBUG DIGEST changed across AOF rewrite + restart");

    // Writes after the rewrite are replayed on top of it.
    check_fixture_tokens(&mut con, &fx, |k| k.to_string());
    let before = snapshot_all(&mut con, &keys);
    let digest_before = digest(&mut con);
    drop(con);
    s.restart(Shutdown::NoSave);
    let mut con = s.conn();
    assert_same_records(&before, &snapshot_all(&mut con, &keys), TOL_MS, "AOF rewrite + more writes + restart");
    assert_eq!(digest(&mut con), digest_before);
}

#[test]
fn aof_replay_gives_identical_records() {
    // No rewrite: the records are rebuilt from the commands in the AOF. The
    // module replicates absolute effects, so replay ends up identical (same
    // tokens, same times), not re-executed with a new clock and new tokens.
    let mut args = aof_args();
    args.extend(["--auto-aof-rewrite-percentage", "0"]);
    let mut s = Server::with_args(&[], &args);
    let mut con = s.conn();
    let fx = populate(&mut con, "");
    let keys = fx.key_refs();
    let before = snapshot_all(&mut con, &keys);
    let digest_before = digest(&mut con);
    drop(con);
    s.restart(Shutdown::NoSave);
    let mut con = s.conn();
    let after = snapshot_all(&mut con, &keys);
    assert_same_records(&before, &after, TOL_MS, "AOF replay");
    assert_eq!(digest(&mut con), digest_before, "DEBUG DIGEST changed across AOF replay");
    check_fixture_tokens(&mut con, &fx, |k| k.to_string());

    // No-op commands (BUSY, DONE on done, ...) leave nothing to replay that
    // could change a record; real changes replay exactly.
    let before = snapshot_all(&mut con, &keys);
    for k in &keys {
        let _ = claim(&mut con, k, 5);
        let _ = once(&mut con, k, 5);
    }
    let before2 = snapshot_all(&mut con, &keys);
    drop(con);
    s.restart(Shutdown::NoSave);
    let mut con = s.conn();
    let after = snapshot_all(&mut con, &keys);
    assert_same_records(&before2, &after, TOL_MS, "AOF replay (second round)");
    let _ = before;
}

#[test]
fn dump_restore_round_trip() {
    let mut s = Server::start();
    let mut con = s.conn();
    let fx = populate(&mut con, "");
    let keys = fx.key_refs();
    let before = snapshot_all(&mut con, &keys);
    for k in &keys {
        let payload: Vec<u8> = redis::cmd("DUMP").arg(*k).query(&mut con).unwrap();
        let exp = pexpiretime(&mut con, k);
        assert!(exp > 0, "{k} has no expiry");
        let _: () = redis::cmd("RESTORE")
            .arg(format!("{k}:restored"))
            .arg(exp)
            .arg(payload.as_slice())
            .arg("ABSTTL")
            .query(&mut con)
            .unwrap_or_else(|e| panic!("RESTORE {k}:restored: {e}"));
    }
    for (b, k) in before.iter().zip(&keys) {
        let r = snapshot(&mut con, &format!("{k}:restored"));
        assert_same_record(b, &r, TOL_MS, "DUMP/RESTORE");
    }
    // RESTORE REPLACE over the original, with a relative TTL.
    let k = "rec:done-fp";
    let payload: Vec<u8> = redis::cmd("DUMP").arg(k).query(&mut con).unwrap();
    let _: () = redis::cmd("RESTORE").arg(k).arg(0).arg(payload.as_slice()).arg("REPLACE").query(&mut con).unwrap();
    assert_eq!(pexpiretime(&mut con, k), -1, "RESTORE with ttl 0: no expiry");
    let f = get_fields(&mut con, k);
    assert_eq!(f["result"], Value::BulkString(b"ok".to_vec()));
    assert_eq!(f_bytes(&f, "fingerprint"), Some(fingerprint_hex(b"fp-payload").into_bytes()));

    // The tokens travel with the record; the originals are untouched by
    // what happens to the restored copies.
    let originals = snapshot_all(&mut con, &keys);
    check_fixture_tokens(&mut con, &fx, |k| format!("{k}:restored"));
    let now = snapshot_all(&mut con, &keys);
    assert_same_records(&originals, &now, TOL_MS, "originals after using the restored copies");
    s.assert_alive();
}

#[test]
fn copy_is_deep_and_exact() {
    let mut s = Server::start();
    let mut con = s.conn();
    let fx = populate(&mut con, "");
    let keys = fx.key_refs();
    let before = snapshot_all(&mut con, &keys);
    for k in &keys {
        let n: i64 = redis::cmd("COPY").arg(*k).arg(format!("{k}:copy")).query(&mut con).unwrap();
        assert_eq!(n, 1, "COPY {k}");
    }
    for (b, k) in before.iter().zip(&keys) {
        assert_same_record(b, &snapshot(&mut con, &format!("{k}:copy")), TOL_MS, "COPY");
    }
    // Changing the copies leaves the originals as they were.
    check_fixture_tokens(&mut con, &fx, |k| format!("{k}:copy"));
    assert_same_records(&before, &snapshot_all(&mut con, &keys), TOL_MS, "originals after changing copies");
    // And the other way round.
    let copies: Vec<String> = keys.iter().map(|k| format!("{k}:copy")).collect();
    let copies: Vec<&str> = copies.iter().map(String::as_str).collect();
    let copies_before = snapshot_all(&mut con, &copies);
    check_fixture_tokens(&mut con, &fx, |k| k.to_string());
    assert_same_records(&copies_before, &snapshot_all(&mut con, &copies), TOL_MS, "copies after changing originals");
    // COPY onto an existing key needs REPLACE.
    let n: i64 = redis::cmd("COPY").arg("rec:once").arg("rec:once:copy").query(&mut con).unwrap();
    assert_eq!(n, 0);
    let n: i64 = redis::cmd("COPY").arg("rec:once").arg("rec:done-fp").arg("REPLACE").query(&mut con).unwrap();
    assert_eq!(n, 1);
    let f = get_fields(&mut con, "rec:done-fp");
    assert_eq!(f_int(&f, "attempt"), 0);
    s.assert_alive();
}

#[test]
fn migrate_carries_every_field() {
    let a = Server::start();
    let b = Server::start();
    let mut ca = a.conn();
    let mut cb = b.conn();
    let fx = populate(&mut ca, "");
    let keys = fx.key_refs();
    let before = snapshot_all(&mut ca, &keys);
    migrate_copy(&mut ca, b.port, &keys);
    for s in &before {
        let got = snapshot(&mut cb, &s.key);
        let (Some(x), Some(y)) = (&s.fields, &got.fields) else { panic!("{} not migrated", s.key) };
        for name in ["state", "attempt", "claimed_at", "done_at", "result", "fingerprint"] {
            assert_eq!(x[name], y[name], "MIGRATE: {name} of {}", s.key);
        }
        // The TTL travels relative to the source's clock (same machine here).
        assert!(
            (s.pexpiretime - got.pexpiretime).abs() < TOL_MS,
            "MIGRATE: PEXPIRETIME of {}: {} vs {}",
            s.key,
            s.pexpiretime,
            got.pexpiretime
        );
    }
    check_fixture_tokens(&mut cb, &fx, |k| k.to_string());
}

// ---------------------------------------------------------------------------
// Filters
// ---------------------------------------------------------------------------

#[test]
fn filters_survive_debug_reload() {
    let mut s = Server::start();
    let mut con = s.conn();
    let fx = populate_filters(&mut con, "");
    let before = fx.snap(&mut con);
    let digest_before = digest(&mut con);
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut con).expect("DEBUG RELOAD");
    s.assert_alive();
    assert_same_filters(&before, &fx.snap(&mut con), "DEBUG RELOAD");
    assert_eq!(digest(&mut con), digest_before, "DEBUG DIGEST across DEBUG RELOAD");
    // Still a working filter: a new item, then the digest moves.
    let d = digest_value(&mut con, "bf:day");
    assert_eq!(bf_add(&mut con, "bf:day", "after-reload"), 1);
    assert_ne!(digest_value(&mut con, "bf:day"), d, "DIGEST-VALUE did not change with the filter");
}

#[test]
fn filters_survive_save_and_restart() {
    let mut s = Server::start();
    let mut con = s.conn();
    let fx = populate_filters(&mut con, "");
    let before = fx.snap(&mut con);
    let _: () = redis::cmd("SAVE").query(&mut con).expect("SAVE");
    drop(con);
    s.restart(Shutdown::NoSave);
    let mut con = s.conn();
    assert_same_filters(&before, &fx.snap(&mut con), "SAVE + restart");
    // More items, then SHUTDOWN SAVE.
    madd_all(&mut con, "bf:multi", &items("late:", 0..300));
    madd_all(&mut con, "bf:empty", &items("late:", 0..30));
    let before = fx.snap(&mut con);
    drop(con);
    s.restart(Shutdown::Save);
    let mut con = s.conn();
    assert_same_filters(&before, &fx.snap(&mut con), "SHUTDOWN SAVE + restart");
}

#[test]
fn filters_replay_exactly_from_the_aof() {
    // No rewrite: each write is replayed as the IDEM.BF.APPLY it
    // propagated, at the primary's time, with the filter's seed.
    let mut args = aof_args();
    args.extend(["--auto-aof-rewrite-percentage", "0"]);
    let mut s = Server::with_args(&[], &args);
    let mut con = s.conn();
    let fx = populate_filters(&mut con, "");
    // DONE ... BLOOM writes to a filter too.
    let tok = claim_new(&mut con, "order:1", 60);
    assert_eq!(done(&mut con, "order:1", &tok, ("BLOOM", "bf:day")), Ok(1));
    let before = fx.snap(&mut con);
    let digest_before = digest(&mut con);
    std::thread::sleep(Duration::from_millis(1100)); // replay happens in a later shard of bf:multi
    drop(con);
    s.restart(Shutdown::NoSave);
    let mut con = s.conn();
    assert_same_filters(&before, &fx.snap(&mut con), "AOF replay");
    assert_eq!(digest(&mut con), digest_before, "DEBUG DIGEST across AOF replay");
    assert_eq!(bf_exists(&mut con, "bf:day", "order:1"), 1);
}

#[test]
fn filters_survive_aof_rewrite_and_restart() {
    let mut s = Server::with_args(&[], &aof_args());
    let mut con = s.conn();
    let fx = populate_filters(&mut con, "");
    let before = fx.snap(&mut con);
    s.bgrewriteaof(&mut con);
    s.assert_alive();
    let aofdir = s.dir.join("appendonlydir");
    let names: Vec<String> = std::fs::read_dir(&aofdir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let base = names.iter().find(|n| n.ends_with(".base.aof")).unwrap_or_else(|| panic!("no .base.aof: {names:?}"));
    let text = std::fs::read(aofdir.join(base)).unwrap();
    assert!(text.windows(12).any(|w| w == b"IDEM.BF.LOAD"), "the rewritten AOF should hold IDEM.BF.LOAD commands");
    drop(con);
    s.restart(Shutdown::NoSave);
    let mut con = s.conn();
    assert_same_filters(&before, &fx.snap(&mut con), "AOF rewrite + restart");
    // Writes after the rewrite replay on top of it.
    madd_all(&mut con, "bf:multi", &items("late:", 0..300));
    bf_add(&mut con, "bf:empty", "one");
    bf_add(&mut con, "bf:new", "created after the rewrite");
    let mut keys = fx.keys.clone();
    keys.push("bf:new".into());
    let fx2 = BfFixture { keys, probes: fx.probes.clone() };
    let before = fx2.snap(&mut con);
    let digest_before = digest(&mut con);
    drop(con);
    s.restart(Shutdown::NoSave);
    let mut con = s.conn();
    assert_same_filters(&before, &fx2.snap(&mut con), "AOF rewrite + more writes + restart");
    assert_eq!(digest(&mut con), digest_before);
}

#[test]
fn filters_dump_restore_copy_and_migrate() {
    let mut s = Server::start();
    let mut con = s.conn();
    let fx = populate_filters(&mut con, "");
    let before = fx.snap(&mut con);
    for k in &fx.keys {
        let payload: Vec<u8> = redis::cmd("DUMP").arg(k).query(&mut con).unwrap();
        let exp = pexpiretime(&mut con, k);
        assert!(exp > 0, "{k}: a filter always has an expiry");
        let _: () = redis::cmd("RESTORE")
            .arg(format!("{k}:restored"))
            .arg(exp)
            .arg(payload.as_slice())
            .arg("ABSTTL")
            .query(&mut con)
            .unwrap_or_else(|e| panic!("RESTORE {k}:restored: {e}"));
        let n: i64 = redis::cmd("COPY").arg(k).arg(format!("{k}:copy")).query(&mut con).unwrap();
        assert_eq!(n, 1);
    }
    assert_same_filters(&before, &fx.snap_named(&mut con, |k| format!("{k}:restored")), "DUMP/RESTORE");
    assert_same_filters(&before, &fx.snap_named(&mut con, |k| format!("{k}:copy")), "COPY");
    // Deep copies: changing them leaves the originals as they were.
    for k in &fx.keys {
        madd_all(&mut con, &format!("{k}:copy"), &items("copy-only:", 0..200));
        madd_all(&mut con, &format!("{k}:restored"), &items("restored-only:", 0..200));
    }
    assert_same_filters(&before, &fx.snap(&mut con), "originals after writing to copies");
    assert_eq!(bf_exists(&mut con, "bf:day", "copy-only:1"), 0);
    // And the other way round.
    let copies = fx.snap_named(&mut con, |k| format!("{k}:copy"));
    for k in &fx.keys {
        madd_all(&mut con, k, &items("orig-only:", 0..200));
    }
    assert_eq!(copies, fx.snap_named(&mut con, |k| format!("{k}:copy")), "copies after writing to the originals");
    // RESTORE REPLACE over an existing filter, relative TTL.
    let payload: Vec<u8> = redis::cmd("DUMP").arg("bf:exp1:copy").query(&mut con).unwrap();
    let _: () =
        redis::cmd("RESTORE").arg("bf:day").arg(60_000).arg(payload.as_slice()).arg("REPLACE").query(&mut con).unwrap();
    assert_eq!(digest_value(&mut con, "bf:day"), digest_value(&mut con, "bf:exp1:copy"));
    let ttl = pttl(&mut con, "bf:day");
    assert!(ttl > 55_000 && ttl <= 60_000, "RESTORE with a relative TTL: {ttl}");

    // MIGRATE (COPY) to another server.
    let other = Server::start();
    let mut oc = other.conn();
    let snaps = fx.snap_named(&mut con, |k| format!("{k}:restored"));
    let keys: Vec<String> = fx.keys.iter().map(|k| format!("{k}:restored")).collect();
    migrate_copy(&mut con, other.port, &keys);
    for snap in &snaps {
        let got = filter_snap(&mut oc, &snap.key, &fx.probes);
        assert_eq!(
            (&got.digest, &got.info, &got.answers),
            (&snap.digest, &snap.info, &snap.answers),
            "MIGRATE {}",
            snap.key
        );
        assert!((got.pexpiretime - snap.pexpiretime).abs() < 5000, "MIGRATE TTL of {}", snap.key);
    }
    s.assert_alive();
}
