//! The Functions edition's own tests (functions/idem.lua on servers without
//! the module, unless a test says otherwise): lapsed leases, what only the
//! module can do, telling the editions apart, replicas and AOF, FUNCTION
//! DUMP/RESTORE, ACL, maxmemory and token uniqueness. Its replies are held
//! equal to the module's by tests/functions_differential.rs.
#[allow(dead_code)] // each test binary uses part of common/
mod common;

use common::HISTORY_MS;
use common::cluster::{Cluster, key_slot, reshard, wait_until};
use common::commands::{claim_new, exists, get_fields, pexpiretime};
use common::functions::{
    Stored, fclaim, fclaim_new, ferr, fget, fint, get_fields_any_order, library_server, load_library, stored,
};
use common::reply::{as_bytes, as_token, err_text, expect_err, f_bytes, f_int, f_str, parse_claim, q};
use common::server::{Server, Shutdown, aof_args, wait_replicas};
use redis::{RedisResult, Value};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

const NAMES_THE_MODULE: &str = "needs the redis-idem module";

/// Each key's value and absolute expiry.
fn snapshot(con: &mut redis::Connection, keys: &[&str]) -> Vec<(String, Stored, i64)> {
    keys.iter().map(|k| (k.to_string(), stored(con, k), pexpiretime(con, k))).collect()
}

#[test]
fn a_lapsed_lease_is_expired_retried_and_fenced() {
    let server = library_server(&[]);
    let mut con = server.conn();
    let first = fclaim_new(&mut con, "job", 1);
    let claimed_at = f_int(&fget(&mut con, "job").unwrap(), "claimed_at");
    // The key lives for the lease plus the history (3600 s), exactly.
    assert_eq!(pexpiretime(&mut con, "job"), claimed_at + 1000 + HISTORY_MS);
    std::thread::sleep(Duration::from_millis(1100));
    let fields = fget(&mut con, "job").unwrap();
    assert_eq!((f_str(&fields, "state").as_str(), f_int(&fields, "lease_ms")), ("expired", 0));
    // A lapsed lease is no live claim to release, but may still be extended.
    assert_eq!(fint(&mut con, "idem_release", "job", &first), Ok(0));
    assert_eq!(fint(&mut con, "idem_extend", "job", (&first, 1)), Ok(1));
    assert_eq!(f_str(&fget(&mut con, "job").unwrap(), "state"), "processing");
    std::thread::sleep(Duration::from_millis(1100));
    let (status, token, attempt) = fclaim(&mut con, "job", 1, &[]);
    assert_eq!((status.as_str(), attempt), ("RETRY", 2));
    let second = as_token(&token);
    assert_ne!(first, second);
    // The lapsed holder is fenced off once someone else claimed.
    assert!(ferr(&mut con, "idem_done", "job", &first).starts_with("STALE"));
    assert!(ferr(&mut con, "idem_extend", "job", (&first, 10)).starts_with("STALE"));
    // The latest holder completes it even after its own lease lapsed.
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(fint(&mut con, "idem_done", "job", (&second, "RESULT", "ok", "RETAIN", 50)), Ok(1));
    let fields = fget(&mut con, "job").unwrap();
    assert_eq!((f_str(&fields, "state").as_str(), f_int(&fields, "attempt")), ("done", 2));
    assert_eq!(pexpiretime(&mut con, "job"), f_int(&fields, "done_at") + 50_000);
    let (status, result, attempt) = fclaim(&mut con, "job", 10, &["MAXTRIES", "1"]);
    assert_eq!((status.as_str(), as_bytes(&result), attempt), ("DONE", Some(b"ok".to_vec()), 2));
}

