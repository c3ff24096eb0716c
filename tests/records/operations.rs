//! Records among the server's own features: configs and module arguments,
//! INFO, keyspace notifications, generic key commands, key positions,
//! tokens across restarts, expiry, MODULE LIST.

use crate::common::HISTORY_MS;
use crate::common::commands::{
    claim, claim_new, claim_new_opts, claim_opts, done, exists, extend, get_fields, get_opt, idem_counters, once,
    pexpiretime, release,
};
use crate::common::fixtures::{NONE, assert_same_record, snapshot};
use crate::common::reply::{as_int, as_str, as_token, err_text, f_int, f_str};
use crate::common::server::{Server, Shutdown};
use redis::Value;
use std::time::Duration;

#[test]
fn config_get_set_and_module_args() {
    let s = Server::with_args(&["retain", "100", "history", "50", "max-result", "2048"], &[]);
    let mut con = s.conn();
    let get = |con: &mut redis::Connection, name: &str| -> String {
        let v: Vec<String> = redis::cmd("CONFIG").arg("GET").arg(name).query(con).unwrap();
        assert_eq!(v.len(), 2, "CONFIG GET {name}: {v:?}");
        v[1].clone()
    };
    assert_eq!(get(&mut con, "idem.retain"), "100");
    assert_eq!(get(&mut con, "idem.history"), "50");
    assert_eq!(get(&mut con, "idem.max-result"), "2048");

    // The configs are used.
    let t = claim_new(&mut con, "a", 10);
    let f = get_fields(&mut con, "a");
    assert_eq!(pexpiretime(&mut con, "a"), f_int(&f, "claimed_at") + 10_000 + 50_000, "history 50");
    assert_eq!(done(&mut con, "a", &t, NONE), Ok(1));
    let f = get_fields(&mut con, "a");
    assert_eq!(pexpiretime(&mut con, "a"), f_int(&f, "done_at") + 100_000, "retain 100");

    let set = |con: &mut redis::Connection, name: &str, value: &str| -> Result<(), String> {
        redis::cmd("CONFIG").arg("SET").arg(name).arg(value).query::<()>(con).map_err(|e| err_text(&e))
    };
    set(&mut con, "idem.retain", "7").unwrap();
    set(&mut con, "idem.history", "3").unwrap();
    set(&mut con, "idem.max-result", "0").unwrap();
    assert_eq!(get(&mut con, "idem.retain"), "7");
    assert_eq!(get(&mut con, "idem.history"), "3");
    assert_eq!(get(&mut con, "idem.max-result"), "0");
    let t = claim_new(&mut con, "b", 10);
    let f = get_fields(&mut con, "b");
    assert_eq!(pexpiretime(&mut con, "b"), f_int(&f, "claimed_at") + 10_000 + 3_000);
    assert_eq!(done(&mut con, "b", &t, NONE), Ok(1));
    let f = get_fields(&mut con, "b");
    assert_eq!(pexpiretime(&mut con, "b"), f_int(&f, "done_at") + 7_000);

    // Bad values are refused and change nothing.
    for (name, value) in [
        ("idem.retain", "0"),
        ("idem.retain", "-1"),
        ("idem.retain", "abc"),
        ("idem.retain", ""),
        ("idem.history", "0"),
        ("idem.history", "-5"),
        ("idem.history", "1.5"),
        ("idem.max-result", "-1"),
        ("idem.max-result", "x"),
    ] {
        let before = get(&mut con, name);
        assert!(set(&mut con, name, value).is_err(), "CONFIG SET {name} {value:?} accepted");
        assert_eq!(get(&mut con, name), before, "CONFIG SET {name} {value:?} changed the value");
    }
}

#[test]
fn bad_module_args_refuse_to_load() {
    // loadmodule arguments are the same configs as CONFIG SET, with the same
    // limits (retain/history 1..=3153600000 s, max-result >= 0): a bad one
    // must stop the module from loading, not be taken as is.
    let cases: [&[&str]; 7] = [
        &["retain", "0"],
        &["history", "-1"],
        &["retain", "99999999999"],
        &["max-result", "-5"],
        &["max-result", "abc"],
        &["retain"],
        &["no-such-config", "1"],
    ];
    let mut accepted = Vec::new();
    for args in cases {
        match Server::try_with_args(args, &[]) {
            Ok(s) => {
                let mut con = s.conn();
                let cfg: Vec<String> = redis::cmd("CONFIG").arg("GET").arg("idem.*").query(&mut con).unwrap();
                accepted.push(format!("loadmodule ... {} -> loaded, CONFIG GET idem.*: {cfg:?}", args.join(" ")));
            }
            Err(log) => assert!(log.contains("odule"), "{args:?}: server exited without a module error:\n{log}"),
        }
    }
    assert!(accepted.is_empty(), "bad loadmodule arguments accepted:\n{}", accepted.join("\n"));
}

