//! Hostile input: bad arguments and corrupt payloads, for records and
//! filters alike. Every refused command answers its error and leaves every
//! key exactly as it was; every corrupt DUMP payload is refused or restores
//! as a value every command can use; the server survives all of it.
#[allow(dead_code)] // each test binary uses part of common/
mod common;

#[path = "hostile_input/attempts.rs"]
mod attempts;
#[path = "hostile_input/payloads.rs"]
mod payloads;

use common::commands::{
    bf_add, bf_counters, bf_info_opt, bf_madd, bf_mexists, claim, claim_new, claim_new_opts, done, exists, extend,
    get_fields, get_opt, idem_counters, items, once, release, reserve,
};
use common::fixtures::{KeyState, NONE, key_state};
use common::reply::{err_text, f_int, f_str, random_token};
use common::server::Server;
use redis::{RedisResult, Value};

// ---------------------------------------------------------------------------
// Bad arguments: the runner
// ---------------------------------------------------------------------------

/// How the error must look.
enum Want {
    /// The error text is exactly this.
    Exact(String),
    /// The error text starts with this.
    Prefix(&'static str),
    /// The error text equals this, ignoring ASCII case (Redis's own arity
    /// error names the command as the module registered it).
    NoCase(String),
    /// The error text starts with this and contains that (case-insensitive).
    PrefixContains(&'static str, &'static str),
}

fn arity(cmd: &str) -> Want {
    Want::NoCase(format!("ERR wrong number of arguments for '{cmd}' command"))
}

/// A record case: `exact` (when given) is the whole error text, else `want`.
type RecordCase = (Vec<Vec<u8>>, String, Want);

/// Runs every case: each must be refused as wanted and leave the `watched`
/// keys as they were; the server must survive each. Returns the failures.
fn refuse_all(
    s: &mut Server,
    con: &mut redis::Connection,
    watched: &[&str],
    cases: &[(Vec<Vec<u8>>, Want)],
) -> Vec<String> {
    use Want::*;
    let before: Vec<KeyState> = watched.iter().map(|k| key_state(con, k)).collect();
    let mut failures = Vec::new();
    for (args, want) in cases {
        let mut c = redis::cmd(std::str::from_utf8(&args[0]).unwrap());
        for a in &args[1..] {
            c.arg(a.as_slice());
        }
        let shown: Vec<String> = args
            .iter()
            .map(
                |a| if a.len() > 40 { format!("<{} bytes>", a.len()) } else { String::from_utf8_lossy(a).into_owned() },
            )
            .collect();
        let shown = if shown.len() > 12 {
            format!("{:?}... ({} args)", &shown[..6], shown.len())
        } else {
            format!("{shown:?}")
        };
        match c.query::<Value>(con) {
            Ok(v) => failures.push(format!("{shown}: expected an error, got {v:?}")),
            Err(e) => {
                let got = err_text(&e);
                let ok = match want {
                    Exact(x) => &got == x,
                    Prefix(p) => got.starts_with(p),
                    NoCase(x) => got.eq_ignore_ascii_case(x),
                    PrefixContains(p, c) => got.starts_with(p) && got.to_lowercase().contains(&c.to_lowercase()),
                };
                if !ok {
                    let expected = match want {
                        Exact(x) => format!("{x:?}"),
                        Prefix(p) => format!("starting {p:?}"),
                        NoCase(x) => format!("{x:?} (any case)"),
                        PrefixContains(p, c) => format!("starting {p:?} containing {c:?}"),
                    };
                    failures.push(format!("{shown}: expected {expected}, got {got:?}"));
                }
            }
        }
        let after: Vec<KeyState> = watched.iter().map(|k| key_state(con, k)).collect();
        for (b, a) in before.iter().zip(&after) {
            if b != a {
                failures.push(format!("{shown} changed a key:\n  before {b:?}\n  after  {a:?}"));
            }
        }
        if let Some(st) = s.exited() {
            panic!("server died after {shown}: {st}\n{}", s.log_tail(40));
        }
    }
    failures
}

// ---------------------------------------------------------------------------
// Bad arguments to the record commands
// ---------------------------------------------------------------------------

/// Records in every state, and a plain string key: p (processing, with a
/// payload), r (released), d (done), o (ONCE), s (a string); m is missing.
struct RecordKeys {
    p_tok: String,
    r_tok: String,
    d_tok: String,
    /// A well-formed token no claim issued.
    wrong: String,
}

const RECORD_WATCHED: [&str; 6] = ["p", "r", "d", "o", "s", "m"];

fn record_keys(con: &mut redis::Connection) -> RecordKeys {
    let p_tok = claim_new_opts(con, "p", 600, &["PAYLOAD", "body"]);
    let r_tok = claim_new(con, "r", 600);
    assert_eq!(release(con, "r", &r_tok), 1);
    let d_tok = claim_new(con, "d", 600);
    assert_eq!(done(con, "d", &d_tok, ("RESULT", "res", "RETAIN", 900)), Ok(1));
    assert_eq!(once(con, "o", 500), 1);
    let _: () = redis::cmd("SET").arg("s").arg("string-value").arg("PX").arg(400_000).query(con).unwrap();
    RecordKeys { p_tok, r_tok, d_tok, wrong: random_token() }
}

/// Runs the record cases on a fresh server with `record_keys`; checks the
/// refusals, then that the records still work as before.
fn refuse_record_cases(make: impl FnOnce(&RecordKeys) -> Vec<RecordCase>) {
    let mut s = Server::start();
    let mut con = s.conn();
    let keys = record_keys(&mut con);
    let cases: Vec<(Vec<Vec<u8>>, Want)> = make(&keys)
        .into_iter()
        .map(|(args, exact, want)| if exact.is_empty() { (args, want) } else { (args, Want::Exact(exact)) })
        .collect();
    let p_before = key_state(&mut con, "p");
    let counters_before = idem_counters(&mut con);
    let failures = refuse_all(&mut s, &mut con, &RECORD_WATCHED, &cases);
    assert!(failures.is_empty(), "{} bad-input failures:\n{}", failures.len(), failures.join("\n"));
    s.assert_alive();

    // Counters: refused commands count nothing... except STALE and the
    // like, which are replies of their own. Only check no claim was counted.
    let counters_after = idem_counters(&mut con);
    for name in ["claim_new", "claim_retry", "done_completed", "once_new", "release_ok", "extend_ok"] {
        assert_eq!(counters_before.get(name), counters_after.get(name), "counter {name} moved on refused input");
    }

    // Well-formed but wrong tokens on RELEASE: 0, not an error.
    assert_eq!(release(&mut con, "p", &keys.wrong), 0);
    assert_eq!(release(&mut con, "m", &keys.wrong), 0);
    assert!(!exists(&mut con, "m"));
    assert_eq!(key_state(&mut con, "p"), p_before);

    // The real tokens still work: no refused command touched them.
    assert_eq!(extend(&mut con, "p", &keys.p_tok, 600), Ok(1));
    assert_eq!(done(&mut con, "p", &keys.p_tok, NONE), Ok(1));
    let (st, _, _) = claim(&mut con, "r", 10);
    assert_eq!(st, "RETRY");
    s.assert_alive();
}

/// The values the record cases use.
struct Bad {
    tok33: &'static str,
    long_tok: String,
    huge: &'static str,
    huge2: &'static str,
    not_int: &'static str,
}

fn bad() -> Bad {
    Bad {
        tok33: "0123456789abcdef0123456789abcdef0", // 33 bytes
        long_tok: "x".repeat(100),
        huge: "9223372036854775807",
        huge2: "9223372036854775", // * 1000 fits, + now does not
        not_int: "ERR value is not an integer or out of range",
    }
}

/// The command named as registered (upper case), as in Redis's own arity error.
fn invalid_expire(c: &str) -> String {
    format!("ERR invalid expire time in '{}' command", c.to_uppercase())
}

fn b(s: &str) -> Vec<u8> {
    s.as_bytes().to_vec()
}

#[test]
fn record_commands_refuse_the_wrong_number_of_arguments() {
    refuse_record_cases(|k| {
        let p_tok_b = b(&k.p_tok);
        let mut cases: Vec<RecordCase> = Vec::new();
        let mut add = |args: &[&[u8]], exact: Option<String>, want: Want| {
            cases.push((args.iter().map(|a| a.to_vec()).collect(), exact.unwrap_or_default(), want));
        };

        add(&[b"IDEM.CLAIM"], None, arity("idem.claim"));
        add(&[b"IDEM.CLAIM", b"p"], None, arity("idem.claim"));
        add(&[b"IDEM.CLAIM", b"m"], None, arity("idem.claim"));
        add(&[b"IDEM.DONE", b"p"], None, arity("idem.done"));
        add(&[b"IDEM.DONE"], None, arity("idem.done"));
        add(&[b"IDEM.RELEASE", b"p"], None, arity("idem.release"));
        add(&[b"IDEM.RELEASE", b"p", &p_tok_b, b"extra"], None, arity("idem.release"));
        add(&[b"IDEM.EXTEND", b"p", &p_tok_b], None, arity("idem.extend"));
        add(&[b"IDEM.EXTEND", b"p", &p_tok_b, b"10", b"extra"], None, arity("idem.extend"));
        add(&[b"IDEM.GET"], None, arity("idem.get"));
        add(&[b"IDEM.GET", b"p", b"extra"], None, arity("idem.get"));
        add(&[b"IDEM.ONCE", b"m"], None, arity("idem.once"));
        add(&[b"IDEM.ONCE", b"m", b"10", b"extra"], None, arity("idem.once"));
        cases
    });
}

#[test]
fn claim_refuses_bad_leases_and_options() {
    refuse_record_cases(|_| {
        let Bad { huge, huge2, not_int, .. } = bad();
        use Want::*;
        let mut cases: Vec<RecordCase> = Vec::new();
        let mut add = |args: &[&[u8]], exact: Option<String>, want: Want| {
            cases.push((args.iter().map(|a| a.to_vec()).collect(), exact.unwrap_or_default(), want));
        };

        for key in [&b"p"[..], b"r", b"d", b"m"] {
            add(&[b"IDEM.CLAIM", key, b"abc"], Some(not_int.into()), Prefix(""));
            add(&[b"IDEM.CLAIM", key, b"1.5"], Some(not_int.into()), Prefix(""));
            add(&[b"IDEM.CLAIM", key, b""], Some(not_int.into()), Prefix(""));
            add(&[b"IDEM.CLAIM", key, b"99999999999999999999999"], Some(not_int.into()), Prefix(""));
            add(&[b"IDEM.CLAIM", key, b"0"], Some(invalid_expire("idem.claim")), Prefix(""));
            add(&[b"IDEM.CLAIM", key, b"-5"], Some(invalid_expire("idem.claim")), Prefix(""));
            add(&[b"IDEM.CLAIM", key, huge.as_bytes()], Some(invalid_expire("idem.claim")), Prefix(""));
            add(&[b"IDEM.CLAIM", key, huge2.as_bytes()], Some(invalid_expire("idem.claim")), Prefix(""));
        }
        // --- CLAIM options
        for key in [&b"p"[..], b"r", b"m"] {
            add(&[b"IDEM.CLAIM", key, b"10", b"MAXTRIES", b"0"], None, PrefixContains("ERR", "maxtries"));
            add(&[b"IDEM.CLAIM", key, b"10", b"MAXTRIES", b"-1"], None, PrefixContains("ERR", "maxtries"));
            add(&[b"IDEM.CLAIM", key, b"10", b"MAXTRIES", b"abc"], Some(not_int.into()), Prefix(""));
            add(&[b"IDEM.CLAIM", key, b"10", b"MAXTRIES"], None, Prefix("ERR syntax error"));
            add(&[b"IDEM.CLAIM", key, b"10", b"PAYLOAD"], None, Prefix("ERR syntax error"));
            add(&[b"IDEM.CLAIM", key, b"10", b"PAYLOAD", b"body", b"MAXTRIES"], None, Prefix("ERR syntax error"));
            add(&[b"IDEM.CLAIM", key, b"10", b"PAYLOAD", b"a", b"PAYLOAD", b"a"], None, Prefix("ERR syntax error"));
            add(&[b"IDEM.CLAIM", key, b"10", b"MAXTRIES", b"2", b"maxtries", b"3"], None, Prefix("ERR syntax error"));
            add(&[b"IDEM.CLAIM", key, b"10", b"FOO"], None, Prefix("ERR syntax error"));
            add(&[b"IDEM.CLAIM", key, b"10", b"FOO", b"bar"], None, Prefix("ERR syntax error"));
            add(&[b"IDEM.CLAIM", key, b"10", b"PAYLOAD", b"body", b"extra"], None, Prefix("ERR syntax error"));
            add(&[b"IDEM.CLAIM", key, b"10", b"BLOOM"], None, Prefix("ERR syntax error"));
            // OWNER: 1 to 64 bytes, once; binary bytes are no reason to refuse.
            let owner_size = Some("ERR OWNER must be 1 to 64 bytes".to_string());
            add(&[b"IDEM.CLAIM", key, b"10", b"OWNER", b""], owner_size.clone(), Prefix(""));
            add(&[b"IDEM.CLAIM", key, b"10", b"OWNER", &[b'w'; 65]], owner_size.clone(), Prefix(""));
            add(&[b"IDEM.CLAIM", key, b"10", b"OWNER", &[0xff; 65]], owner_size.clone(), Prefix(""));
            add(&[b"IDEM.CLAIM", key, b"10", b"OWNER", b"\0\xff\r\n", b"MAXTRIES", b"0"], None, Prefix("ERR MAXTRIES"));
            let twice = Some("ERR syntax error, option OWNER given twice".to_string());
            add(&[b"IDEM.CLAIM", key, b"10", b"OWNER", b"a", b"owner", b"a"], twice.clone(), Prefix(""));
            add(&[b"IDEM.CLAIM", key, b"10", b"OWNER", b"\0\xff", b"OWNER", b"\0\xff"], twice, Prefix(""));
            add(&[b"IDEM.CLAIM", key, b"10", b"OWNER"], None, Prefix("ERR syntax error, option OWNER needs a value"));
            add(&[b"IDEM.MCLAIM", b"10", b"2", key, b"m", b"OWNER", b""], owner_size, Prefix(""));
        }
        cases
    });
}

#[test]
fn done_refuses_bad_arguments_and_foreign_tokens() {
    refuse_record_cases(|k| {
        let Bad { tok33, long_tok, huge, huge2, not_int } = bad();
        let over_max_result = vec![b'r'; 1_048_577];
        let (p_tok_b, r_tok_b, d_tok_b, wrong_b) = (b(&k.p_tok), b(&k.r_tok), b(&k.d_tok), b(&k.wrong));
        use Want::*;
        let mut cases: Vec<RecordCase> = Vec::new();
        let mut add = |args: &[&[u8]], exact: Option<String>, want: Want| {
            cases.push((args.iter().map(|a| a.to_vec()).collect(), exact.unwrap_or_default(), want));
        };

        for (key, tok) in [(&b"p"[..], &p_tok_b), (b"r", &r_tok_b), (b"d", &d_tok_b), (b"m", &wrong_b)] {
            add(&[b"IDEM.DONE", key, tok, b"RESULT"], None, Prefix("ERR syntax error"));
            add(&[b"IDEM.DONE", key, tok, b"RESULT", b"a", b"RESULT", b"b"], None, Prefix("ERR syntax error"));
            add(&[b"IDEM.DONE", key, tok, b"RETAIN", b"5", b"retain", b"6"], None, Prefix("ERR syntax error"));
            add(&[b"IDEM.DONE", key, tok, b"RETAIN"], None, Prefix("ERR syntax error"));
            add(&[b"IDEM.DONE", key, tok, b"FOO"], None, Prefix("ERR syntax error"));
            add(&[b"IDEM.DONE", key, tok, b"RESULT", b"a", b"junk"], None, Prefix("ERR syntax error"));
            add(&[b"IDEM.DONE", key, tok, b"BLOOM"], None, Prefix("ERR syntax error"));
            add(&[b"IDEM.DONE", key, tok, b"RETAIN", b"0"], Some(invalid_expire("idem.done")), Prefix(""));
            add(&[b"IDEM.DONE", key, tok, b"RETAIN", b"-3"], Some(invalid_expire("idem.done")), Prefix(""));
            add(&[b"IDEM.DONE", key, tok, b"RETAIN", huge.as_bytes()], Some(invalid_expire("idem.done")), Prefix(""));
            add(&[b"IDEM.DONE", key, tok, b"RETAIN", huge2.as_bytes()], Some(invalid_expire("idem.done")), Prefix(""));
            add(&[b"IDEM.DONE", key, tok, b"RETAIN", b"x"], Some(not_int.into()), Prefix(""));
            add(&[b"IDEM.DONE", key, tok, b"RESULT", &over_max_result], None, PrefixContains("ERR", "max-result"));
        }
        add(&[b"IDEM.DONE", b"p", tok33.as_bytes()], Some("ERR invalid token".into()), Prefix(""));
        add(&[b"IDEM.DONE", b"p", long_tok.as_bytes(), b"RESULT", b"x"], Some("ERR invalid token".into()), Prefix(""));
        add(&[b"IDEM.DONE", b"m", tok33.as_bytes()], Some("ERR invalid token".into()), Prefix(""));
        add(&[b"IDEM.DONE", b"p", &wrong_b], None, Prefix("STALE"));
        add(&[b"IDEM.DONE", b"p", &wrong_b, b"RESULT", b"x", b"RETAIN", b"5"], None, Prefix("STALE"));
        add(&[b"IDEM.DONE", b"r", &wrong_b], None, Prefix("STALE"));
        cases
    });
}

#[test]
fn release_extend_and_once_refuse_bad_arguments() {
    refuse_record_cases(|k| {
        let Bad { tok33, long_tok, huge, huge2, not_int } = bad();
        let (p_tok_b, r_tok_b, d_tok_b, wrong_b) = (b(&k.p_tok), b(&k.r_tok), b(&k.d_tok), b(&k.wrong));
        use Want::*;
        let mut cases: Vec<RecordCase> = Vec::new();
        let mut add = |args: &[&[u8]], exact: Option<String>, want: Want| {
            cases.push((args.iter().map(|a| a.to_vec()).collect(), exact.unwrap_or_default(), want));
        };

        add(&[b"IDEM.RELEASE", b"p", tok33.as_bytes()], Some("ERR invalid token".into()), Prefix(""));
        add(&[b"IDEM.RELEASE", b"m", long_tok.as_bytes()], Some("ERR invalid token".into()), Prefix(""));
        // --- EXTEND
        for (key, tok) in [(&b"p"[..], &p_tok_b), (b"m", &wrong_b)] {
            add(&[b"IDEM.EXTEND", key, tok, b"0"], Some(invalid_expire("idem.extend")), Prefix(""));
            add(&[b"IDEM.EXTEND", key, tok, b"-1"], Some(invalid_expire("idem.extend")), Prefix(""));
            add(&[b"IDEM.EXTEND", key, tok, huge.as_bytes()], Some(invalid_expire("idem.extend")), Prefix(""));
            add(&[b"IDEM.EXTEND", key, tok, huge2.as_bytes()], Some(invalid_expire("idem.extend")), Prefix(""));
            add(&[b"IDEM.EXTEND", key, tok, b"ten"], Some(not_int.into()), Prefix(""));
        }
        add(&[b"IDEM.EXTEND", b"p", tok33.as_bytes(), b"10"], Some("ERR invalid token".into()), Prefix(""));
        add(&[b"IDEM.EXTEND", b"p", &wrong_b, b"10"], None, Prefix("STALE"));
        add(&[b"IDEM.EXTEND", b"r", &r_tok_b, b"10"], None, Prefix("STALE"));
        add(&[b"IDEM.EXTEND", b"d", &d_tok_b, b"10"], None, Prefix("STALE"));
        add(&[b"IDEM.EXTEND", b"o", &wrong_b, b"10"], None, Prefix("STALE"));
        add(&[b"IDEM.EXTEND", b"m", &wrong_b, b"10"], None, Prefix("STALE"));
        // --- ONCE
        add(&[b"IDEM.ONCE", b"m", b"0"], Some(invalid_expire("idem.once")), Prefix(""));
        add(&[b"IDEM.ONCE", b"m", b"-1"], Some(invalid_expire("idem.once")), Prefix(""));
        add(&[b"IDEM.ONCE", b"m", huge.as_bytes()], Some(invalid_expire("idem.once")), Prefix(""));
        add(&[b"IDEM.ONCE", b"m", huge2.as_bytes()], Some(invalid_expire("idem.once")), Prefix(""));
        add(&[b"IDEM.ONCE", b"m", b"1e3"], Some(not_int.into()), Prefix(""));
        add(&[b"IDEM.ONCE", b"p", b"0"], Some(invalid_expire("idem.once")), Prefix(""));
        cases
    });
}

#[test]
fn record_and_string_commands_refuse_each_others_keys() {
    refuse_record_cases(|k| {
        let wrong_b = b(&k.wrong);
        use Want::*;
        let mut cases: Vec<RecordCase> = Vec::new();
        let mut add = |args: &[&[u8]], exact: Option<String>, want: Want| {
            cases.push((args.iter().map(|a| a.to_vec()).collect(), exact.unwrap_or_default(), want));
        };

        add(&[b"IDEM.CLAIM", b"s", b"10"], None, Prefix("WRONGTYPE"));
        add(&[b"IDEM.CLAIM", b"s", b"10", b"PAYLOAD", b"x", b"MAXTRIES", b"2"], None, Prefix("WRONGTYPE"));
        add(&[b"IDEM.DONE", b"s", &wrong_b], None, Prefix("WRONGTYPE"));
        add(&[b"IDEM.DONE", b"s", &wrong_b, b"RESULT", b"x"], None, Prefix("WRONGTYPE"));
        add(&[b"IDEM.RELEASE", b"s", &wrong_b], None, Prefix("WRONGTYPE"));
        add(&[b"IDEM.EXTEND", b"s", &wrong_b, b"10"], None, Prefix("WRONGTYPE"));
        add(&[b"IDEM.GET", b"s"], None, Prefix("WRONGTYPE"));
        add(&[b"IDEM.ONCE", b"s", b"10"], None, Prefix("WRONGTYPE"));
        // ... and the other way round: string commands on a record.
        add(&[b"GET", b"p"], None, Prefix("WRONGTYPE"));
        add(&[b"APPEND", b"d", b"x"], None, Prefix("WRONGTYPE"));
        add(&[b"LPUSH", b"o", b"x"], None, Prefix("WRONGTYPE"));
        cases
    });
}

#[test]
fn errors_inside_multi_do_not_half_apply() {
    let mut s = Server::start();
    let mut con = s.conn();
    let tok = claim_new(&mut con, "k", 60);
    let claimed_at = get_fields(&mut con, "k")["claimed_at"].clone();
    // A transaction whose second command fails at run time: the first one
    // applies (Redis semantics), the failing one changes nothing.
    let _ = redis::pipe()
        .atomic()
        .cmd("IDEM.EXTEND")
        .arg("k")
        .arg(&tok)
        .arg(120)
        .cmd("IDEM.DONE")
        .arg("k")
        .arg(&tok)
        .arg("RETAIN")
        .arg(0)
        .query::<Value>(&mut con);
    let f = get_fields(&mut con, "k");
    assert_eq!(f_str(&f, "state"), "processing", "the refused DONE in MULTI applied");
    assert_eq!(f_int(&f, "attempt"), 1);
    assert!(f_int(&f, "lease_ms") > 100_000, "the EXTEND in the transaction did not apply");
    assert_eq!(f["claimed_at"], claimed_at);
    assert_eq!(done(&mut con, "k", &tok, NONE), Ok(1));
    s.assert_alive();
}

#[test]
fn record_commands_survive_garbage_arguments() {
    let mut s = Server::start();
    let mut con = s.conn();
    let tok = claim_new(&mut con, "k", 60);
    let garbage: Vec<Vec<u8>> = vec![
        vec![],
        vec![0],
        vec![0xff; 64],
        b"-0".to_vec(),
        b"+5".to_vec(),
        b" 5".to_vec(),
        b"5 ".to_vec(),
        b"0x10".to_vec(),
        b"-9223372036854775808".to_vec(),
        b"9223372036854775808".to_vec(),
        "é".repeat(20).into_bytes(),
        vec![b'a'; 10_000],
    ];
    let cmds = ["IDEM.CLAIM", "IDEM.DONE", "IDEM.RELEASE", "IDEM.EXTEND", "IDEM.GET", "IDEM.ONCE"];
    for name in cmds {
        for g in &garbage {
            for n in 1..=6 {
                let mut c = redis::cmd(name);
                // key, then n-1 arguments: mixes of garbage and a real token.
                c.arg("k");
                for i in 1..n {
                    if i == 1 && name != "IDEM.CLAIM" && name != "IDEM.ONCE" && n % 2 == 0 {
                        c.arg(&tok);
                    } else {
                        c.arg(g.as_slice());
                    }
                }
                let _ = c.query::<Value>(&mut con);
            }
        }
    }
    s.assert_alive();
    // Whatever was accepted, the record is still a record.
    let _ = get_opt(&mut con, "k");
    s.assert_alive();
}

// ---------------------------------------------------------------------------
// Bad arguments to the filter commands (and the BLOOM option)
// ---------------------------------------------------------------------------

const FILTER_WATCHED: [&str; 5] = ["f", "tiny", "s", "r", "m"]; // m: missing

/// Runs the filter cases on a fresh server holding f (a filter), tiny (a
/// filter that can take no more than 32 items: 32 sub-filters of 1), s (a
/// string) and r (a claimed record, whose token `make` gets); checks the
/// refusals, then that everything still works.
fn refuse_filter_cases(make: impl FnOnce(&str) -> Vec<(Vec<String>, Want)>) {
    refuse_filter_cases_with(&[], make)
}

/// [`refuse_filter_cases`] on a server loaded with `module_args`.
fn refuse_filter_cases_with(module_args: &[&str], make: impl FnOnce(&str) -> Vec<(Vec<String>, Want)>) {
    let mut s = Server::with_args(module_args, &[]);
    let mut con = s.conn();
    reserve(&mut con, "f", "0.01", 1000, &["WINDOW", "3"]);
    bf_madd(&mut con, "f", &items("i", 0..100));
    reserve(&mut con, "tiny", "0.01", 1, &["EXPANSION", "1"]);
    bf_madd(&mut con, "tiny", &["t1", "t2"]);
    let _: () = redis::cmd("SET").arg("s").arg("string-value").arg("PX").arg(400_000).query(&mut con).unwrap();
    let r_tok = claim_new(&mut con, "r", 600);
    let r_tok = r_tok.as_str();
    let cases: Vec<(Vec<Vec<u8>>, Want)> = make(r_tok)
        .into_iter()
        .map(|(args, want)| (args.into_iter().map(String::into_bytes).collect(), want))
        .collect();

    let counters_before = bf_counters(&mut con);
    let failures = refuse_all(&mut s, &mut con, &FILTER_WATCHED, &cases);
    assert!(failures.is_empty(), "{} bad-input failures:\n{}", failures.len(), failures.join("\n"));
    s.assert_alive();
    assert_eq!(bf_counters(&mut con)[..2], counters_before[..2], "refused writes counted adds");
    // Everything still works.
    assert_eq!(bf_madd(&mut con, "tiny", &["t3", "t4"]).len(), 2);
    assert_eq!(bf_mexists(&mut con, "tiny", &["t1", "t2", "t3", "t4"]), vec![1, 1, 1, 1]);
    assert_eq!(bf_add(&mut con, "f", "i1"), 0);
    assert_eq!(done(&mut con, "r", r_tok, ("BLOOM", "f")), Ok(1));
    reserve(&mut con, "m", "0.01", 100, &["WINDOW", "366", "SHARD", "HOUR", "EXPANSION", "1024"]);
    reserve(&mut con, "m2", "0.999", 1, &["WINDOW", "1", "SHARD", "1", "EXPANSION", "1"]);
    s.assert_alive();
}

fn push_case(cases: &mut Vec<(Vec<String>, Want)>, args: &[&str], w: Want) {
    cases.push((args.iter().map(|s| s.to_string()).collect(), w))
}

fn e(s: &str) -> Want {
    Want::Exact(s.to_string())
}

#[test]
fn filter_commands_refuse_the_wrong_number_of_arguments_and_existing_keys() {
    refuse_filter_cases(|_| {
        let exists_err = "ERR key already exists";
        let mut cases = Vec::new();
        let mut add = |args: &[&str], w: Want| push_case(&mut cases, args, w);

        // Arity.
        add(&["IDEM.BF.RESERVE", "m", "0.01"], arity("idem.bf.reserve"));
        add(&["IDEM.BF.RESERVE", "m"], arity("idem.bf.reserve"));
        add(&["IDEM.BF.ADD", "f"], arity("idem.bf.add"));
        add(&["IDEM.BF.ADD", "f", "a", "b"], arity("idem.bf.add"));
        add(&["IDEM.BF.MADD", "f"], arity("idem.bf.madd"));
        add(&["IDEM.BF.MADD", "m"], arity("idem.bf.madd"));
        add(&["IDEM.BF.EXISTS", "f"], arity("idem.bf.exists"));
        add(&["IDEM.BF.EXISTS", "f", "a", "b"], arity("idem.bf.exists"));
        add(&["IDEM.BF.MEXISTS", "f"], arity("idem.bf.mexists"));
        add(&["IDEM.BF.INFO"], arity("idem.bf.info"));
        add(&["IDEM.BF.INFO", "f", "x"], arity("idem.bf.info"));
        // RESERVE on an existing key, of any type.
        for k in ["f", "s", "r", "tiny"] {
            add(&["IDEM.BF.RESERVE", k, "0.01", "100"], e(exists_err));
        }
        cases
    });
}

#[test]
fn reserve_refuses_bad_parameters_and_filters_too_large_to_allocate() {
    refuse_filter_cases(|_| {
        use Want::*;
        let float_err = "ERR value is not a valid float";
        let not_int = "ERR value is not an integer or out of range";
        let er = "ERR error_rate must be between 0 and 1";
        let er_low = "ERR error_rate must be at least 1e-9";
        let cap = "ERR capacity must be at least 1";
        let win = "ERR WINDOW must be between 1 and 366";
        let shard = "ERR SHARD must be DAY, HOUR or a number of seconds >= 1";
        let exp = "ERR EXPANSION must be between 1 and 1024";
        // On an existing filter the arguments may be checked before or after
        // the key: any ERR, as long as nothing changes.
        let ek = |k: &str, s: &str| if k == "m" { Exact(s.to_string()) } else { Prefix("ERR") };
        let mut cases = Vec::new();
        let mut add = |args: &[&str], w: Want| push_case(&mut cases, args, w);

        // error_rate.
        for k in ["m", "f"] {
            for bad in ["0", "1", "-0.1", "1.5", "inf", "-inf", "1e10"] {
                add(&["IDEM.BF.RESERVE", k, bad, "100"], ek(k, er));
            }
            for bad in ["5e-324", "1e-15", "9.9e-10"] {
                add(&["IDEM.BF.RESERVE", k, bad, "100"], ek(k, er_low));
            }
            for bad in ["abc", "", "0.01x", "nan"] {
                add(&["IDEM.BF.RESERVE", k, bad, "100"], ek(k, float_err));
            }
            // capacity.
            add(&["IDEM.BF.RESERVE", k, "0.01", "0"], ek(k, cap));
            add(&["IDEM.BF.RESERVE", k, "0.01", "-5"], ek(k, cap));
            add(&["IDEM.BF.RESERVE", k, "0.01", "abc"], ek(k, not_int));
            add(&["IDEM.BF.RESERVE", k, "0.01", "1.5"], ek(k, not_int));
            add(&["IDEM.BF.RESERVE", k, "0.01", "99999999999999999999999"], ek(k, not_int));
            // WINDOW.
            for bad in ["0", "-1", "367", "99999999999"] {
                add(&["IDEM.BF.RESERVE", k, "0.01", "100", "WINDOW", bad], ek(k, win));
            }
            add(&["IDEM.BF.RESERVE", k, "0.01", "100", "WINDOW", "two"], ek(k, not_int));
            // SHARD.
            for bad in ["0", "-1", "WEEK", "1.5", "", "days", "9999999999999999"] {
                add(&["IDEM.BF.RESERVE", k, "0.01", "100", "SHARD", bad], ek(k, shard));
            }
            // EXPANSION.
            for bad in ["0", "-1", "1025", "99999999999"] {
                add(&["IDEM.BF.RESERVE", k, "0.01", "100", "EXPANSION", bad], ek(k, exp));
            }
            add(&["IDEM.BF.RESERVE", k, "0.01", "100", "EXPANSION", "x"], ek(k, not_int));
            // Options: unknown, repeated, missing a value.
            add(
                &["IDEM.BF.RESERVE", k, "0.01", "100", "FOO", "1"],
                if k == "m" { Prefix("ERR syntax error") } else { Prefix("ERR") },
            );
            add(
                &["IDEM.BF.RESERVE", k, "0.01", "100", "WINDOW"],
                if k == "m" { Prefix("ERR syntax error") } else { Prefix("ERR") },
            );
            add(
                &["IDEM.BF.RESERVE", k, "0.01", "100", "WINDOW", "2", "window", "3"],
                if k == "m" { Prefix("ERR syntax error") } else { Prefix("ERR") },
            );
            add(
                &["IDEM.BF.RESERVE", k, "0.01", "100", "SHARD", "DAY", "SHARD", "HOUR"],
                if k == "m" { Prefix("ERR syntax error") } else { Prefix("ERR") },
            );
            add(
                &["IDEM.BF.RESERVE", k, "0.01", "100", "EXPANSION", "2", "EXPANSION", "2"],
                if k == "m" { Prefix("ERR syntax error") } else { Prefix("ERR") },
            );
            add(
                &["IDEM.BF.RESERVE", k, "0.01", "100", "WINDOW", "2", "SHARD"],
                if k == "m" { Prefix("ERR syntax error") } else { Prefix("ERR") },
            );
            add(
                &["IDEM.BF.RESERVE", k, "0.01", "100", "BLOOM", "x"],
                if k == "m" { Prefix("ERR syntax error") } else { Prefix("ERR") },
            );
        }
        // Too large to allocate.
        add(&["IDEM.BF.RESERVE", "m", "1e-9", "1000000000000000"], Prefix("ERR filter too large"));
        add(&["IDEM.BF.RESERVE", "m", "0.01", "1000000000000000"], Prefix("ERR filter too large"));
        add(&["IDEM.BF.RESERVE", "m", "0.000000001", "9223372036854775807"], Prefix("ERR filter too large"));
        add(&["IDEM.BF.RESERVE", "m", "0.01", "300000000", "WINDOW", "366"], Prefix("ERR filter too large"));
        cases
    });
}

#[test]
fn filter_writes_refuse_overfilling_and_every_command_refuses_the_wrong_type() {
    // A filter grows past its forecast whatever its EXPANSION: what
    // remains to refuse is growth past idem.bf-max-bytes.
    refuse_filter_cases_with(&["bf-max-bytes", "65536"], |_| {
        use Want::*;
        let mut cases = Vec::new();
        let mut add = |args: &[&str], w: Want| push_case(&mut cases, args, w);

        // More items than 64 KiB of bits hold: refused whole.
        let many: Vec<String> = items("many", 0..40_000);
        let mut madd_many = vec!["IDEM.BF.MADD", "tiny"];
        madd_many.extend(many.iter().map(String::as_str));
        add(&madd_many, Prefix("ERR the filter would grow to"));
        // WRONGTYPE on a string and on a record, for every filter command.
        for k in ["s", "r"] {
            add(&["IDEM.BF.ADD", k, "x"], Prefix("WRONGTYPE"));
            add(&["IDEM.BF.MADD", k, "x", "y"], Prefix("WRONGTYPE"));
            add(&["IDEM.BF.EXISTS", k, "x"], Prefix("WRONGTYPE"));
            add(&["IDEM.BF.MEXISTS", k, "x", "y"], Prefix("WRONGTYPE"));
            add(&["IDEM.BF.INFO", k], Prefix("WRONGTYPE"));
        }
        // ... and record / string commands on a filter.
        add(&["IDEM.GET", "f"], Prefix("WRONGTYPE"));
        add(&["IDEM.CLAIM", "f", "10"], Prefix("WRONGTYPE"));
        add(&["IDEM.ONCE", "f", "10"], Prefix("WRONGTYPE"));
        add(&["GET", "f"], Prefix("WRONGTYPE"));
        add(&["LPUSH", "f", "x"], Prefix("WRONGTYPE"));
        // CLAIM / DONE with a bad BLOOM.
        add(&["IDEM.CLAIM", "m", "10", "BLOOM", "s"], Prefix("WRONGTYPE"));
        cases
    });
}

#[test]
fn bloom_option_refuses_bad_filters_and_internal_filter_commands_are_refused() {
    refuse_filter_cases(|r_tok| {
        use Want::*;
        let mut cases = Vec::new();
        let mut add = |args: &[&str], w: Want| push_case(&mut cases, args, w);

        add(&["IDEM.CLAIM", "m", "10", "BLOOM", "r"], Prefix("WRONGTYPE"));
        add(&["IDEM.CLAIM", "r", "10", "BLOOM", "s"], Prefix("WRONGTYPE"));
        add(
            &["IDEM.DONE", "r", r_tok, "RESULT", "x", "BLOOM", "r"],
            e("ERR the BLOOM filter must be another key than the record"),
        );
        add(&["IDEM.CLAIM", "m", "10", "BLOOM", "m"], e("ERR the BLOOM filter must be another key than the record"));
        add(&["IDEM.CLAIM", "m", "10", "BLOOM", "f", "BLOOM", "f"], Prefix("ERR syntax error"));
        add(&["IDEM.DONE", "r", r_tok, "BLOOM", "f", "bloom", "f"], Prefix("ERR syntax error"));
        add(&["IDEM.DONE", "r", r_tok, "BLOOM"], Prefix("ERR syntax error"));
        // The internal commands are refused to clients, whatever they carry
        // (their decoders are fuzzed, and fed damaged AOF files in tests/trust.rs).
        let internal = "ERR internal command: only the primary's replication link and AOF loading may run it";
        add(&["IDEM.BF.APPLY", "f", "abc", "x"], e(internal));
        add(&["IDEM.BF.APPLY", "f", "", "x"], e(internal));
        add(&["IDEM.BF.APPLY", "m", "ABCDEFG\0garbage", "x"], e(internal));
        add(&["IDEM.BF.APPLY", "s", "ABCDEFG\0", "x"], e(internal));
        add(&["IDEM.BF.APPLY", "r", "ABCDEFG\0", "x"], e(internal));
        add(&["IDEM.BF.LOAD", "m", "garbage"], e(internal));
        add(&["IDEM.BF.LOAD", "f", ""], e(internal));
        add(&["IDEM.BF.LOAD", "s", "garbage"], e(internal));
        cases
    });
}

#[test]
fn filter_commands_survive_garbage_arguments() {
    let mut s = Server::start();
    let mut con = s.conn();
    reserve(&mut con, "f", "0.01", 100, &[]);
    let garbage: Vec<Vec<u8>> = vec![
        vec![],
        vec![0],
        vec![0xff; 64],
        b"-0".to_vec(),
        b"1e-320".to_vec(),
        b"4.9e-324".to_vec(),
        b"0.9999999999999999999".to_vec(),
        b"-9223372036854775808".to_vec(),
        b"9223372036854775807".to_vec(),
        b"WINDOW".to_vec(),
        b"SHARD".to_vec(),
        "é".repeat(20).into_bytes(),
        vec![b'a'; 10_000],
    ];
    for name in [
        "IDEM.BF.RESERVE",
        "IDEM.BF.ADD",
        "IDEM.BF.MADD",
        "IDEM.BF.EXISTS",
        "IDEM.BF.MEXISTS",
        "IDEM.BF.INFO",
        "IDEM.BF.APPLY",
        "IDEM.BF.LOAD",
    ] {
        for key in ["f", "new"] {
            for g in &garbage {
                for n in 1..=7 {
                    let mut c = redis::cmd(name);
                    c.arg(key);
                    for i in 1..n {
                        if name == "IDEM.BF.RESERVE" && i == 1 && n % 2 == 0 {
                            c.arg("0.01");
                        } else {
                            c.arg(g.as_slice());
                        }
                    }
                    let _ = c.query::<Value>(&mut con);
                    let _: RedisResult<i64> = redis::cmd("DEL").arg("new").query(&mut con);
                }
            }
        }
        s.assert_alive();
    }
    let _ = bf_info_opt(&mut con, "f");
    s.assert_alive();
}
