//! Trust: no client can write past its ACL, plant a record or a filter
//! through the internal commands, turn finished work into a redo, or make
//! a filter leak or eat the server's memory; every key can move.
//!
//! Each test reproduces a finding of issue 10 on the server it runs on
//! (Redis 7.0 and Valkey 9 in `make test`).
#[allow(dead_code)] // each test binary uses part of common/
mod common;

use common::commands::{
    claim, claim_new, claim_opts, digest_value, done, exists, get_fields, idem_counters, once, pexpiretime,
};
use common::reply::{as_bytes, as_str, err_text, f_bytes, f_str};
use common::server::{Server, ServerKind, ServerVersion, Shutdown, parse_info};
use redis::Value;
use std::time::{Duration, Instant};

/// Whether the server lets modules give commands ACL categories (Redis
/// 7.2+, Valkey 8+).
fn has_module_acl_categories(con: &mut redis::Connection) -> bool {
    let version = ServerVersion::of(con);
    version.kind == ServerKind::Valkey || version.is_at_least(ServerKind::Redis, 7, 2)
}

#[test]
fn the_load_message_says_what_is_supported_and_what_this_server_has() {
    let s = Server::start();
    let log = s.log();
    let loaded =
        log.lines().find(|line| line.contains("redis-idem ") && line.contains(" loaded.")).unwrap_or_else(|| {
            panic!("no load message in the log:\n{log}");
        });
    assert!(
        loaded.contains("supports Redis 7.0.5+ and Valkey 8+ (tested: Redis 7.0.15, Redis 8.2.3, Valkey 9.1)"),
        "{loaded}"
    );
    // What it found is what the server does with the commands' categories.
    let found = if has_module_acl_categories(&mut s.conn()) { "yes" } else { "no" };
    assert!(loaded.contains(&format!("ACL categories on commands (SetCommandACLCategories): {found};")), "{loaded}");
}

/// `ACL SETUSER name on nopass <rules...>` and a connection as that user.
fn user_conn(s: &Server, admin: &mut redis::Connection, name: &str, rules: &[&str]) -> redis::Connection {
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER").arg(name).arg("reset").arg("on").arg("nopass");
    for rule in rules {
        cmd.arg(*rule);
    }
    let _: () = cmd.query(admin).unwrap_or_else(|e| panic!("ACL SETUSER {name} {rules:?}: {e}"));
    let mut con = s.conn();
    let _: () = redis::cmd("AUTH").arg(name).arg("x").query(&mut con).expect("AUTH");
    con
}

/// Runs `args`; `Ok` with the reply or `Err` with the error text.
fn run(con: &mut redis::Connection, args: &[&str]) -> Result<Value, String> {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query::<Value>(con).map_err(|e| err_text(&e))
}

fn assert_noperm(con: &mut redis::Connection, args: &[&str]) {
    match run(con, args) {
        Err(e) if e.starts_with("NOPERM") => {}
        other => panic!("{args:?} must answer NOPERM, got {other:?}"),
    }
}

fn assert_allowed(con: &mut redis::Connection, args: &[&str]) {
    if let Err(e) = run(con, args) {
        assert!(!e.starts_with("NOPERM"), "{args:?} must be allowed, got {e}");
    }
}

/// Every write command of the module, on keys `rec` and `f`.
fn writes(token: &str) -> Vec<Vec<String>> {
    [
        vec!["IDEM.CLAIM", "rec", "10"],
        vec!["IDEM.DONE", "rec", token],
        vec!["IDEM.RELEASE", "rec", token],
        vec!["IDEM.EXTEND", "rec", token, "10"],
        vec!["IDEM.ONCE", "rec", "10"],
        vec!["IDEM.REQUEUE", "rec"],
        vec!["IDEM.BF.RESERVE", "f2", "0.01", "100"],
        vec!["IDEM.BF.ADD", "f", "x"],
        vec!["IDEM.BF.MADD", "f", "x", "y"],
        vec!["IDEM.APPLY", "rec", "blob"],
        vec!["IDEM.BF.APPLY", "f", "blob"],
        vec!["IDEM.BF.LOAD", "f", "blob"],
    ]
    .iter()
    .map(|args| args.iter().map(|a| a.to_string()).collect())
    .collect()
}