#[test]
fn info_idem_counters() {
    let s = Server::start();
    let mut con = s.conn();
    let t1 = claim_new(&mut con, "a", 30); // claim_new
    assert_eq!(claim(&mut con, "a", 30).0, "BUSY"); // claim_busy
    claim_new_opts(&mut con, "b", 30, &["PAYLOAD", "x"]); // claim_new
    assert_eq!(claim_opts(&mut con, "b", 30, &["PAYLOAD", "y"]).0, "MISMATCH");
    assert_eq!(release(&mut con, "a", &t1), 1); // release_ok
    assert_eq!(release(&mut con, "a", &t1), 0); // release_miss
    assert_eq!(claim_opts(&mut con, "a", 30, &["MAXTRIES", "1"]).0, "EXHAUSTED");
    let (s2, v, _) = claim(&mut con, "a", 30); // claim_retry
    assert_eq!(s2, "RETRY");
    let t2 = as_token(&v);
    assert_eq!(extend(&mut con, "a", &t2, 30), Ok(1)); // extend_ok
    assert!(extend(&mut con, "a", &t1, 30).is_err()); // extend_stale
    assert!(done(&mut con, "a", &t1, NONE).is_err()); // done_stale
    assert_eq!(done(&mut con, "a", &t2, NONE), Ok(1)); // done_completed
    assert_eq!(done(&mut con, "a", &t2, NONE), Ok(0)); // done_already
    assert_eq!(claim(&mut con, "a", 30).0, "DONE"); // claim_done
    assert_eq!(once(&mut con, "c", 30), 1); // once_new
    assert_eq!(once(&mut con, "c", 30), 0); // once_exists
    assert_eq!(once(&mut con, "a", 30), 0); // once_exists

    let c = idem_counters(&mut con);
    let expected = [
        ("claim_new", 2),
        ("claim_seen", 0),
        ("claim_mismatch", 1),
        ("claim_done", 1),
        ("claim_busy", 1),
        ("claim_exhausted", 1),
        ("claim_retry", 1),
        ("done_completed", 1),
        ("done_already", 1),
        ("done_stale", 1),
        ("release_ok", 1),
        ("release_miss", 1),
        ("extend_ok", 1),
        ("extend_stale", 1),
        ("once_new", 1),
        ("once_exists", 2),
    ];
    for (name, n) in expected {
        assert_eq!(c.get(name).copied(), Some(n), "INFO idem {name}; all counters: {c:?}");
    }
}

#[test]
fn keyspace_notifications() {
    let s = Server::start();
    let mut con = s.conn();
    let _: () = redis::cmd("CONFIG").arg("SET").arg("notify-keyspace-events").arg("KEA").query(&mut con).unwrap();
    let mut sub = s.conn();
    sub.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut ps = sub.as_pubsub();
    ps.psubscribe("__keyspace@0__:ev:*").unwrap();
    ps.subscribe("__keyevent@0__:idem.claim").unwrap();
    ps.subscribe("__keyevent@0__:idem.done").unwrap();

    let t = claim_new(&mut con, "ev:1", 30);
    assert_eq!(extend(&mut con, "ev:1", &t, 60), Ok(1));
    assert_eq!(release(&mut con, "ev:1", &t), 1);
    let (st, v, _) = claim(&mut con, "ev:1", 30);
    assert_eq!(st, "RETRY");
    assert_eq!(done(&mut con, "ev:1", &as_token(&v), NONE), Ok(1));

    // Expected: 5 keyspace events (claim, extend, release, claim, done) on
    // the key, 3 keyevent messages (claim, claim, done) naming the key.
    let mut keyspace: Vec<String> = Vec::new();
    let mut keyevent: Vec<(String, String)> = Vec::new();
    while keyspace.iter().filter(|e| e.starts_with("idem.")).count() < 5 || keyevent.len() < 3 {
        let msg = match ps.get_message() {
            Ok(m) => m,
            Err(e) => panic!("no more notifications ({e}); keyspace {keyspace:?}, keyevent {keyevent:?}"),
        };
        let channel = msg.get_channel_name().to_string();
        let payload: String = msg.get_payload().unwrap();
        if channel.starts_with("__keyspace@0__:") {
            assert_eq!(channel, "__keyspace@0__:ev:1");
            keyspace.push(payload);
        } else {
            keyevent.push((channel, payload));
        }
    }
    let idem_events: Vec<&str> = keyspace.iter().map(String::as_str).filter(|e| e.starts_with("idem.")).collect();
    assert_eq!(idem_events, ["idem.claim", "idem.extend", "idem.release", "idem.claim", "idem.done"]);
    assert_eq!(
        keyevent,
        [
            ("__keyevent@0__:idem.claim".to_string(), "ev:1".to_string()),
            ("__keyevent@0__:idem.claim".to_string(), "ev:1".to_string()),
            ("__keyevent@0__:idem.done".to_string(), "ev:1".to_string()),
        ]
    );
}

