//! The batch commands (docs/commands.md, "Batch commands"): `IDEM.MCLAIM`,
//! `IDEM.MDONE` and `IDEM.MRELEASE` answer, per key, what the same single
//! commands answer in key order, and leave the records they leave (checked
//! against a second server running the single commands); one call is one
//! replicated effect, and replicas and the AOF equal the primary; bad
//! arguments fail the whole call with nothing changed; keys of one call
//! share a slot in a cluster.
#[allow(dead_code)] // each test binary uses part of common/
mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::commands::{
    bf_mexists, claim, claim_new, claim_new_opts, digest, done, exists, get_fields, idem_counters, release,
};
use common::reply::{as_bytes, as_int, as_str, as_token, err_text, expect_err, f_bytes, f_int, f_str, random_token};
use common::rng::Rng;
use common::server::{Server, Shutdown, aof_args, wait_replicas};
use redis::Value;

/// A reply element as text: `NEW T 1` (tokens and lease times elided,
/// since they differ between two servers), `DONE res 1`, an integer, or
/// an error's text.
fn element(v: &Value) -> String {
    match v {
        Value::Array(items) if items.len() == 3 => {
            let status = as_str(&items[0]);
            let value = match (status.as_str(), &items[1]) {
                ("NEW" | "SEEN" | "RETRY", token) => {
                    as_token(token);
                    "T".to_string()
                }
                ("BUSY", Value::Int(ms)) => {
                    assert!(*ms > 0, "BUSY with {ms} ms left");
                    "ms".to_string()
                }
                (_, Value::Nil) => "nil".to_string(),
                (_, other) => String::from_utf8_lossy(&as_bytes(other).unwrap()).into_owned(),
            };
            format!("{status} {value} {}", as_int(&items[2]))
        }
        Value::Int(i) => i.to_string(),
        Value::ServerError(e) => format!("{} {}", e.code(), e.details().unwrap_or_default()),
        other => panic!("unexpected reply element {other:?}"),
    }
}

/// A single command's reply as [`element`] writes it.
fn single(con: &mut redis::Connection, cmd: &redis::Cmd) -> String {
    match cmd.query::<Value>(con) {
        Ok(v) => element(&v),
        Err(e) => err_text(&e),
    }
}

/// A batch command's reply elements, error elements included (redis-rs
/// would turn the whole reply into the first element's error).
fn rows(con: &mut redis::Connection, cmd: &redis::Cmd) -> Vec<Value> {
    match redis::ConnectionLike::req_command(con, cmd).unwrap_or_else(|e| panic!("{e}")) {
        Value::Array(items) => items,
        other => panic!("expected an array reply, got {other:?}"),
    }
}

/// The token a claim element granted, if it did.
fn granted(v: &Value) -> Option<String> {
    match v {
        Value::Array(items) if matches!(as_str(&items[0]).as_str(), "NEW" | "SEEN" | "RETRY") => {
            Some(as_token(&items[1]))
        }
        _ => None,
    }
}

/// Records on two servers are the same but for their tokens: every
/// field exact but the times, which the two clocks set a few ms apart.
fn assert_same_but_tokens(a: &mut redis::Connection, b: &mut redis::Connection, keys: &[String], what: &str) {
    for key in keys {
        let (ta, tb): (String, String) =
            (redis::cmd("TYPE").arg(key).query(a).unwrap(), redis::cmd("TYPE").arg(key).query(b).unwrap());
        assert_eq!(ta, tb, "{what}: TYPE of {key}");
        if ta != "idemrecrd" {
            continue;
        }
        let (fa, fb) = (get_fields(a, key), get_fields(b, key));
        for name in ["state", "attempt", "result", "fingerprint"] {
            assert_eq!(fa[name], fb[name], "{what}: {name} of {key}: {fa:?} vs {fb:?}");
        }
        for name in ["lease_ms", "pttl", "claimed_at", "done_at"] {
            let (x, y) = (f_int(&fa, name), f_int(&fb, name));
            assert_eq!(x == 0, y == 0, "{what}: {name} of {key}: {x} vs {y}");
            assert!((x - y).abs() < 3000, "{what}: {name} of {key}: {x} vs {y}");
        }
    }
}