#[test]
fn what_only_the_module_does_is_refused_and_names_it() {
    let server = library_server(&[]);
    let mut con = server.conn();
    for opts in [&["WAIT", "100"][..], &["BLOOM", "seen"], &["PAYLOAD", "p", "wait", "1"]] {
        let error = ferr(&mut con, "idem_claim", "k", (10, opts));
        assert!(error.starts_with("ERR") && error.contains(NAMES_THE_MODULE), "{opts:?}: {error}");
    }
    let error = ferr(&mut con, "idem_done", "k", ("0123456789abcdef0123456789abcdef", "BLOOM", "seen"));
    assert!(error.contains(NAMES_THE_MODULE), "{error}");
    for function in ["idem_mclaim", "idem_mdone", "idem_mrelease"] {
        let error = ferr(&mut con, function, "k", (10,));
        assert!(error.contains(NAMES_THE_MODULE) && error.contains("IDEM.M"), "{function}: {error}");
    }
    // Nothing was written; WAIT 0 does not wait in the module either.
    assert!(!exists(&mut con, "k") && !exists(&mut con, "seen"));
    let (status, _, _) = fclaim(&mut con, "k", 10, &["WAIT", "0"]);
    assert_eq!(status, "NEW");
}

#[test]
fn the_editions_are_told_apart_and_refuse_each_others_keys() {
    // The library alone: FUNCTION LIST and idem_edition say so, and there is
    // no IDEM.CLAIM command.
    let library = library_server(&[]);
    let mut con = library.conn();
    let edition: Vec<String> = redis::cmd("FCALL_RO").arg("idem_edition").arg(0).query(&mut con).unwrap();
    assert_eq!(edition, ["functions", env!("CARGO_PKG_VERSION")]);
    let listed = format!("{:?}", q(&mut con, "FUNCTION", ("LIST", "LIBRARYNAME", "idem")).unwrap());
    for function in ["idem_claim", "idem_done", "idem_release", "idem_extend", "idem_get", "idem_once"] {
        assert!(listed.contains(function), "{function} not in {listed}");
    }
    assert!(listed.contains("no-writes"), "{listed}");
    assert_eq!(q(&mut con, "COMMAND", ("INFO", "IDEM.CLAIM")).unwrap(), Value::Array(vec![Value::Nil]));

    // The module alone: no idem_edition function.
    let module = Server::start();
    let mut mcon = module.conn();
    let error = expect_err(&mut mcon, "FCALL_RO", ("idem_edition", 0));
    assert!(error.contains("Function not found"), "{error}");
    assert!(matches!(q(&mut mcon, "COMMAND", ("INFO", "IDEM.CLAIM")).unwrap(), Value::Array(v) if v[0] != Value::Nil));

    // Both on one server: each edition's keys refuse the other's commands
    // with an error, and stay as they were.
    load_library(&mut mcon);
    claim_new(&mut mcon, "by-module", 100);
    let token = fclaim_new(&mut mcon, "by-library", 100);
    let before = stored(&mut mcon, "by-library");
    for function in ["idem_get", "idem_claim", "idem_once"] {
        let args: &[&str] = match function {
            "idem_get" => &[],
            _ => &["100"],
        };
        let error = ferr(&mut mcon, function, "by-module", args);
        assert!(error.starts_with("WRONGTYPE") && error.contains("redis-idem module"), "{function}: {error}");
    }
    assert!(ferr(&mut mcon, "idem_done", "by-module", &token).contains("redis-idem module"));
    for (command, args) in [("IDEM.GET", vec![]), ("IDEM.CLAIM", vec!["100"]), ("IDEM.DONE", vec![token.as_str()])] {
        let error = expect_err(&mut mcon, command, ("by-library", args));
        assert!(error.starts_with("WRONGTYPE"), "{command}: {error}");
    }
    assert_eq!(stored(&mut mcon, "by-library"), before);
    assert_eq!(f_str(&get_fields(&mut mcon, "by-module"), "state"), "processing");

    // A hash that is not a record is another type for the library, as any
    // hash is for the module; a string too.
    let _: () = redis::cmd("HSET").arg("user-hash").arg("name").arg("x").query(&mut con).unwrap();
    let _: () = redis::cmd("SET").arg("user-string").arg("x").query(&mut con).unwrap();
    for key in ["user-hash", "user-string"] {
        let error = ferr(&mut con, "idem_claim", key, (100,));
        assert_eq!(error, "WRONGTYPE Operation against a key holding the wrong kind of value");
        assert_eq!(ferr(&mut con, "idem_done", key, &token), error);
    }
    assert_eq!(stored(&mut con, "user-hash"), Stored::Hash([(b"name".to_vec(), b"x".to_vec())].into()));
    assert_eq!(stored(&mut con, "user-string"), Stored::String(b"x".to_vec()));
}