const READS: [&[&str]; 5] = [
    &["IDEM.GET", "rec"],
    &["IDEM.BF.EXISTS", "f", "x"],
    &["IDEM.BF.MEXISTS", "f", "x", "y"],
    &["IDEM.BF.INFO", "f"],
    &["IDEM.SCAN", "0"],
];

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

#[test]
fn commands_carry_the_acl_categories_of_their_kind() {
    let s = Server::start();
    let mut admin = s.conn();
    let token = claim_new(&mut admin, "rec", 60);
    let _: i64 = redis::cmd("IDEM.BF.ADD").arg("f").arg("x").query(&mut admin).unwrap();
    if !has_module_acl_categories(&mut admin) {
        // Redis 7.0 has no module categories: the explicit rules of
        // docs/operations.md stand in for them (tested below).
        return;
    }
    let categories = |con: &mut redis::Connection, name: &str| -> Vec<String> {
        let info: Vec<Vec<Value>> = redis::cmd("COMMAND").arg("INFO").arg(name).query(con).unwrap();
        match &info[0][6] {
            Value::Array(items) | Value::Set(items) => items.iter().map(as_str).collect(),
            other => panic!("{name}: ACL categories {other:?}"),
        }
    };
    let idem = redis::cmd("ACL").arg("CAT").query::<Vec<String>>(&mut admin).unwrap().contains(&"idem".to_string());
    for (name, want) in [
        ("IDEM.CLAIM", &["@write", "@fast", "@blocking"][..]),
        ("IDEM.DONE", &["@write", "@slow"]),
        ("IDEM.RELEASE", &["@write", "@fast"]),
        ("IDEM.EXTEND", &["@write", "@fast"]),
        ("IDEM.ONCE", &["@write", "@fast"]),
        ("IDEM.GET", &["@read", "@fast"]),
        ("IDEM.SCAN", &["@read", "@slow"]),
        ("IDEM.REQUEUE", &["@write", "@fast"]),
        ("IDEM.BF.RESERVE", &["@write", "@slow"]),
        ("IDEM.BF.ADD", &["@write", "@fast"]),
        ("IDEM.BF.MADD", &["@write", "@slow"]),
        ("IDEM.BF.EXISTS", &["@read", "@fast"]),
        ("IDEM.BF.MEXISTS", &["@read", "@slow"]),
        ("IDEM.BF.INFO", &["@read", "@fast"]),
        ("IDEM.APPLY", &["@write", "@admin", "@dangerous"]),
        ("IDEM.BF.APPLY", &["@write", "@admin", "@dangerous"]),
        ("IDEM.BF.LOAD", &["@write", "@admin", "@dangerous"]),
    ] {
        let got = categories(&mut admin, name);
        for category in want.iter().chain(if idem { &["@idem"][..] } else { &[][..] }) {
            assert!(got.contains(&category.to_string()), "{name}: {got:?} lacks {category}");
        }
    }

    // The issue's read-only user: everything but writes and dangerous ones.
    let mut read_only = user_conn(&s, &mut admin, "read-only", &["+@all", "-@write", "-@dangerous", "~*"]);
    for args in writes(&token) {
        assert_noperm(&mut read_only, &strs(&args));
    }
    for args in READS {
        assert_allowed(&mut read_only, args);
    }
    let mut reader = user_conn(&s, &mut admin, "reader", &["+@read", "~*"]);
    for args in READS {
        assert_allowed(&mut reader, args);
    }
    assert_noperm(&mut reader, &["IDEM.CLAIM", "rec", "10"]);
    if idem {
        let mut consumer = user_conn(&s, &mut admin, "consumer", &["+@idem", "-@admin", "~*"]);
        assert_allowed(&mut consumer, &["IDEM.CLAIM", "other", "10"]);
        assert_noperm(&mut consumer, &["IDEM.APPLY", "rec", "blob"]);
    }
}