/// The key states a round prepares, by base name, made by single
/// commands on both servers alike.
const STATES: [&str; 11] = [
    "fresh1",
    "fresh2",
    "done",
    "busy",
    "released",
    "lapsed",
    "mism-busy",
    "mism-done",
    "exhausted",
    "string",
    "fresh3",
];

/// Prepares `key` as `state`; returns the token it holds, if any.
fn prepare(con: &mut redis::Connection, key: &str, state: &str) -> Option<String> {
    let p = ["PAYLOAD", "p"];
    let other = ["PAYLOAD", "other"];
    match state {
        "done" => {
            let t = claim_new_opts(con, key, 600, &p);
            assert_eq!(done(con, key, &t, ("RESULT", "res")), Ok(1));
            None
        }
        "busy" => Some(claim_new_opts(con, key, 600, &p)),
        "released" => {
            let t = claim_new(con, key, 600);
            assert_eq!(release(con, key, &t), 1);
            Some(t)
        }
        "lapsed" => Some(claim_new_opts(con, key, 1, &p)),
        "mism-busy" => Some(claim_new_opts(con, key, 600, &other)),
        "mism-done" => {
            let t = claim_new_opts(con, key, 600, &other);
            assert_eq!(done(con, key, &t, ("RESULT", "r")), Ok(1));
            None
        }
        "exhausted" => {
            let t = claim_new(con, key, 600);
            assert_eq!(release(con, key, &t), 1);
            let (status, token, _) = claim(con, key, 600);
            assert_eq!(status, "RETRY");
            assert_eq!(release(con, key, &as_token(&token)), 1);
            Some(as_token(&token))
        }
        "string" => {
            let _: () = redis::cmd("SET").arg(key).arg("x").query(con).unwrap();
            None
        }
        _ => None,
    }
}

/// The live token of each key on each server: `[a, b]`.
type Tokens = HashMap<String, [String; 2]>;

/// A token to send for `key`: the live one (same on both sides), a stale
/// one, or no token at all.
fn pick_token(rng: &mut Rng, tokens: &Tokens, key: &str) -> [String; 2] {
    match (rng.below(10), tokens.get(key)) {
        (0..=6, Some(pair)) => pair.clone(),
        (7 | 8, _) | (0..=6, None) => {
            let stale = random_token();
            [stale.clone(), stale]
        }
        _ => ["not-a-token-not-a-token-not-a-token".into(), "not-a-token-not-a-token-not-a-token".into()],
    }
}