#[test]
fn generic_key_commands() {
    let s = Server::start();
    let mut con = s.conn();
    let t = claim_new_opts(&mut con, "k", 60, &["PAYLOAD", "p"]);
    let ty: String = redis::cmd("TYPE").arg("k").query(&mut con).unwrap();
    assert_eq!(ty.len(), 9, "module type name is 9 characters: {ty:?}");
    assert!(ty != "string" && ty != "none");
    assert!(exists(&mut con, "k"));
    let _: () = redis::cmd("SET").arg("plain").arg("v").query(&mut con).unwrap();
    let (_, found): (String, Vec<String>) =
        redis::cmd("SCAN").arg(0).arg("COUNT").arg(1000).arg("TYPE").arg(&ty).query(&mut con).unwrap();
    assert_eq!(found, vec!["k".to_string()], "SCAN TYPE {ty}");

    // RENAME keeps the record, its expiry and its token.
    let before = snapshot(&mut con, "k");
    let _: () = redis::cmd("RENAME").arg("k").arg("k2").query(&mut con).unwrap();
    let after = snapshot(&mut con, "k2");
    assert_same_record(&before, &after, 1000, "RENAME");
    assert_eq!(extend(&mut con, "k2", &t, 60), Ok(1));

    // EXPIRE / TTL / PERSIST act on the key like any other.
    let _: i64 = redis::cmd("EXPIRE").arg("k2").arg(500).query(&mut con).unwrap();
    let ttl: i64 = redis::cmd("TTL").arg("k2").query(&mut con).unwrap();
    assert!(ttl > 490 && ttl <= 500, "TTL {ttl}");
    let f = get_fields(&mut con, "k2");
    assert!(f_int(&f, "pttl") <= 500_000, "pttl field follows the key's TTL");

    // OBJECT, DEL.
    let _: i64 = redis::cmd("OBJECT").arg("IDLETIME").arg("k2").query(&mut con).unwrap();
    let n: i64 = redis::cmd("DEL").arg("k2").query(&mut con).unwrap();
    assert_eq!(n, 1);
    assert!(get_opt(&mut con, "k2").is_none());

    // UNLINK of a record with a big result.
    let t = claim_new(&mut con, "big", 60);
    assert_eq!(done(&mut con, "big", &t, ("RESULT", vec![7u8; 200_000])), Ok(1));
    let n: i64 = redis::cmd("UNLINK").arg("big").query(&mut con).unwrap();
    assert_eq!(n, 1);
    let _: () = redis::cmd("FLUSHALL").query(&mut con).unwrap();
}

#[test]
fn commands_declare_their_keys() {
    let s = Server::start();
    let mut con = s.conn();
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (vec!["IDEM.CLAIM", "k1", "10"], vec!["k1"]),
        (vec!["IDEM.CLAIM", "k1", "10", "PAYLOAD", "x", "MAXTRIES", "3"], vec!["k1"]),
        (vec!["IDEM.CLAIM", "k1", "10", "PAYLOAD", "BLOOM"], vec!["k1"]),
        (vec!["IDEM.CLAIM", "k1", "10", "OWNER", "BLOOM"], vec!["k1"]),
        (vec!["IDEM.CLAIM", "k1", "10", "OWNER", "BLOOM", "BLOOM", "f"], vec!["k1", "f"]),
        (vec!["IDEM.CLAIM", "k1", "10", "PAYLOAD", "OWNER", "BLOOM", "f"], vec!["k1", "f"]),
        (vec!["IDEM.DONE", "k1", "tok", "RESULT", "r", "RETAIN", "5"], vec!["k1"]),
        (vec!["IDEM.RELEASE", "k1", "tok"], vec!["k1"]),
        (vec!["IDEM.EXTEND", "k1", "tok", "5"], vec!["k1"]),
        (vec!["IDEM.GET", "k1"], vec!["k1"]),
        (vec!["IDEM.ONCE", "k1", "5"], vec!["k1"]),
    ];
    for (args, keys) in cases {
        let got: Vec<String> = redis::cmd("COMMAND")
            .arg("GETKEYS")
            .arg(&args)
            .query(&mut con)
            .unwrap_or_else(|e| panic!("COMMAND GETKEYS {args:?}: {e}"));
        assert_eq!(got, keys, "COMMAND GETKEYS {args:?}");
    }
    // Flags: GET is read-only, the others write.
    let info: Value = redis::cmd("COMMAND").arg("INFO").arg("idem.get").arg("idem.claim").query(&mut con).unwrap();
    let text = format!("{info:?}");
    assert!(text.contains("readonly"), "IDEM.GET should be readonly: {text}");
    assert!(text.contains("write"), "IDEM.CLAIM should be write: {text}");
}