/// The rules docs/operations.md gives for servers without module ACL
/// categories (Redis 7.0); they hold on every server.
#[test]
fn documented_acl_rules_give_consumers_and_readers_what_they_need() {
    let s = Server::start();
    let mut admin = s.conn();
    let token = claim_new(&mut admin, "rec", 60);
    let _: i64 = redis::cmd("IDEM.BF.ADD").arg("f").arg("x").query(&mut admin).unwrap();
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md")).unwrap();
    let rules_of = |user: &str| -> Vec<String> {
        let line = docs
            .lines()
            .find(|line| line.trim_start().starts_with(&format!("ACL SETUSER {user} ")))
            .unwrap_or_else(|| panic!("docs/operations.md gives no ACL SETUSER {user} line"));
        let words: Vec<String> = line.split_whitespace().skip(3).map(String::from).collect();
        words.into_iter().filter(|w| !["reset", "on", "nopass"].contains(&w.as_str()) && !w.starts_with('>')).collect()
    };
    let consumer_rules = rules_of("idem-consumer");
    let mut consumer = user_conn(&s, &mut admin, "idem-consumer", &strs(&consumer_rules));
    for args in writes(&token) {
        let args = strs(&args);
        // Requeueing is the operators' (idem-operator below), not a consumer's.
        if args[0].contains("APPLY") || args[0].contains("LOAD") || args[0] == "IDEM.REQUEUE" {
            assert_noperm(&mut consumer, &args);
        } else {
            assert_allowed(&mut consumer, &args);
        }
    }
    for args in READS {
        assert_allowed(&mut consumer, args);
    }
    let reader_rules = rules_of("idem-reader");
    let mut reader = user_conn(&s, &mut admin, "idem-reader", &strs(&reader_rules));
    for args in READS {
        assert_allowed(&mut reader, args);
    }
    for args in writes(&token) {
        assert_noperm(&mut reader, &strs(&args));
    }
    let operator_rules = rules_of("idem-operator");
    let mut operator = user_conn(&s, &mut admin, "idem-operator", &strs(&operator_rules));
    for args in [&["IDEM.SCAN", "0", "STATE", "released"][..], &["IDEM.GET", "rec"], &["IDEM.REQUEUE", "absent"]] {
        assert_allowed(&mut operator, args);
    }
    assert_noperm(&mut operator, &["IDEM.CLAIM", "rec", "10"]);
}

#[test]
fn claim_needs_only_read_access_to_its_filter() {
    let s = Server::start();
    let mut admin = s.conn();
    let _: i64 = redis::cmd("IDEM.BF.ADD").arg("{o}f").arg("{o}rec0").query(&mut admin).unwrap();
    let mut con = user_conn(&s, &mut admin, "claimer", &["+idem.claim", "+idem.done", "~{o}rec*", "%R~{o}f"]);
    let (status, _, _) = claim_opts(&mut con, "{o}rec1", 60, &["BLOOM", "{o}f"]);
    assert_eq!(status, "NEW");
    let (status, _, _) = claim_opts(&mut con, "{o}rec0", 60, &["BLOOM", "{o}f"]);
    assert_eq!(status, "SEEN");
    // Reading the filter is all CLAIM does; DONE ... BLOOM writes it.
    let token = claim_new(&mut admin, "{o}rec2", 60);
    let e = run(&mut con, &["IDEM.DONE", "{o}rec2", &token, "BLOOM", "{o}f"]).unwrap_err();
    assert!(e.starts_with("NOPERM"), "{e}");
    // A value spelling an option name is no key position.
    let (status, _, _) = claim_opts(&mut con, "{o}rec3", 60, &["PAYLOAD", "BLOOM", "BLOOM", "{o}f"]);
    assert_eq!(status, "NEW");
}

/// A forged `IDEM.APPLY` effect: a permanent done record with the result
/// "PAID" (no expiry; format 2, phase done, a result).
fn forged_done_blob() -> Vec<u8> {
    let mut blob = (-1i64).to_le_bytes().to_vec();
    blob.extend_from_slice(&[2, 2, 2, 1, 0, 0, 0, 4]);
    blob.extend_from_slice(b"PAID");
    blob
}