#[test]
fn batches_answer_and_leave_what_single_commands_do() {
    let (sa, sb) = (Server::start(), Server::start());
    let (mut a, mut b) = (sa.conn(), sb.conn());
    let mut rng = Rng(21);
    for round in 0..4 {
        let keys: Vec<String> = STATES.iter().map(|s| format!("r{round}:{s}")).collect();
        let mut tokens = Tokens::new();
        for (key, state) in keys.iter().zip(STATES) {
            let (ta, tb) = (prepare(&mut a, key, state), prepare(&mut b, key, state));
            if let (Some(ta), Some(tb)) = (ta, tb) {
                tokens.insert(key.clone(), [ta, tb]);
            }
        }
        std::thread::sleep(Duration::from_millis(1100)); // the lapsed lease ends
        assert_same_but_tokens(&mut a, &mut b, &keys, "prepared");

        // MCLAIM: random keys, duplicates likely, payloads that match or not.
        let n = rng.range(1, 24) as usize;
        let picked: Vec<&String> = (0..n).map(|_| &keys[rng.index(keys.len())]).collect();
        let payloads: Vec<&str> = (0..n).map(|_| rng.pick(&["p", "other", "p"])).collect();
        let max_tries = rng.chance(50).then_some("2");
        let mut batch = redis::cmd("IDEM.MCLAIM");
        batch.arg(600).arg(n).arg(&picked).arg("PAYLOADS").arg(&payloads);
        if let Some(max) = max_tries {
            batch.arg("MAXTRIES").arg(max);
        }
        let got = rows(&mut a, &batch);
        assert_eq!(got.len(), n);
        for (i, key) in picked.iter().enumerate() {
            let mut one = redis::cmd("IDEM.CLAIM");
            one.arg(*key).arg(600).arg("PAYLOAD").arg(payloads[i]);
            if let Some(max) = max_tries {
                one.arg("MAXTRIES").arg(max);
            }
            let want = one.query::<Value>(&mut b);
            let want_text = want.as_ref().map_or_else(err_text, element);
            assert_eq!(element(&got[i]), want_text, "round {round}, MCLAIM position {i} ({key})");
            if let (Some(ta), Ok(v)) = (granted(&got[i]), &want) {
                tokens.insert(key.to_string(), [ta, granted(v).unwrap()]);
            }
        }
        assert_same_but_tokens(&mut a, &mut b, &keys, &format!("round {round} after MCLAIM"));

        // MDONE, then MRELEASE: the tokens each server issued, stale ones,
        // and strings that are no token.
        for command in ["IDEM.MDONE", "IDEM.MRELEASE"] {
            let n = rng.range(1, 16) as usize;
            let picked: Vec<&String> = (0..n).map(|_| &keys[rng.index(keys.len())]).collect();
            let sent: Vec<[String; 2]> = picked.iter().map(|k| pick_token(&mut rng, &tokens, k)).collect();
            let results: Option<Vec<String>> =
                (command == "IDEM.MDONE" && rng.chance(60)).then(|| (0..n).map(|i| format!("res{i}")).collect());
            let mut batch = redis::cmd(command);
            batch.arg(n);
            for (key, pair) in picked.iter().zip(&sent) {
                batch.arg(*key).arg(&pair[0]);
            }
            if let Some(results) = &results {
                batch.arg("RESULTS").arg(results);
            }
            let got = rows(&mut a, &batch);
            for (i, key) in picked.iter().enumerate() {
                let single_name = if command == "IDEM.MDONE" { "IDEM.DONE" } else { "IDEM.RELEASE" };
                let mut one = redis::cmd(single_name);
                one.arg(*key).arg(&sent[i][1]);
                if let Some(results) = &results {
                    one.arg("RESULT").arg(&results[i]);
                }
                assert_eq!(element(&got[i]), single(&mut b, &one), "round {round}, {command} position {i} ({key})");
            }
            assert_same_but_tokens(&mut a, &mut b, &keys, &format!("round {round} after {command}"));
        }

        // What the records now answer to a claim of every key.
        let got = rows(&mut a, redis::cmd("IDEM.MCLAIM").arg(600).arg(keys.len()).arg(&keys));
        for (i, key) in keys.iter().enumerate() {
            let want = single(&mut b, redis::cmd("IDEM.CLAIM").arg(key).arg(600));
            assert_eq!(element(&got[i]), want, "round {round}, final claim of {key}");
        }
        assert_same_but_tokens(&mut a, &mut b, &keys, &format!("round {round} at the end"));
    }
}

#[test]
fn duplicates_and_per_key_errors_are_answered_in_order() {
    let s = Server::start();
    let mut con = s.conn();
    let _: () = redis::cmd("SET").arg("str").arg("x").query(&mut con).unwrap();
    let got = rows(&mut con, redis::cmd("IDEM.MCLAIM").arg(30).arg(4).arg(&["k", "str", "k", "j"]));
    let texts: Vec<String> = got.iter().map(element).collect();
    assert_eq!(texts[0], "NEW T 1");
    assert!(texts[1].starts_with("WRONGTYPE"), "{texts:?}");
    assert_eq!(texts[2], "BUSY ms 1", "the second occurrence sees the first's claim");
    assert_eq!(texts[3], "NEW T 1");
    let (tk, tj) = (granted(&got[0]).unwrap(), granted(&got[3]).unwrap());

    // A stale token, a result too large and a bad token are the elements
    // of their keys; the others complete.
    let _: () = redis::cmd("CONFIG").arg("SET").arg("idem.max-result").arg(4).query(&mut con).unwrap();
    let got = rows(
        &mut con,
        redis::cmd("IDEM.MDONE")
            .arg(5)
            .arg(&["k", &random_token(), "j", &tj, "k", &tk, "k", &tk, "j", "zz"])
            .arg("RESULTS")
            .arg(&["a", "toolarge", "ok", "agn", "b"]),
    );
    let texts: Vec<String> = got.iter().map(element).collect();
    assert!(texts[0].starts_with("STALE"), "{texts:?}");
    assert!(texts[1].contains("larger than idem.max-result"), "{texts:?}");
    assert_eq!(texts[2..4], ["1".to_string(), "0".to_string()], "completed, then already done");
    assert!(texts[4].starts_with("STALE"), "{texts:?}");
    assert_eq!(f_str(&get_fields(&mut con, "j"), "state"), "processing", "j's failed element left it alone");
    assert_eq!(f_bytes(&get_fields(&mut con, "k"), "result"), Some(b"ok".to_vec()));

    // MRELEASE: the live holder gives back j; a second time answers 0.
    let got = rows(&mut con, redis::cmd("IDEM.MRELEASE").arg(3).arg(&["j", &tj, "j", &tj, "str", &tj]));
    let texts: Vec<String> = got.iter().map(element).collect();
    assert_eq!(texts[..2], ["1".to_string(), "0".to_string()]);
    assert!(texts[2].starts_with("WRONGTYPE"));
    let c = idem_counters(&mut con);
    assert_eq!((c["claim_new"], c["claim_busy"], c["done_completed"], c["done_already"]), (2, 1, 1, 1));
    assert_eq!((c["done_stale"], c["release_ok"], c["release_miss"]), (2, 1, 1));
}

