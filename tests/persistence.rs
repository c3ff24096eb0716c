//! Records survive every way Redis persists or moves a key: RDB (DEBUG
//! RELOAD, SAVE + restart), AOF (rewritten, and replayed command by
//! command), DUMP/RESTORE, COPY and MIGRATE, with every field exact.
mod common;

use common::*;

/// lease_ms / pttl are relative to "now": allow for the time a reload takes.
const TOL_MS: i64 = 5000;

fn aof_args() -> Vec<&'static str> {
    vec!["--appendonly", "yes", "--aof-use-rdb-preamble", "no", "--appendfsync", "always"]
}

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
fn restore_of_corrupt_payloads_is_refused() {
    // Uncompressed: every changed byte reaches the module's own decoder.
    corrupt_restores(&["--rdbcompression", "no"]);
}

#[test]
fn restore_of_corrupt_compressed_payloads_is_refused() {
    corrupt_restores(&[]);
}

fn corrupt_restores(server_args: &[&str]) {
    let mut s = Server::with_args(&[], server_args);
    let mut con = s.conn();
    // A reference string payload checks our CRC against Redis's.
    let _: () = redis::cmd("SET").arg("str").arg("hello").query(&mut con).unwrap();
    let sp: Vec<u8> = redis::cmd("DUMP").arg("str").query(&mut con).unwrap();
    let n = sp.len();
    assert_eq!(crc64_redis(&sp[..n - 8]).to_le_bytes(), sp[n - 8..], "test's CRC64 does not match Redis's");

    let t = claim_new_opts(&mut con, "src1", 600, &["PAYLOAD", "body"]);
    assert_eq!(done(&mut con, "src1", &t, ("RESULT", "a-result\x00bin")), Ok(1));
    claim_new_opts(&mut con, "src2", 600, &["PAYLOAD", "body2"]);
    assert_eq!(once(&mut con, "src3", 600), 1);
    let originals = snapshot_all(&mut con, &["src1", "src2", "src3"]);

    let mut restored_ok = 0;
    let mut refused = 0;
    for src in ["src1", "src2", "src3"] {
        let good: Vec<u8> = redis::cmd("DUMP").arg(src).query(&mut con).unwrap();
        let footer = good[good.len() - 10..good.len() - 8].to_vec(); // RDB version
        let body = &good[..good.len() - 10];
        let make = |body: &[u8]| -> Vec<u8> {
            let mut p = body.to_vec();
            p.extend_from_slice(&footer);
            p.extend_from_slice(&[0u8; 8]);
            fix_dump_crc(&mut p);
            p
        };
        let restore = |con: &mut redis::Connection, payload: &[u8]| -> RedisResult<Value> {
            redis::cmd("RESTORE").arg("bad").arg(0).arg(payload).arg("REPLACE").query(con)
        };
        // Sanity: our re-encoding of the good payload is accepted.
        restore(&mut con, &make(body)).expect("RESTORE of the re-checksummed good payload");

        // Flipped checksum: refused by Redis itself.
        let mut flipped = good.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 0xff;
        assert!(restore(&mut con, &flipped).is_err());

        // Every truncation. Redis hands the whole argument to the loader,
        // the 10-byte footer included, and does not check it was all
        // consumed: a body short by <= 10 bytes may be completed from the
        // footer into some valid record. Shorter than that it cannot be
        // complete: refused.
        for cut in 1..body.len() {
            let p = make(&body[..body.len() - cut]);
            match restore(&mut con, &p) {
                Err(_) => refused += 1,
                Ok(_) if cut <= 10 => {
                    restored_ok += 1;
                    let _: RedisResult<Value> = redis::cmd("IDEM.GET").arg("bad").query(&mut con);
                }
                Ok(v) => panic!(
                    "{src}: RESTORE of a payload truncated by {cut} of {} bytes was accepted ({v:?})",
                    body.len()
                ),
            }
            if cut % 16 == 0 {
                s.assert_alive();
            }
        }
        s.assert_alive();

        // A newer encoding version than the module knows: refused.
        // Layout: type byte 7 (module, v2), then 0x81 + 8-byte big-endian
        // module id whose low 10 bits are the encoding version.
        assert_eq!(body[0], 7, "{src}: not a RDB_TYPE_MODULE_2 payload");
        assert_eq!(body[1], 0x81, "{src}: module id not a 64-bit length");
        let id = u64::from_be_bytes(body[2..10].try_into().unwrap());
        let encver = id & 1023;
        if encver < 1023 {
            let mut newer = body.to_vec();
            newer[2..10].copy_from_slice(&(id + 1).to_be_bytes());
            let r = restore(&mut con, &make(&newer));
            assert!(r.is_err(), "{src}: RESTORE with encoding version {} (module's is {encver}) accepted", encver + 1);
        }

        // Every byte changed to a few values, and trailing garbage: refused
        // or accepted as some record, but never a crash.
        for i in 0..body.len() {
            for val in [0x00u8, 0xff, 0x80, 0x81, 0x7f, body[i] ^ 0x01, body[i].wrapping_add(1)] {
                if val == body[i] {
                    continue;
                }
                let mut b = body.to_vec();
                b[i] = val;
                match restore(&mut con, &make(&b)) {
                    Ok(_) => {
                        restored_ok += 1;
                        // Whatever was accepted must be usable.
                        let _: RedisResult<Value> = redis::cmd("IDEM.GET").arg("bad").query(&mut con);
                        let _: RedisResult<Value> = redis::cmd("IDEM.CLAIM").arg("bad").arg(10).query(&mut con);
                        let _: RedisResult<Value> = redis::cmd("MEMORY").arg("USAGE").arg("bad").query(&mut con);
                        let _: RedisResult<Value> = redis::cmd("DUMP").arg("bad").query(&mut con);
                        let _: RedisResult<Value> = redis::cmd("DEL").arg("bad").query(&mut con);
                    }
                    Err(_) => refused += 1,
                }
            }
            if i % 8 == 0 {
                s.assert_alive();
            }
        }
        let mut longer = body.to_vec();
        longer.extend_from_slice(b"trailing garbage");
        let _ = restore(&mut con, &make(&longer));
        let _: RedisResult<Value> = redis::cmd("IDEM.GET").arg("bad").query(&mut con);
        s.assert_alive();
    }
    eprintln!("corrupt payloads: {refused} refused, {restored_ok} accepted as some record");
    // The sources are untouched, the server alive.
    let now = snapshot_all(&mut con, &["src1", "src2", "src3"]);
    assert_same_records(&originals, &now, TOL_MS, "sources after corrupt RESTOREs");
    s.assert_alive();
    // A full DEBUG RELOAD still works (nothing half-loaded left behind).
    let _: () = redis::cmd("DEL").arg("bad").query::<i64>(&mut con).map(|_| ()).unwrap();
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut con).unwrap();
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