#[test]
fn clients_cannot_run_the_internal_commands() {
    let s = Server::start();
    let mut con = s.conn();
    let internal = "ERR internal command: only the primary's replication link and AOF loading may run it";
    let forged = forged_done_blob();
    let refused = |con: &mut redis::Connection, cmd: &mut redis::Cmd| {
        let e = cmd.query::<Value>(con).expect_err("an internal command from a client");
        assert_eq!(err_text(&e), internal);
    };
    refused(&mut con, redis::cmd("IDEM.APPLY").arg("order:1").arg(&forged));
    refused(&mut con, redis::cmd("IDEM.BF.APPLY").arg("f").arg(0i64.to_le_bytes().as_slice()).arg("x"));
    refused(&mut con, redis::cmd("IDEM.BF.LOAD").arg("f").arg("payload"));
    // Nor inside MULTI or a script.
    let mut pipe = redis::pipe();
    pipe.atomic().cmd("IDEM.APPLY").arg("order:1").arg(&forged);
    let e = pipe.query::<Value>(&mut con).expect_err("IDEM.APPLY in MULTI");
    assert!(err_text(&e).contains("internal command"), "{e}");
    let script = "return redis.call('IDEM.APPLY', KEYS[1], ARGV[1])";
    let e = redis::cmd("EVAL").arg(script).arg(1).arg("order:1").arg(&forged).query::<Value>(&mut con).unwrap_err();
    assert!(err_text(&e).contains("internal command"), "{e}");
    assert!(!exists(&mut con, "order:1"));
    assert!(!exists(&mut con, "f"));
    // The order is processed normally.
    assert_eq!(claim(&mut con, "order:1", 60).0, "NEW");
}