#[test]
fn bloom_turns_new_into_seen_and_mdone_adds_what_it_completed() {
    let s = Server::start();
    let mut con = s.conn();
    let got = rows(&mut con, redis::cmd("IDEM.MCLAIM").arg(30).arg(3).arg(&["a", "b", "c"]).arg("BLOOM").arg("f"));
    let tokens: Vec<String> = got.iter().map(|v| granted(v).unwrap()).collect();
    assert!(got.iter().all(|v| element(v) == "NEW T 1"));
    let got = rows(
        &mut con,
        redis::cmd("IDEM.MDONE")
            .arg(3)
            .arg(&["a", &tokens[0], "b", &random_token(), "c", &tokens[2]])
            .arg("BLOOM")
            .arg("f"),
    );
    assert_eq!(element(&got[0]), "1");
    assert!(element(&got[1]).starts_with("STALE"));
    assert_eq!(bf_mexists(&mut con, "f", &["a", "b", "c"]), vec![1, 0, 1], "only completed keys are added");
    let _: () = redis::cmd("DEL").arg(&["a", "b", "c"]).query(&mut con).unwrap();
    let got = rows(&mut con, redis::cmd("IDEM.MCLAIM").arg(30).arg(3).arg(&["a", "b", "c"]).arg("BLOOM").arg("f"));
    let texts: Vec<String> = got.iter().map(element).collect();
    assert_eq!(texts, ["SEEN T 1", "NEW T 1", "SEEN T 1"]);
    // A filter of another type fails the whole call, before any key.
    let _: () = redis::cmd("SET").arg("g").arg("x").query(&mut con).unwrap();
    let e = expect_err(&mut con, "IDEM.MCLAIM", (30, 1, "new", "BLOOM", "g"));
    assert!(e.starts_with("WRONGTYPE"), "{e}");
    assert!(!exists(&mut con, "new"));
}