/// Claims, completions, releases, extensions and ONCE over a few keys.
fn workload(con: &mut redis::Connection) -> Vec<&'static str> {
    let done = fclaim_new(con, "done", 100);
    assert_eq!(fint(con, "idem_done", "done", (&done, "RESULT", "r\0\n", "RETAIN", 500)), Ok(1));
    let released = fclaim_new(con, "released", 100);
    assert_eq!(fint(con, "idem_release", "released", &released), Ok(1));
    let (status, _, attempt) = fclaim(con, "released", 200, &["PAYLOAD", "p"]);
    assert_eq!((status.as_str(), attempt), ("RETRY", 2));
    let extended = fclaim_new(con, "extended", 100);
    assert_eq!(fint(con, "idem_extend", "extended", (&extended, 900)), Ok(1));
    assert_eq!(fint(con, "idem_once", "once", (700,)), Ok(1));
    assert_eq!(fint(con, "idem_done", "late", ("0123456789abcdef0123456789abcdef",)), Ok(1));
    vec!["done", "released", "extended", "once", "late"]
}

#[test]
fn replica_and_aof_hold_what_the_primary_holds() {
    let mut primary = library_server(&aof_args());
    let replica = Server::without_module(&[]);
    replica.replicaof(&primary);
    let mut con = primary.conn();
    let keys = workload(&mut con);
    wait_replicas(&mut con, 1);
    let on_primary = snapshot(&mut con, &keys);
    let mut rcon = replica.conn();
    assert_eq!(snapshot(&mut rcon, &keys), on_primary, "replica");
    // idem_get is a read: it runs on the replica, through FCALL and FCALL_RO.
    let fields =
        get_fields_any_order(redis::cmd("FCALL_RO").arg("idem_get").arg(1).arg("done").query(&mut rcon).unwrap());
    assert_eq!(f_bytes(&fields.unwrap(), "result"), Some(b"r\0\n".to_vec()));
    assert_eq!(f_str(&fget(&mut rcon, "released").unwrap(), "state"), "processing");
    let error = ferr(&mut rcon, "idem_claim", "new", (10,));
    assert!(error.starts_with("READONLY"), "{error}");
    // The AOF replays the effects: the same tokens and absolute expiries.
    primary.restart(Shutdown::NoSave);
    let mut con = primary.conn();
    assert_eq!(snapshot(&mut con, &keys), on_primary, "after the AOF replay");
    primary.bgrewriteaof(&mut con);
    primary.restart(Shutdown::NoSave);
    let mut con = primary.conn();
    assert_eq!(snapshot(&mut con, &keys), on_primary, "after an AOF rewrite");
    // The library itself came back with the AOF.
    assert_eq!(fint(&mut con, "idem_once", "once", (700,)), Ok(0));
}

#[test]
fn function_dump_restore_and_key_dump_restore() {
    let source = library_server(&[]);
    let mut con = source.conn();
    let keys = workload(&mut con);
    let library: Vec<u8> = redis::cmd("FUNCTION").arg("DUMP").query(&mut con).unwrap();
    let target = Server::without_module(&[]);
    let mut tcon = target.conn();
    let _: () = redis::cmd("FUNCTION").arg("RESTORE").arg(&library).query(&mut tcon).unwrap();
    for key in &keys {
        let payload: Vec<u8> = redis::cmd("DUMP").arg(key).query(&mut con).unwrap();
        let at = pexpiretime(&mut con, key);
        let _: () = redis::cmd("RESTORE").arg(key).arg(at).arg(&payload).arg("ABSTTL").query(&mut tcon).unwrap();
    }
    assert_eq!(snapshot(&mut tcon, &keys), snapshot(&mut con, &keys));
    // The restored record answers as the original: DONE with its result.
    let (status, result, _) = fclaim(&mut tcon, "done", 10, &[]);
    assert_eq!((status.as_str(), as_bytes(&result)), ("DONE", Some(b"r\0\n".to_vec())));
    let (status, _, _) = fclaim(&mut tcon, "extended", 10, &[]);
    assert_eq!(status, "BUSY");
}

