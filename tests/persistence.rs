//! Records and filters survive every way Redis persists or moves a key:
//! RDB (DEBUG RELOAD, SAVE + restart), AOF (rewritten, and replayed command
//! by command), DUMP/RESTORE, COPY and MIGRATE, with every field (every
//! bit) exact. Corrupt payloads are in tests/hostile_input.rs.
#[allow(dead_code)] // each test binary uses part of common/
mod common;

use common::cluster::migrate_copy;
use common::commands::{
    bf_add, bf_exists, claim, claim_new, claim_new_opts, digest, digest_value, done, fingerprint_hex, get_fields,
    items, madd_all, once, pexpiretime, pttl,
};
use common::fixtures::{
    BfFixture, assert_same_filters, assert_same_record, assert_same_records, check_fixture_tokens, filter_snap,
    populate, populate_filters, snapshot, snapshot_all,
};
use common::reply::{f_bytes, f_int};
use common::server::{Server, Shutdown, aof_args};
use redis::Value;
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

/// A format 3 filter (a development build's) as `DUMP` gave it: reserved
/// for 50, 300 items `old:0..300` in three stacked sub-filters of one shard
/// (shards of ten years, a window of 366 of them: alive for millennia).
/// Made by the module at afe986b on Redis 7.0.15.
const FORMAT_3_DUMP: &[&str] = &[
    "078189d7a66e5a289803054599037b14ae47e17a843f32000000000000006e0100000003cc12000000000200000078bf15ce",
    "1b33996c578784ac4044e672a415094671a50e6769c5598ec73a224901000000000ffc5d000000002c010000000000000300",
    "000032000000000000003200000000000000c67e3e22e9deea3e12000000a0000000dfa084d80ec930d721667680fab01932",
    "495478deacbd5fd8d42ae624122ce602eed19e495da2f9fa1be83cfb9f867ff308adff663f0256c9e795e0e66379a74bc88b",
    "74d2231b8555ea83ed90a47eece7bf8a9b40b30e35a2ff8cb9f9f0df70d2f8863fd9146b858d42ecffa876d484f8190675f2",
    "92c85aacc2188b844590b189badfff4795198801fbf924916941dea4acf0208f51af6faddf877b638f1b0de1640000000000",
    "00006400000000000000cd1f6d1c5226e33e12000000400100003f6dd5c93641e6d71b7f7ab3769972f79de32a1283fd7118",
    "fcbc00592aeffe3a11306b62f9aff9007a28e760b52a0f52246cd576797a3a3682708ce6b470d777a70f4fcc1e759e21ab18",
    "0c0a928e04743f1ecddbca10f7e608310b389780a9305d20079408db8912b29c1951091c1781e29791250e19a29684a3abcd",
    "a799b47ad8bdefa75826241b57786995fdc9971ea1f710846dab07589e255b5e8d0c058c94d6e3233cc7524c2fa6d0e2e307",
    "7f78028e21d7f23ff0abfcd809919795a6e65ef81c3cc93eca19f53dbcbb6560401e6ed0dee65b8e41e850f4d7ca37224eef",
    "71eeb22259cba7d03b662fb6467db4b2c0c66042a9abd53f6d8960fa8b56bc291f50dd60f4bcccf213d753ba6bdae327ee14",
    "c247c360ec19b7e860a9671edec88f92dfc54170bbf09e90b0173cc3ed6ae1dbe52f0aaea46fea6a5f0573663362c8000000",
    "000000009600000000000000d5d720814da0a53e14000000000300000fa800011050801cb0948761070ac2400a2269bc0568",
    "cca02b366ec0f3651420022f702cd78c680c4310606cb1c8a09e33d30c325282484806b014cd1ba0c3852205891146a9e702",
    "c6d5085021c10c6c64d0c2cdd2064a0e849c080338a134e192732a5e469c559b1003724c84c201898b346e40a468030dc224",
    "859a1e8cb41d00c15003d1433469d2a2fe8a70207156f2565f28706c025079c4408205a2d42315396430a465ee5012a123a9",
    "32b2201c01351cbe2ae80fb3283a80c43471548082960a250e865c4a5e802800a93553c8da9550ef31398e2406a825aa5a53",
    "012ca2ad04050493825dc329d8d403200d1043ec47a9105e7342b192091406204a1d82000128069c23dda0862934649210c1",
    "bee1a0462c8443831b48e6ad363054684b1c72f738030b13c4969208211b6a045613e81a0f02b1c8daaa0d841010aa03078f",
    "b008db381c0051814a88000e68024496f401b1261401e95a60514d589a6128286418d5b064325e0a814919509a02094a2787",
    "e4aa6e5103731204c0b698048a01084557cc990a001924f08563df31ac2578f2985d04804238d025d835560c9490cb289024",
    "28216458eb104dc60e510b27134139a42111ce85025c19109245c1a8d5425049472ee0d8984744605b94d82c007b5a6a0f48",
    "21031662204f2d08d22648008a0b00000cd0052e5126b6294e5d82a18e21540847280e45a5aa6059860a36f24a180584d551",
    "2acb9df4209870099830d45f4cc5080813a8c1d41971960519c22e0dc6d21983108a892e44a94b1c3ea2f9c33a058c005546",
    "b9a08122908443b6000380ec900c8286b8301a26f0e2b0f922862058a4341767ef0f8955308450c08c8239e40080f42287fb",
    "21182e102c04830306c1840b8b4154bfd30ea998d18b0ba1749838316209ed0dd3072bf2509962aac59785ff2e8ba5c115c1",
    "116205f448a4000bf20f25d161a6584262733c675780884b02e0d20f60961042086d0309a17acf8a1860cc90490f08d2b527",
    "3a8a3b1e3843e5929b664626a39a6fb628a811018048da262ce9050642df040d761b4c2995249a4c422c78904dc8000a001a",
    "2b5c440b18cea9",
];

/// Format 3 was written only by development builds before 0.1.0: its
/// payload is refused with an error, and the server lives on.
#[test]
fn a_format_3_filter_of_a_development_build_is_refused() {
    let mut s = Server::start();
    let mut con = s.conn();
    let hex = FORMAT_3_DUMP.concat();
    let payload: Vec<u8> =
        (0..hex.len()).step_by(2).map(|at| u8::from_str_radix(&hex[at..at + 2], 16).unwrap()).collect();
    let e = redis::cmd("RESTORE").arg("old").arg(0).arg(&payload).query::<()>(&mut con).unwrap_err();
    assert!(e.to_string().contains("Bad data format"), "{e}");
    let exists: bool = redis::cmd("EXISTS").arg("old").query(&mut con).unwrap();
    assert!(!exists);
    s.assert_alive();
}