#[test]
fn bad_arguments_fail_the_whole_call_and_change_nothing() {
    let s = Server::start();
    let mut con = s.conn();
    let t = claim_new(&mut con, "held", 600);
    let t = t.as_str();
    let before = digest(&mut con);
    let long_owner = "w".repeat(65);
    let cases: Vec<(&str, Vec<&str>, &str)> = vec![
        ("IDEM.MCLAIM", vec!["30", "3", "a", "b"], "ERR syntax error"),
        ("IDEM.MCLAIM", vec!["30", "0", "a"], "ERR numkeys must be between 1 and 10000"),
        ("IDEM.MCLAIM", vec!["30", "-1", "a"], "ERR numkeys must be between 1 and 10000"),
        ("IDEM.MCLAIM", vec!["30", "10001", "a"], "ERR numkeys must be between 1 and 10000"),
        ("IDEM.MCLAIM", vec!["30", "9223372036854775807", "a"], "ERR numkeys must be between 1 and 10000"),
        ("IDEM.MCLAIM", vec!["30", "99999999999999999999", "a"], "ERR value is not an integer"),
        ("IDEM.MCLAIM", vec!["30", "two", "a", "b"], "ERR value is not an integer"),
        ("IDEM.MCLAIM", vec!["0", "1", "a"], "ERR invalid expire time"),
        ("IDEM.MCLAIM", vec!["30", "2", "a", "b", "PAYLOADS", "x"], "ERR syntax error, option PAYLOADS needs 2 values"),
        ("IDEM.MCLAIM", vec!["30", "2", "a", "b", "PAYLOADS", "x", "y", "z"], "ERR syntax error, unknown option 'z'"),
        ("IDEM.MCLAIM", vec!["30", "1", "a", "MAXTRIES", "0"], "ERR MAXTRIES must be a positive integer"),
        ("IDEM.MCLAIM", vec!["30", "1", "a", "WAIT", "10"], "ERR syntax error, unknown option 'WAIT'"),
        ("IDEM.MCLAIM", vec!["30", "2", "a", "b", "BLOOM", "b"], "ERR the BLOOM filter must be another key"),
        ("IDEM.MCLAIM", vec!["30", "1", "a", "BLOOM", "f", "BLOOM", "g"], "ERR syntax error, option BLOOM given twice"),
        ("IDEM.MCLAIM", vec!["30", "2", "held", "a", "OWNER", ""], "ERR OWNER must be 1 to 64 bytes"),
        ("IDEM.MCLAIM", vec!["30", "2", "held", "a", "OWNER", &long_owner], "ERR OWNER must be 1 to 64 bytes"),
        ("IDEM.MCLAIM", vec!["30", "1", "a", "OWNER", "w", "owner", "w"], "ERR syntax error, option OWNER given twice"),
        ("IDEM.MCLAIM", vec!["30", "1", "a", "OWNER"], "ERR syntax error, option OWNER needs a value"),
        ("IDEM.MDONE", vec!["2", "a", t, "b"], "ERR syntax error"),
        ("IDEM.MDONE", vec!["0", "a", t], "ERR numkeys must be between 1 and 10000"),
        ("IDEM.MDONE", vec!["-5", "a", t], "ERR numkeys must be between 1 and 10000"),
        ("IDEM.MDONE", vec!["1", "held", t, "RESULTS"], "ERR syntax error, option RESULTS needs a value"),
        ("IDEM.MDONE", vec!["2", "held", t, "b", t, "RESULTS", "r"], "ERR syntax error, option RESULTS needs 2 values"),
        ("IDEM.MDONE", vec!["1", "held", t, "RETAIN", "0"], "ERR invalid expire time"),
        ("IDEM.MDONE", vec!["1", "held", t, "RESULT", "r"], "ERR syntax error, unknown option 'RESULT'"),
        ("IDEM.MDONE", vec!["1", "held", t, "BLOOM", "held"], "ERR the BLOOM filter must be another key"),
        ("IDEM.MRELEASE", vec!["2", "held", t, "b"], "ERR syntax error"),
        ("IDEM.MRELEASE", vec!["1", "held", t, "extra"], "ERR syntax error"),
        ("IDEM.MRELEASE", vec!["10001", "held", t], "ERR numkeys must be between 1 and 10000"),
        ("IDEM.MAPPLY", vec!["blob", "held"], "ERR internal command"),
    ];
    for (name, args, want) in &cases {
        let e = expect_err(&mut con, name, args);
        assert!(e.starts_with(want), "{name} {args:?}: {e}");
    }
    for name in ["IDEM.MCLAIM", "IDEM.MDONE", "IDEM.MRELEASE"] {
        let e = expect_err(&mut con, name, ("1", "x"));
        assert!(e.contains("wrong number of arguments"), "{name}: {e}");
    }
    assert_eq!(digest(&mut con), before, "no failed call changed anything");
    assert_eq!(f_str(&get_fields(&mut con, "held"), "state"), "processing");

    // The largest batch works.
    let keys: Vec<String> = (0..10_000).map(|i| format!("big:{i}")).collect();
    let got = rows(&mut con, redis::cmd("IDEM.MCLAIM").arg(30).arg(keys.len()).arg(&keys));
    assert_eq!(got.len(), 10_000);
    assert!(got.iter().all(|v| granted(v).is_some()));
}