#[test]
fn large_but_valid_times_are_accepted_like_set_ex() {
    // SET EX accepts any time that fits a Unix-ms expiry; so do these.
    let s = Server::start();
    let mut con = s.conn();
    let big: i64 = 1_000_000_000_000; // ~31,700 years
    let t = claim_new(&mut con, "k", big);
    let f = get_fields(&mut con, "k");
    assert_eq!(pexpiretime(&mut con, "k"), f_int(&f, "claimed_at") + big * 1000 + HISTORY_MS);
    assert_eq!(extend(&mut con, "k", &t, big / 2), Ok(1));
    let lease = f_int(&get_fields(&mut con, "k"), "lease_ms");
    assert!(lease > big / 2 * 1000 - 2000 && lease <= big / 2 * 1000, "lease_ms {lease}");
    assert_eq!(done(&mut con, "k", &t, ("RETAIN", big)), Ok(1));
    let f = get_fields(&mut con, "k");
    assert_eq!(pexpiretime(&mut con, "k"), f_int(&f, "done_at") + big * 1000);
    assert_eq!(once(&mut con, "o", big), 1);
    let f = get_fields(&mut con, "o");
    assert_eq!(pexpiretime(&mut con, "o"), f_int(&f, "done_at") + big * 1000);
}

#[test]
fn tokens_differ_across_servers_and_restarts() {
    // Tokens never repeat for a key, also after a restart (with the key
    // gone) and between two servers (a split brain after a failover).
    let mut a = Server::start();
    let b = Server::start();
    let keys: Vec<String> = (0..50).map(|i| format!("k{i}")).collect();
    let mut seen = std::collections::HashSet::new();
    let mut ca = a.conn();
    let mut cb = b.conn();
    for k in &keys {
        assert!(seen.insert(claim_new(&mut ca, k, 60)), "{k}: token repeated");
        assert!(seen.insert(claim_new(&mut cb, k, 60)), "{k}: two servers issued the same token");
    }
    drop(ca);
    a.restart(Shutdown::NoSave);
    let mut ca = a.conn();
    assert!(get_opt(&mut ca, "k0").is_none(), "NOSAVE restart without persistence keeps nothing");
    for k in &keys {
        assert!(seen.insert(claim_new(&mut ca, k, 60)), "{k}: token repeated after a restart");
    }
}

#[test]
fn records_vanish_after_history_and_retention() {
    let s = Server::with_args(&["history", "1"], &[]);
    let mut con = s.conn();
    let t = claim_new(&mut con, "lapsed", 1); // key lives lease 1 s + history 1 s
    let r = claim_new(&mut con, "released", 30);
    assert_eq!(release(&mut con, "released", &r), 1); // lives 1 s from now
    assert_eq!(once(&mut con, "once", 1), 1);
    let d = claim_new(&mut con, "done", 30);
    assert_eq!(done(&mut con, "done", &d, ("RETAIN", 1)), Ok(1));
    std::thread::sleep(Duration::from_millis(1150));
    assert_eq!(f_str(&get_fields(&mut con, "lapsed"), "state"), "expired");
    for k in ["released", "once", "done"] {
        assert!(get_opt(&mut con, k).is_none(), "{k} outlived its history/retention");
    }
    std::thread::sleep(Duration::from_millis(1000));
    assert!(get_opt(&mut con, "lapsed").is_none(), "expired record outlived lease + history");
    // Forgotten: the next claim starts over at attempt 1, with a new token.
    let (status, value, attempt) = claim(&mut con, "lapsed", 30);
    assert_eq!((status.as_str(), attempt), ("NEW", 1));
    assert_ne!(as_token(&value), t);
    let (status, _, attempt) = claim(&mut con, "done", 30);
    assert_eq!((status.as_str(), attempt), ("NEW", 1));
}

#[test]
fn module_list_reports_the_crate_version() {
    // Encoded as Redis modules do: 2.8.2 is 20802.
    let version: Vec<i64> = env!("CARGO_PKG_VERSION").split('.').map(|part| part.parse().unwrap()).collect();
    let expected = version[0] * 10_000 + version[1] * 100 + version[2];
    let server = Server::start();
    let mut con = server.conn();
    let modules: Vec<Vec<Value>> = redis::cmd("MODULE").arg("LIST").query(&mut con).unwrap();
    let idem = modules
        .iter()
        .map(|fields| {
            fields
                .chunks(2)
                .map(|pair| (as_str(&pair[0]), pair[1].clone()))
                .collect::<std::collections::HashMap<_, _>>()
        })
        .find(|fields| fields.get("name").map(as_str).as_deref() == Some("idem"))
        .expect("the module is listed as idem");
    assert_eq!(as_int(&idem["ver"]), expected);
}