#[test]
fn a_damaged_aof_loads_what_it_can_and_plants_nothing() {
    let mut s = Server::with_args(&[], &["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let mut con = s.conn();
    assert_eq!(once(&mut con, "before", 600), 1);
    s.stop(Shutdown::Save);
    let dir = s.dir.join("appendonlydir");
    let incr = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .find(|path| path.to_string_lossy().ends_with(".incr.aof"))
        .expect("an incremental AOF file");
    let resp = |args: &[&[u8]]| {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for arg in args {
            out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            out.extend_from_slice(arg);
            out.extend_from_slice(b"\r\n");
        }
        out
    };
    let mut tail = resp(&[b"SELECT", b"0"]);
    tail.extend(resp(&[b"IDEM.APPLY", b"bad-record", b"\xff\xff\xff\xff\xff\xff\xff\xff\x09garbage"]));
    tail.extend(resp(&[b"IDEM.BF.APPLY", b"bad-filter", b"\x01\x02\x03"]));
    tail.extend(resp(&[b"IDEM.BF.LOAD", b"bad-filter", b"not a filter"]));
    tail.extend(resp(&[b"SET", b"after", b"1"]));
    let mut file = std::fs::OpenOptions::new().append(true).open(&incr).unwrap();
    std::io::Write::write_all(&mut file, &tail).unwrap();
    drop(file);
    s.start_again();
    let mut con = s.conn();
    assert!(exists(&mut con, "before"));
    assert!(exists(&mut con, "after"), "the AOF after the damaged commands was loaded");
    assert!(!exists(&mut con, "bad-record"));
    assert!(!exists(&mut con, "bad-filter"));
    s.assert_alive();
}

/// A filter that can take no more items: a filter's own growth never
/// refuses an add, so `idem.bf-max-bytes` goes to its least (4096 bytes
/// of bits) and the filter is filled until ADD refuses for that limit.
fn fill_until_full(con: &mut redis::Connection, key: &str) {
    let _: () = redis::cmd("CONFIG").arg("SET").arg("idem.bf-max-bytes").arg(4096).query(con).unwrap();
    let _: () = redis::cmd("IDEM.BF.RESERVE").arg(key).arg(0.01).arg(1).arg("EXPANSION").arg(1).query(con).unwrap();
    for i in 0..10_000 {
        if let Err(e) = redis::cmd("IDEM.BF.ADD").arg(key).arg(format!("item{i}")).query::<i64>(con) {
            assert!(err_text(&e).contains("idem.bf-max-bytes"), "{key} refused item {i}: {}", err_text(&e));
            return;
        }
    }
    panic!("{key} never filled up");
}

#[test]
fn done_completes_even_when_its_filter_cannot_take_the_item() {
    let s = Server::start();
    let mut con = s.conn();
    fill_until_full(&mut con, "{o}full");
    let _: () = redis::cmd("SET").arg("{o}string").arg("x").query(&mut con).unwrap();
    for (record, filter) in [("{o}a", "{o}full"), ("{o}b", "{o}string")] {
        let token = claim_new(&mut con, record, 60);
        assert_eq!(done(&mut con, record, &token, ("RESULT", "r", "BLOOM", filter)), Ok(5), "{record} BLOOM {filter}");
        assert_eq!(f_str(&get_fields(&mut con, record), "state"), "done");
        assert_eq!(f_bytes(&get_fields(&mut con, record), "result"), Some(b"r".to_vec()));
        // The redelivery is recognised as done: no redo.
        let (status, value, _) = claim(&mut con, record, 60);
        assert_eq!((status.as_str(), as_bytes(&value)), ("DONE", Some(b"r".to_vec())));
    }
    // A filter the configs cannot create.
    let _: () = redis::cmd("CONFIG").arg("SET").arg("idem.bf-capacity").arg(1u64 << 40).query(&mut con).unwrap();
    let token = claim_new(&mut con, "{o}c", 60);
    assert_eq!(done(&mut con, "{o}c", &token, ("BLOOM", "{o}new")), Ok(5));
    assert!(!exists(&mut con, "{o}new"));
    assert_eq!(claim(&mut con, "{o}c", 60).0, "DONE");
    assert_eq!(idem_counters(&mut con)["done_bloom_dropped"], 3);
    // A filter with room takes it: reply 1.
    let _: () = redis::cmd("CONFIG").arg("SET").arg("idem.bf-capacity").arg(1000).query(&mut con).unwrap();
    let token = claim_new(&mut con, "{o}d", 60);
    assert_eq!(done(&mut con, "{o}d", &token, ("BLOOM", "{o}new")), Ok(1));
    assert!(s.log().contains("dropped the BLOOM add of a completed IDEM.DONE"), "{}", s.log_tail(20));
}

#[test]
fn absurd_filter_sizes_are_refused_with_their_cause() {
    let s = Server::with_args(&[], &["--maxmemory", "50mb", "--maxmemory-policy", "noeviction"]);
    let mut con = s.conn();
    let used = |con: &mut redis::Connection| -> i64 {
        parse_info(&redis::cmd("INFO").arg("memory").query::<String>(con).unwrap())["used_memory"].parse().unwrap()
    };
    let before = used(&mut con);
    // A tiny filter at a tiny rate: sized for its capacity (or refused),
    // never hundreds of megabytes.
    if run(&mut con, &["IDEM.BF.RESERVE", "tiny", "5e-9", "1"]).is_ok() {
        let usage: i64 = redis::cmd("MEMORY").arg("USAGE").arg("tiny").query(&mut con).unwrap();
        assert!(usage < 64 << 10, "RESERVE tiny 5e-9 1: {usage} bytes");
        let _: i64 = redis::cmd("DEL").arg("tiny").query(&mut con).unwrap();
    }
    // Allowed by the size limit, but past maxmemory: refused as OOM.
    let _: () = redis::cmd("CONFIG").arg("SET").arg("idem.bf-max-bytes").arg(300 << 20).query(&mut con).unwrap();
    let e = run(&mut con, &["IDEM.BF.RESERVE", "k", "0.01", "100000000"]).unwrap_err();
    assert!(e.starts_with("OOM") && e.contains("maxmemory"), "{e}");
    let e = run(&mut con, &["IDEM.BF.RESERVE", "k", "0.001", "150000000"]).unwrap_err();
    assert!(e.contains("idem.bf-max-bytes"), "{e}");
    assert!(!exists(&mut con, "k"));
    assert!(used(&mut con) < before + (1 << 20), "nothing was allocated");
    // Error rates no filter can be sized for are refused, as configs too.
    for rate in ["5e-324", "1e-15"] {
        assert!(run(&mut con, &["IDEM.BF.RESERVE", "k", rate, "100"]).unwrap_err().starts_with("ERR"), "{rate}");
        assert!(run(&mut con, &["CONFIG", "SET", "idem.bf-error-rate", rate]).is_err(), "{rate}");
    }
}

#[test]
fn a_filter_never_outlives_its_window() {
    let s = Server::start();
    let mut con = s.conn();
    // A user's EXPIRE past the window: the filter still goes when its
    // last shard leaves the window, never lingering empty without a TTL.
    let _: () = redis::cmd("IDEM.BF.RESERVE")
        .arg("f")
        .arg(0.01)
        .arg(100)
        .arg("WINDOW")
        .arg(2)
        .arg("SHARD")
        .arg(1)
        .query(&mut con)
        .unwrap();
    let _: i64 = redis::cmd("IDEM.BF.ADD").arg("f").arg("x").query(&mut con).unwrap();
    let _: i64 = redis::cmd("EXPIRE").arg("f").arg(600).query(&mut con).unwrap();
    std::thread::sleep(Duration::from_millis(3500));
    let ttl: i64 = redis::cmd("TTL").arg("f").query(&mut con).unwrap();
    assert_eq!(ttl, -2, "the filter is gone");

    // Untouched one-second filters: each one either has a TTL or is gone,
    // at every millisecond (the shard's end is the key's expiry). RESERVE
    // and ADD go in one MULTI: a filter reserved in a second's last
    // millisecond may expire before a separate ADD, which would then make
    // a new filter with the defaults (a 7-day window, rightly kept).
    let deadline = Instant::now() + Duration::from_secs(4);
    let mut made = 0;
    while Instant::now() < deadline {
        let mut pipe = redis::pipe();
        pipe.atomic();
        for i in 0..50 {
            let key = format!("s{}", made + i);
            pipe.cmd("IDEM.BF.RESERVE").arg(&key).arg(0.01).arg(10).arg("WINDOW").arg(1).arg("SHARD").arg(1).ignore();
            pipe.cmd("IDEM.BF.ADD").arg(&key).arg("x").ignore();
        }
        let _: () = pipe.query(&mut con).unwrap();
        made += 50;
        let keys: Vec<String> = redis::cmd("KEYS").arg("s*").query(&mut con).unwrap();
        let mut pipe = redis::pipe();
        for key in &keys {
            pipe.cmd("PTTL").arg(key);
        }
        let ttls: Vec<i64> = pipe.query(&mut con).unwrap();
        for (key, ttl) in keys.iter().zip(ttls) {
            assert_ne!(ttl, -1, "{key} has no expiry");
        }
    }
    std::thread::sleep(Duration::from_millis(2500));
    let left: Vec<String> = redis::cmd("KEYS").arg("s*").query(&mut con).unwrap();
    for key in left {
        let info = run(&mut con, &["IDEM.BF.INFO", &key]).unwrap();
        assert_eq!(info, Value::Nil, "{key} outlived its window");
    }
}

/// `DUMP key`, `RESTORE copy <its expiry> payload ABSTTL`, and `MIGRATE`
/// to `other`: the record moves whole (a digest counts the expiry too).
fn assert_moves(con: &mut redis::Connection, key: &str, other: &Server) {
    let payload: Vec<u8> = redis::cmd("DUMP").arg(key).query(con).expect("DUMP");
    let expire_at = pexpiretime(con, key);
    let _: () = redis::cmd("RESTORE")
        .arg(format!("{key}:copy"))
        .arg(expire_at)
        .arg(&payload)
        .arg("ABSTTL")
        .query(con)
        .expect("RESTORE");
    assert_eq!(digest_value(con, key), digest_value(con, &format!("{key}:copy")));
    drop(payload);
    assert_migrates(con, key, other);
}

/// `MIGRATE ... COPY` to `other`: the source server DUMPs the record and
/// the target RESTOREs it, both with the servers' own payload code paths.
fn assert_migrates(con: &mut redis::Connection, key: &str, other: &Server) {
    let reply: String = redis::cmd("MIGRATE")
        .arg("127.0.0.1")
        .arg(other.port)
        .arg(key)
        .arg(0)
        .arg(60_000)
        .arg("COPY")
        .query(con)
        .expect("MIGRATE");
    assert_eq!(reply, "OK");
    let mut there = other.conn();
    assert_eq!(digest_value(&mut there, key), digest_value(con, key));
}

/// What a record adds to its RESULT in a DUMP payload, at most
/// (`RECORD_OVERHEAD` in idem-core): `idem.max-result`'s cap is Redis's
/// default `proto-max-bulk-len` (512 MB) less this.
const RECORD_OVERHEAD: usize = 1024;

#[test]
fn a_record_at_the_result_cap_can_be_dumped_restored_and_migrated() {
    let s = Server::start();
    let mut con = s.conn();
    // The cap leaves room for what a record adds to its RESULT, below the
    // server's default string limit.
    let proto: Vec<String> = redis::cmd("CONFIG").arg("GET").arg("proto-max-bulk-len").query(&mut con).unwrap();
    assert_eq!(proto[1], "536870912", "the default proto-max-bulk-len the cap is made for");
    let e = run(&mut con, &["CONFIG", "SET", "idem.max-result", "536870912"]).unwrap_err();
    assert!(e.starts_with("ERR"), "{e}");
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("idem.max-result")
        .arg(536_870_912 - RECORD_OVERHEAD)
        .query(&mut con)
        .unwrap();

    // The same limit lowered: with proto-max-bulk-len at 2 MB (above 1 MB,
    // where DONE asks the server for it), a RESULT one byte over 2 MB less
    // the overhead is refused and one at it moves whole. The room a record
    // needs does not grow with its RESULT (its length prefixes are 5 bytes
    // from 16 kB to 4 GB), so this is the 512 MB case made cheap.
    let small = Server::with_args(&["max-result", "4194304"], &["--proto-max-bulk-len", "2mb"]);
    let other = Server::with_args(&[], &["--proto-max-bulk-len", "2mb"]);
    let mut con = small.conn();
    let cap = (2 << 20) - RECORD_OVERHEAD;
    let token = claim_new(&mut con, "big", 600);
    let e = done(&mut con, "big", &token, ("RESULT", vec![b'r'; cap + 1])).unwrap_err();
    assert!(e.contains("proto-max-bulk-len"), "{e}");
    assert_eq!(done(&mut con, "big", &token, ("RESULT", vec![b'r'; cap])), Ok(1));
    assert_moves(&mut con, "big", &other);

    // The full size once, on Redis 7 (the first server `make test` runs):
    // MIGRATE makes the server build the 512 MB DUMP payload and the
    // target RESTORE it, which is what the cap is for; the 2 MB case above
    // took the payload through this client too, which at 512 MB cost half
    // a minute of parsing and nothing more to prove. What it adds to that
    // case is the servers' own string limits, the same default on Redis 8
    // and Valkey.
    let version = s.version();
    if !(version.kind == ServerKind::Redis && version.major == 7) {
        eprintln!("{version}: the 512 MB record is moved on Redis 7 only; the 2 MB one here");
        return;
    }
    let other = Server::start();
    let mut con = s.conn();
    let token = claim_new(&mut con, "big", 600);
    assert_eq!(done(&mut con, "big", &token, ("RESULT", vec![b'r'; 536_870_912 - RECORD_OVERHEAD])), Ok(1));
    assert_migrates(&mut con, "big", &other);
}

#[test]
fn a_smaller_proto_max_bulk_len_caps_results_too() {
    let s = Server::with_args(&[], &["--proto-max-bulk-len", "1mb"]);
    let other = Server::with_args(&[], &["--proto-max-bulk-len", "1mb"]);
    let mut con = s.conn();
    let token = claim_new(&mut con, "r", 600);
    // idem.max-result allows 1 MiB, the server's strings do not with a
    // record around it.
    let e = done(&mut con, "r", &token, ("RESULT", vec![b'r'; 1 << 20])).unwrap_err();
    assert!(e.contains("proto-max-bulk-len"), "{e}");
    assert_eq!(f_str(&get_fields(&mut con, "r"), "state"), "processing", "nothing changed");
    assert_eq!(done(&mut con, "r", &token, ("RESULT", vec![b'r'; (1 << 20) - 1024])), Ok(1));
    assert_moves(&mut con, "r", &other);
}