#[test]
fn mclaim_is_refused_over_maxmemory_and_mdone_completes_dropping_results() {
    let s = Server::start();
    let mut con = s.conn();
    let got = rows(&mut con, redis::cmd("IDEM.MCLAIM").arg(30).arg(2).arg(&["a", "b"]));
    let tokens: Vec<String> = got.iter().map(|v| granted(v).unwrap()).collect();
    let _: () = redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg(1).query(&mut con).unwrap();
    let e = expect_err(&mut con, "IDEM.MCLAIM", (30, 1, "c"));
    assert!(e.starts_with("OOM"), "{e}");
    let got = rows(
        &mut con,
        redis::cmd("IDEM.MDONE").arg(2).arg(&["a", &tokens[0], "b", &tokens[1]]).arg("RESULTS").arg(&["x", "y"]),
    );
    assert_eq!(got.iter().map(element).collect::<Vec<_>>(), ["3", "3"], "completed, result dropped (bit 2)");
    let _: () = redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg(0).query(&mut con).unwrap();
    assert_eq!(f_str(&get_fields(&mut con, "a"), "state"), "done");
    assert_eq!(f_bytes(&get_fields(&mut con, "a"), "result"), None);
    assert_eq!(idem_counters(&mut con)["done_result_dropped"], 2);
}

/// Random batches of every command, duplicates, BLOOM and wrong types.
fn random_batches(con: &mut redis::Connection, rng: &mut Rng, calls: usize) -> usize {
    let keys: Vec<String> = (0..12).map(|i| format!("{{t}}k{i}")).collect();
    let _: () = redis::cmd("SET").arg("{t}str").arg("x").query(con).unwrap();
    let mut tokens: HashMap<String, String> = HashMap::new();
    let mut writing_calls = 0;
    for _ in 0..calls {
        let n = rng.range(1, 10) as usize;
        let mut picked: Vec<&String> = (0..n).map(|_| &keys[rng.index(keys.len())]).collect();
        if rng.chance(10) {
            picked[0] = &keys[0];
        }
        let before: String = digest(con);
        match rng.below(3) {
            0 => {
                let lease = rng.pick(&[1, 600]);
                let mut c = redis::cmd("IDEM.MCLAIM");
                c.arg(lease).arg(n).arg(&picked).arg("PAYLOADS").arg(vec!["p"; n]).arg("BLOOM").arg("{t}f");
                for (key, v) in picked.iter().zip(rows(con, &c)) {
                    if let Some(t) = granted(&v) {
                        tokens.insert(key.to_string(), t);
                    }
                }
            }
            1 => {
                let mut c = redis::cmd("IDEM.MDONE");
                c.arg(n);
                for key in &picked {
                    c.arg(*key).arg(tokens.get(*key).cloned().unwrap_or_else(random_token));
                }
                c.arg("RESULTS").arg(vec!["r"; n]).arg("RETAIN").arg(600).arg("BLOOM").arg("{t}f");
                rows(con, &c);
            }
            _ => {
                let mut c = redis::cmd("IDEM.MRELEASE");
                c.arg(n);
                for key in &picked {
                    c.arg(*key).arg(tokens.get(*key).cloned().unwrap_or_else(random_token));
                }
                rows(con, &c);
            }
        }
        writing_calls += (digest(con) != before) as usize;
        if rng.chance(5) {
            std::thread::sleep(Duration::from_millis(1100));
        }
    }
    writing_calls
}

