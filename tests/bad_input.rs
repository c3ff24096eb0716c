//! Bad input: every refused command answers its error and leaves every key
//! exactly as it was; the server survives all of it.
mod common;

use common::*;

/// Everything observable about a key, for "unchanged" checks. Time-relative
/// fields (lease_ms, pttl) are left out; PEXPIRETIME is absolute and exact.
#[derive(Debug, PartialEq)]
struct KeyState {
    ty: String,
    pexpiretime: i64,
    get: Option<Vec<(String, Value)>>,
    string_value: Option<Vec<u8>>,
}

fn key_state(con: &mut redis::Connection, key: &str) -> KeyState {
    let ty: String = redis::cmd("TYPE").arg(key).query(con).unwrap();
    let pexpiretime = pexpiretime(con, key);
    let (get, string_value) = match ty.as_str() {
        "none" => (None, None),
        "string" => {
            let v: Vec<u8> = redis::cmd("GET").arg(key).query(con).unwrap();
            (None, Some(v))
        }
        _ => {
            let f = get_fields(con, key);
            let mut v: Vec<(String, Value)> = f.into_iter().filter(|(k, _)| k != "lease_ms" && k != "pttl").collect();
            v.sort_by(|a, b| a.0.cmp(&b.0));
            (Some(v), None)
        }
    };
    KeyState { ty, pexpiretime, get, string_value }
}

/// How the error must look.
enum Want {
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

#[test]
fn bad_inputs_are_refused_and_change_nothing() {
    let mut s = Server::start();
    let mut con = s.conn();

    // Keys in every state, and a plain string key.
    let p_tok = claim_new_opts(&mut con, "p", 600, &["PAYLOAD", "body"]);
    let r_tok = claim_new(&mut con, "r", 600);
    assert_eq!(release(&mut con, "r", &r_tok), 1);
    let d_tok = claim_new(&mut con, "d", 600);
    assert_eq!(done(&mut con, "d", &d_tok, ("RESULT", "res", "RETAIN", 900)), Ok(1));
    assert_eq!(once(&mut con, "o", 500), 1);
    let _: () = redis::cmd("SET").arg("s").arg("string-value").arg("PX").arg(400_000).query(&mut con).unwrap();
    let watched = ["p", "r", "d", "o", "s", "m"]; // m: missing

    let tok33 = "0123456789abcdef0123456789abcdef0"; // 33 bytes
    let long_tok = "x".repeat(100);
    let wrong = random_token();
    let huge = "9223372036854775807";
    let huge2 = "9223372036854775"; // * 1000 fits, + now does not
    let over_max_result = vec![b'r'; 1_048_577];

    use Want::*;
    // The command named as registered (upper case), as in Redis's own arity error.
    let invalid_expire = |c: &str| format!("ERR invalid expire time in '{}' command", c.to_uppercase());
    let not_int = "ERR value is not an integer or out of range";

    // (arguments, expected error)
    let mut cases: Vec<(Vec<Vec<u8>>, String, Want)> = Vec::new();
    let mut add = |args: &[&[u8]], exact: Option<String>, want: Want| {
        cases.push((args.iter().map(|a| a.to_vec()).collect(), exact.unwrap_or_default(), want));
    };
    let b = |s: &str| s.as_bytes().to_vec();
    let (p_tok_b, r_tok_b, d_tok_b, wrong_b) = (b(&p_tok), b(&r_tok), b(&d_tok), b(&wrong));

    // --- arity
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

    // --- CLAIM lease
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
    }
    // --- DONE (with the real token: only the bad argument stops it)
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
    // --- RELEASE
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
    // --- WRONGTYPE on a string key, for every command
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

    let before: Vec<KeyState> = watched.iter().map(|k| key_state(&mut con, k)).collect();
    let counters_before = idem_counters(&mut con);
    let mut failures = Vec::new();
    for (args, exact, want) in &cases {
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
        let got = match c.query::<Value>(&mut con) {
            Ok(v) => {
                failures.push(format!("{shown:?}: expected an error, got {v:?}"));
                continue;
            }
            Err(e) => err_text(&e),
        };
        let ok = if !exact.is_empty() {
            &got == exact
        } else {
            match want {
                Prefix(p) => got.starts_with(p),
                NoCase(e) => got.eq_ignore_ascii_case(e),
                PrefixContains(p, c) => got.starts_with(p) && got.to_lowercase().contains(&c.to_lowercase()),
            }
        };
        if !ok {
            let expected = if exact.is_empty() {
                match want {
                    Prefix(p) => format!("starting {p:?}"),
                    NoCase(e) => format!("{e:?} (any case)"),
                    PrefixContains(p, c) => format!("starting {p:?} containing {c:?}"),
                }
            } else {
                format!("{exact:?}")
            };
            failures.push(format!("{shown:?}: expected {expected}, got {got:?}"));
        }
        let after: Vec<KeyState> = watched.iter().map(|k| key_state(&mut con, k)).collect();
        for (b, a) in before.iter().zip(&after) {
            if b != a {
                failures.push(format!("{shown:?} changed a key:\n  before {b:?}\n  after  {a:?}"));
            }
        }
    }
    // The real tokens still work: no refused command touched them.
    assert!(failures.is_empty(), "{} bad-input failures:\n{}", failures.len(), failures.join("\n"));
    s.assert_alive();

    // Counters: refused commands count nothing... except STALE and the
    // like, which are replies of their own. Only check no claim was counted.
    let counters_after = idem_counters(&mut con);
    for name in ["claim_new", "claim_retry", "done_completed", "once_new", "release_ok", "extend_ok"] {
        assert_eq!(counters_before.get(name), counters_after.get(name), "counter {name} moved on refused input");
    }

    // Well-formed but wrong tokens on RELEASE: 0, not an error.
    assert_eq!(release(&mut con, "p", &wrong), 0);
    assert_eq!(release(&mut con, "m", &wrong), 0);
    assert!(!exists(&mut con, "m"));
    assert_eq!(key_state(&mut con, "p"), before[0]);

    assert_eq!(extend(&mut con, "p", &p_tok, 600), Ok(1));
    assert_eq!(done(&mut con, "p", &p_tok, NONE), Ok(1));
    let (st, _, _) = claim(&mut con, "r", 10);
    assert_eq!(st, "RETRY");
    s.assert_alive();
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
fn server_survives_garbage_arguments() {
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