/// How a function's call of a command the user may not run is refused:
/// Redis 7.0 `ERR The user executing the script can't run this command or
/// subcommand ...`, Redis 8.2 and Valkey 9.1 `ERR ACL failure in script: User
/// reader has no permissions to run the 'hset' command ...`; `NOPERM` when
/// the user may not run FCALL itself.
fn acl_refusal(error: &str) -> bool {
    error.starts_with("NOPERM")
        || error.starts_with("ERR The user executing the script can't run this command")
        || error.starts_with("ERR ACL failure in script")
}

#[test]
fn a_user_without_write_commands_cannot_claim() {
    let server = library_server(&[]);
    let mut admin = server.conn();
    let token = fclaim_new(&mut admin, "held", 100);
    let _: () =
        redis::cmd("ACL").arg(&["SETUSER", "reader", "on", ">pw", "~*", "+@all", "-@write"]).query(&mut admin).unwrap();
    let client = redis::Client::open(format!("redis://reader:pw@127.0.0.1:{}/", server.port)).unwrap();
    let mut reader = client.get_connection().unwrap();
    // FCALL itself is allowed (@scripting); Redis checks each command the
    // function runs against the user's ACL, so the first write is refused
    // and nothing is written.
    let error = ferr(&mut reader, "idem_claim", "new", (10,));
    assert!(acl_refusal(&error), "{error}");
    assert!(!exists(&mut admin, "new"));
    let before = stored(&mut admin, "held");
    for (function, args) in [("idem_done", vec![token.clone()]), ("idem_release", vec![token.clone()])] {
        let error = ferr(&mut reader, function, "held", &args);
        assert!(acl_refusal(&error), "{function}: {error}");
    }
    assert_eq!(stored(&mut admin, "held"), before);
    // Reads work, also through FCALL_RO; FCALL_RO refuses a write function
    // for every user.
    assert_eq!(f_str(&fget(&mut reader, "held").unwrap(), "state"), "processing");
    let error = expect_err(&mut admin, "FCALL_RO", ("idem_claim", 1, "new", 10));
    assert!(error.contains("write flag"), "{error}");
    // A user without FCALL cannot call any of it.
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "nofcall", "on", ">pw", "~*", "+@all", "-fcall", "-fcall_ro"])
        .query(&mut admin)
        .unwrap();
    let client = redis::Client::open(format!("redis://nofcall:pw@127.0.0.1:{}/", server.port)).unwrap();
    let error = ferr(&mut client.get_connection().unwrap(), "idem_get", "held", &[] as &[&str]);
    assert!(error.starts_with("NOPERM"), "{error}");
}

#[test]
fn over_maxmemory_claims_are_refused_and_completions_go_through() {
    let library = library_server(&[]);
    let module = Server::start();
    let mut con = library.conn();
    let mut mcon = module.conn();
    let token = fclaim_new(&mut con, "job", 100);
    let other = fclaim_new(&mut con, "other", 100);
    for c in [&mut con, &mut mcon] {
        let _: () = redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg(1).query(c).unwrap();
    }
    // CLAIM and ONCE are deny-oom in the module: the same refusal.
    let refused = expect_err(&mut mcon, "IDEM.CLAIM", ("x", 10));
    assert!(refused.starts_with("OOM"), "{refused}");
    assert_eq!(ferr(&mut con, "idem_claim", "x", (10,)), refused);
    assert_eq!(ferr(&mut con, "idem_once", "x", (10,)), expect_err(&mut mcon, "IDEM.ONCE", ("x", 10)));
    // DONE, RELEASE and EXTEND are not.
    assert_eq!(fint(&mut con, "idem_extend", "job", (&token, 200)), Ok(1));
    assert_eq!(fint(&mut con, "idem_done", "job", (&token, "RESULT", "kept")), Ok(1));
    assert_eq!(fint(&mut con, "idem_release", "other", &other), Ok(1));
    let _: () = redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg(0).query(&mut con).unwrap();
    let (status, result, _) = fclaim(&mut con, "job", 10, &[]);
    assert_eq!((status.as_str(), as_bytes(&result)), ("DONE", Some(b"kept".to_vec())));
}