#[test]
fn replica_and_aof_equal_the_primary_one_effect_per_call() {
    let mut primary = Server::with_args(&[], &aof_args());
    let replica = Server::start();
    replica.replicaof(&primary);
    let mut con = primary.conn();
    let writes = random_batches(&mut con, &mut Rng(7), 60);
    wait_replicas(&mut con, 1);
    let mut rcon = replica.conn();
    let want = digest(&mut con);
    assert_eq!(digest(&mut rcon), want, "the replica equals the primary");
    let stats = replica.info(&mut rcon, "commandstats");
    // Module commands keep their registered case in INFO commandstats.
    let calls = |name: &str| {
        let field = stats.iter().find(|(k, _)| k.eq_ignore_ascii_case(&format!("cmdstat_{name}")));
        field.map_or(0, |(_, v)| v.split(['=', ',']).nth(1).unwrap().parse::<usize>().unwrap())
    };
    assert_eq!(calls("idem.apply"), 0, "batches propagate no single IDEM.APPLY: {stats:?}");
    assert_eq!(calls("idem.mapply"), writes, "each call that changed records is one IDEM.MAPPLY: {stats:?}");
    assert!(writes >= 10, "the run wrote in {writes} calls only");

    primary.restart(Shutdown::NoSave);
    let mut con = primary.conn();
    assert_eq!(digest(&mut con), want, "the AOF replays to the same dataset");
    primary.bgrewriteaof(&mut con);
    primary.restart(Shutdown::NoSave);
    let mut con = primary.conn();
    assert_eq!(digest(&mut con), want, "the rewritten AOF too");
}

#[test]
fn keys_of_one_call_share_a_slot_in_a_cluster() {
    let s = Server::start_cluster_node();
    let mut con = s.conn();
    let t = random_token();
    let t = t.as_str();
    let crossslot = [
        ("IDEM.MCLAIM", vec!["30", "2", "a", "b"]),
        ("IDEM.MCLAIM", vec!["30", "2", "{t}a", "{t}b", "BLOOM", "f"]),
        ("IDEM.MDONE", vec!["2", "{t}a", t, "b", t]),
        ("IDEM.MDONE", vec!["1", "{t}a", t, "BLOOM", "f"]),
        ("IDEM.MRELEASE", vec!["2", "{t}a", t, "b", t]),
    ];
    for (name, args) in &crossslot {
        let e = expect_err(&mut con, name, args);
        assert!(e.starts_with("CROSSSLOT"), "{name} {args:?}: {e}");
    }
    // Tokens, payloads and results are no keys, whatever slot they hash to;
    // a payload spelling BLOOM is a payload.
    let got = rows(
        &mut con,
        redis::cmd("IDEM.MCLAIM").arg(30).arg(2).arg(&["{t}a", "{t}b", "PAYLOADS", "BLOOM", "x", "BLOOM", "{t}f"]),
    );
    let ta = granted(&got[0]).unwrap();
    let got = rows(&mut con, redis::cmd("IDEM.MDONE").arg(2).arg(&["{t}a", &ta, "{t}b", t, "RESULTS", "r", "s"]));
    assert_eq!(element(&got[0]), "1");
    let got = rows(&mut con, redis::cmd("IDEM.MRELEASE").arg(1).arg(&["{t}b", t]));
    assert_eq!(element(&got[0]), "0");
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg("IDEM.MDONE")
        .arg(2)
        .arg(&["x", "BLOOM", "y", "z", "BLOOM", "f"])
        .query(&mut con)
        .unwrap();
    assert_eq!(keys, ["x", "y", "f"]);
}

#[test]
fn acl_checks_every_key_of_a_batch() {
    let s = Server::start();
    let mut con = s.conn();
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "worker", "on", "nopass", "+@all", "~{ok}*", "%R~filter"])
        .query(&mut con)
        .unwrap();
    let mut w = s.conn();
    let _: () = redis::cmd("AUTH").arg("worker").arg("x").query(&mut w).unwrap();
    let got = rows(&mut w, redis::cmd("IDEM.MCLAIM").arg(30).arg(2).arg(&["{ok}a", "{ok}b", "BLOOM", "filter"]));
    assert_eq!(got.len(), 2);
    let e = expect_err(&mut w, "IDEM.MCLAIM", (30, 3, "{ok}c", "{ok}d", "secret"));
    assert!(e.starts_with("NOPERM"), "{e}");
    let e = expect_err(&mut w, "IDEM.MRELEASE", (2, "{ok}a", random_token(), "secret", random_token()));
    assert!(e.starts_with("NOPERM"), "{e}");
    // The filter is read-only to this user: MCLAIM may read it, MDONE may not add to it.
    let e = expect_err(&mut w, "IDEM.MDONE", (1, "{ok}a", random_token(), "BLOOM", "filter"));
    assert!(e.starts_with("NOPERM"), "{e}");
    assert!(!exists(&mut con, "{ok}c"));
}