#[test]
fn tokens_never_repeat_for_a_key_across_deletes_reloads_and_restarts() {
    let mut server = library_server(&[]);
    let mut seen = HashSet::new();
    for round in 0..3 {
        let mut con = server.conn();
        for _ in 0..1500 {
            let token = fclaim_new(&mut con, "same-key", 100);
            assert!(seen.insert(token.clone()), "round {round}: token {token} issued twice");
            let _: () = redis::cmd("DEL").arg("same-key").query(&mut con).unwrap();
        }
        // A new library instance (its counter starts again), then a new process.
        match round {
            0 => load_library(&mut con),
            _ => {
                let _: () = redis::cmd("SAVE").query(&mut con).unwrap();
                server.restart(Shutdown::Save);
            }
        }
    }
    assert_eq!(seen.len(), 4500);
}

/// What the claiming threads of the cluster test saw.
#[derive(Default)]
struct Claims {
    answered: u64,
    /// Granted claims (NEW or RETRY) by key: key index -> tokens.
    grants: BTreeMap<usize, Vec<String>>,
    transient: BTreeMap<String, u64>,
    unexpected: Vec<String>,
}

/// Claims random keys of `keys` through the cluster client with a long
/// lease until `stop`: each key may be granted once in the whole run.
fn claim_load(
    client: redis::cluster::ClusterClient,
    keys: Arc<Vec<String>>,
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicU64>,
) -> Claims {
    let mut claims = Claims::default();
    let mut con = None;
    while !stop.load(Ordering::Relaxed) {
        let Some(cc) = con.as_mut() else {
            con = client.get_connection().ok();
            std::thread::sleep(Duration::from_millis(20));
            continue;
        };
        let index = rand::random_range(0..keys.len());
        let reply: RedisResult<Value> =
            redis::cmd("FCALL").arg("idem_claim").arg(1).arg(&keys[index]).arg(600).query(cc);
        match reply {
            Ok(v) => {
                claims.answered += 1;
                answered.fetch_add(1, Ordering::Relaxed);
                let (status, value, attempt) = parse_claim(v);
                match (status.as_str(), attempt) {
                    ("NEW", 1) => claims.grants.entry(index).or_default().push(as_token(&value)),
                    ("BUSY", 1) => {}
                    _ => claims.unexpected.push(format!("{}: {status} {value:?} {attempt}", keys[index])),
                }
            }
            Err(e) => match e.code() {
                // No reply, or the cluster moving under the client: the
                // claim may have run; a retry then finds it BUSY.
                None | Some("TRYAGAIN" | "MOVED" | "ASK" | "CLUSTERDOWN") => {
                    *claims.transient.entry(e.code().unwrap_or("connection").to_string()).or_default() += 1;
                    con = None;
                }
                Some(_) => claims.unexpected.push(format!("{}: {}", keys[index], err_text(&e))),
            },
        }
    }
    claims
}

#[test]
fn resharding_under_load_moves_records_and_grants_each_claim_once() {
    let cluster = Cluster::start();
    let topo = cluster.topology();
    let primaries = topo.primaries();
    // Functions do not travel between cluster nodes: load on every primary
    // (its replica gets it by replication).
    for primary in &primaries {
        load_library(&mut cluster.conn(primary.port));
    }
    let (src, dst) = (primaries[0].clone(), primaries[1].clone());
    let n_move = 1000;
    let moving: HashSet<u16> = src.slot_list()[..n_move].iter().copied().collect();

    // Records in every state in the slots that move.
    let mut sc = cluster.conn(src.port);
    let seeded: Vec<String> =
        (0..).map(|i| format!("seeded:{i}")).filter(|k| moving.contains(&key_slot(k))).take(30).collect();
    for (i, key) in seeded.iter().enumerate() {
        let token = fclaim_new(&mut sc, key, 600);
        match i % 3 {
            0 => assert_eq!(fint(&mut sc, "idem_done", key, (&token, "RESULT", "r")), Ok(1)),
            1 => assert_eq!(fint(&mut sc, "idem_release", key, &token), Ok(1)),
            _ => {}
        }
    }
    let seeded_refs: Vec<&str> = seeded.iter().map(String::as_str).collect();
    let before = snapshot(&mut sc, &seeded_refs);

    // More keys than the run claims: first claims go on throughout the reshard.
    let keys: Arc<Vec<String>> = Arc::new((0..20_000).map(|i| format!("load:{i}")).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let (client, keys, stop, answered) = (cluster.client(), keys.clone(), stop.clone(), answered.clone());
            std::thread::spawn(move || claim_load(client, keys, stop, answered))
        })
        .collect();
    let progress = |n: u64, what: &str| {
        let target = answered.load(Ordering::Relaxed) + n;
        wait_until(what, Duration::from_secs(60), || answered.load(Ordering::Relaxed) >= target);
    };
    progress(500, "claims before the reshard");
    reshard(src.port, &src.id, &dst.id, n_move, Duration::from_secs(120));
    cluster.wait_stable("after the reshard");
    progress(500, "claims after the reshard");
    stop.store(true, Ordering::SeqCst);
    let mut claims = Claims::default();
    for thread in threads {
        let part = thread.join().expect("a claiming thread panicked");
        claims.answered += part.answered;
        for (index, tokens) in part.grants {
            claims.grants.entry(index).or_default().extend(tokens);
        }
        for (kind, n) in part.transient {
            *claims.transient.entry(kind).or_default() += n;
        }
        claims.unexpected.extend(part.unexpected);
    }
    eprintln!(
        "library under a reshard: {} claims answered, {} keys granted, transient {:?}",
        claims.answered,
        claims.grants.len(),
        claims.transient
    );
    assert!(
        claims.unexpected.is_empty(),
        "unexpected replies: {:?}",
        &claims.unexpected[..claims.unexpected.len().min(20)]
    );

    // The slots moved, with the records in them as they were (MIGRATE
    // carries a relative TTL: the expiry may shift by the move's duration).
    let after = cluster.topology();
    assert!(moving.iter().all(|&slot| after.owner(slot).id == dst.id), "the slots did not all move");
    let mut dc = cluster.conn(dst.port);
    for ((key, fields, expiry), (_, moved_fields, moved_expiry)) in before.iter().zip(snapshot(&mut dc, &seeded_refs)) {
        assert_eq!(&moved_fields, fields, "{key} after the reshard");
        assert!((moved_expiry - expiry).abs() < 5_000, "{key}: expiry {expiry} became {moved_expiry}");
    }
    // No key was granted twice, and each granted key is held by its token.
    let mut cc = cluster.cluster_conn();
    for (index, tokens) in &claims.grants {
        assert_eq!(tokens.len(), 1, "{} granted {} times", keys[*index], tokens.len());
        let extended: RedisResult<i64> =
            redis::cmd("FCALL").arg("idem_extend").arg(1).arg(&keys[*index]).arg(&tokens[0]).arg(600).query(&mut cc);
        assert_eq!(extended.map_err(|e| err_text(&e)), Ok(1), "{}", keys[*index]);
    }
}

/// `owner` as idem_get shows it: nil or the bytes.
fn owner_of(con: &mut redis::Connection, key: &str) -> Option<Vec<u8>> {
    f_bytes(&fget(con, key).expect("a record"), "owner")
}

/// OWNER with the module's rules (docs/commands.md): a granted claim
/// stores it, a claim without it clears it, a refused claim changes
/// nothing; kept while processing, expired or released; dropped by DONE
/// and REQUEUE; binary-safe, 1 to 64 bytes.
#[test]
fn owner_is_kept_while_the_work_is_held_and_dropped_by_done_and_requeue() {
    let server = library_server(&[]);
    let mut con = server.conn();
    let binary: &[u8] = b"host\0:\r\n\xff:1";
    let (status, token, _) = fclaim(&mut con, "job", 1, &["OWNER", "worker-a:1", "PAYLOAD", "p"]);
    assert_eq!(status, "NEW");
    let token = as_token(&token);
    assert_eq!(owner_of(&mut con, "job"), Some(b"worker-a:1".to_vec()));
    // Refused claims (BUSY, MISMATCH) change nothing; EXTEND keeps it.
    assert_eq!(fclaim(&mut con, "job", 10, &["OWNER", "worker-b:2"]).0, "BUSY");
    assert_eq!(fclaim(&mut con, "job", 10, &["OWNER", "worker-b:2", "PAYLOAD", "q"]).0, "MISMATCH");
    assert_eq!(fint(&mut con, "idem_extend", "job", (&token, 1)), Ok(1));
    assert_eq!(owner_of(&mut con, "job"), Some(b"worker-a:1".to_vec()));
    // Expired, then released: still who had it last.
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(f_str(&fget(&mut con, "job").unwrap(), "state"), "expired");
    assert_eq!(owner_of(&mut con, "job"), Some(b"worker-a:1".to_vec()));
    assert_eq!(fclaim(&mut con, "job", 10, &["MAXTRIES", "1", "OWNER", "worker-b:2"]).0, "EXHAUSTED");
    assert_eq!(owner_of(&mut con, "job"), Some(b"worker-a:1".to_vec()));
    // A granted claim replaces it, binary-safe; RELEASE keeps it.
    let mut claim = redis::cmd("FCALL");
    claim.arg("idem_claim").arg(1).arg("job").arg(100).arg("owner").arg(binary);
    let (status, token, attempt) = parse_claim(claim.query(&mut con).unwrap());
    assert_eq!((status.as_str(), attempt), ("RETRY", 2));
    assert_eq!(fint(&mut con, "idem_release", "job", as_token(&token)), Ok(1));
    assert_eq!(f_str(&fget(&mut con, "job").unwrap(), "state"), "released");
    assert_eq!(owner_of(&mut con, "job"), Some(binary.to_vec()));
    // A claim without OWNER clears it.
    let (status, _, _) = fclaim(&mut con, "job", 100, &[]);
    assert_eq!(status, "RETRY");
    assert_eq!(owner_of(&mut con, "job"), None);
    // DONE drops it, and so does REQUEUE.
    let (_, token, _) = fclaim(&mut con, "done", 100, &["OWNER", "w"]);
    assert_eq!(fint(&mut con, "idem_done", "done", (as_token(&token), "RESULT", "r")), Ok(1));
    assert_eq!(owner_of(&mut con, "done"), None);
    let (_, token, _) = fclaim(&mut con, "requeued", 100, &["OWNER", "w"]);
    assert_eq!(fint(&mut con, "idem_release", "requeued", as_token(&token)), Ok(1));
    assert_eq!(owner_of(&mut con, "requeued"), Some(b"w".to_vec()));
    assert_eq!(fint(&mut con, "idem_requeue", "requeued", &[] as &[&str]), Ok(1));
    assert_eq!(owner_of(&mut con, "requeued"), None);
    // 64 bytes is the longest.
    let long = "o".repeat(64);
    assert_eq!(fclaim(&mut con, "other", 100, &["OWNER", &long]).0, "NEW");
    assert_eq!(owner_of(&mut con, "other"), Some(long.into_bytes()));
    // Errors, with nothing changed.
    let before = fget(&mut con, "other");
    for (opts, expected) in [
        (vec!["OWNER", ""], "ERR OWNER must be 1 to 64 bytes"),
        (vec!["OWNER", &"o".repeat(65)], "ERR OWNER must be 1 to 64 bytes"),
        (vec!["OWNER", "a", "owner", "b"], "ERR syntax error, option OWNER given twice"),
        (vec!["PAYLOAD", "p", "OWNER"], "ERR syntax error, option OWNER needs a value"),
    ] {
        assert_eq!(ferr(&mut con, "idem_claim", "other", (100, &opts)), expected, "{opts:?}");
        assert_eq!(ferr(&mut con, "idem_claim", "absent", (100, &opts)), expected, "{opts:?}");
    }
    assert!(!exists(&mut con, "absent"));
    assert_eq!(fget(&mut con, "other").map(|f| f["owner"].clone()), before.map(|f| f["owner"].clone()));
}
