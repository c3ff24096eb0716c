//! The Functions edition held equal to the module: seeded random sequences
//! of record commands run against the module (`IDEM.*`) on one server and
//! against the library (`FCALL idem_*`) on another server without the
//! module, and every reply compared.
//!
//! - Tokens are compared by shape (32 lowercase hex digits) and by which
//!   later command accepts them: each server's tokens are numbered in the
//!   order it issued them, the commands refer to tokens by number, and the
//!   replies must name the same numbers.
//! - Leases are long (1000 s and more), so the two servers' clocks (the same
//!   machine's, read a few ms apart) never decide differently; the times in
//!   `GET` (`lease_ms`, `pttl`, `claimed_at`, `done_at`) must agree within
//!   `TIME_SLACK_MS`, and be zero on both or on neither.
//! - `GET`'s `fingerprint` is compared by shape: the library stores SHA-1
//!   where the module stores xxh3 (docs/functions.md). MISMATCH replies show
//!   that equal payloads match and different ones do not on both.
//! - Where the editions differ by design (WAIT > 0, BLOOM with a filter
//!   key, times past 2^53 ms) the generator sends nothing; tests/functions.rs
//!   checks those answers.
//!
//! `IDEM_DIFF_SEEDS=n` runs n seeds (default 12), `IDEM_DIFF_SEED=s` one.

#[allow(dead_code)] // each test binary uses part of common/
mod common;

use common::functions::{get_fields_any_order, library_server};
use common::reply::{Fields, as_bytes, as_int, as_str, as_token, err_text, fields_from_reply, parse_claim};
use common::rng::Rng;
use common::server::Server;
use redis::{RedisResult, Value};

use std::collections::{BTreeMap, HashMap};

const STEPS: usize = 400;
const TIME_SLACK_MS: i64 = 3_000;
const KEYS: [&str; 4] = ["order:1", "order:2", "{t}:3", "k4"];
/// A plain string, for WRONGTYPE.
const STRING_KEY: &str = "plain";

/// One argument of a command, as the generator wrote it.
#[derive(Clone, Debug)]
enum Arg {
    Text(Vec<u8>),
    /// The n-th token the server issued.
    Token(usize),
    /// The same, in upper case (tokens are accepted in either case).
    TokenUpper(usize),
}

fn text(s: &str) -> Arg {
    Arg::Text(s.as_bytes().to_vec())
}

/// A step: a record command (`name` as the module spells it, without
/// `IDEM.`) or a plain Redis command run as is on both servers.
#[derive(Clone, Debug)]
struct Step {
    record: bool,
    name: &'static str,
    key: String,
    args: Vec<Arg>,
}

impl Step {
    fn argv(&self, module: bool, tokens: &[String]) -> Vec<Vec<u8>> {
        let mut argv: Vec<Vec<u8>> = if !self.record {
            vec![self.name.as_bytes().to_vec(), self.key.as_bytes().to_vec()]
        } else if self.name == "scan" {
            // Keyless: the key is not sent.
            match module {
                true => vec![b"IDEM.SCAN".to_vec()],
                false => vec![b"FCALL_RO".to_vec(), b"idem_scan".to_vec(), b"0".to_vec()],
            }
        } else if module {
            vec![format!("IDEM.{}", self.name.to_uppercase()).into_bytes(), self.key.as_bytes().to_vec()]
        } else {
            let function = format!("idem_{}", self.name);
            vec![b"FCALL".to_vec(), function.into_bytes(), b"1".to_vec(), self.key.as_bytes().to_vec()]
        };
        for arg in &self.args {
            argv.push(match arg {
                Arg::Text(bytes) => bytes.clone(),
                Arg::Token(n) => tokens.get(*n).cloned().unwrap_or_else(|| "f".repeat(32)).into_bytes(),
                Arg::TokenUpper(n) => tokens.get(*n).map_or("F".repeat(32), |t| t.to_uppercase()).into_bytes(),
            });
        }
        argv
    }
}

fn lease(rng: &mut Rng) -> Arg {
    if rng.chance(92) {
        return text(rng.pick(&["1000", "2000", "3600", "86400"]));
    }
    text(rng.pick(&["0", "-5", "abc", "1.5", "", "007", "9223372036854775808", "99999999999999999999"]))
}

/// `latest`: the number of the token the key's latest claim got.
fn token(rng: &mut Rng, issued: usize, latest: Option<usize>) -> Arg {
    let roll = rng.index(100);
    if let Some(n) = latest
        && roll < 50
    {
        return if roll < 45 { Arg::Token(n) } else { Arg::TokenUpper(n) };
    }
    if issued > 0 && roll < 70 {
        // Mostly one of the latest tokens: the ones that may still hold.
        let n = issued - 1 - rng.index(issued.min(4));
        return Arg::Token(n);
    }
    if issued > 0 && roll < 78 {
        return Arg::TokenUpper(issued - 1 - rng.index(issued.min(3)));
    }
    if issued > 0 && roll < 85 {
        return Arg::Token(rng.index(issued));
    }
    text(rng.pick(&[
        "0123456789abcdef0123456789abcdef",
        "short",
        "",
        "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
        "ZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZ",
    ]))
}

fn key(rng: &mut Rng) -> String {
    if rng.chance(3) { STRING_KEY.to_string() } else { rng.pick(&KEYS).to_string() }
}

/// Options as `NAME value` pairs, shuffled, with the odd mistake.
fn options(rng: &mut Rng, mut pairs: Vec<(&'static str, Arg)>) -> Vec<Arg> {
    for i in (1..pairs.len()).rev() {
        pairs.swap(i, rng.index(i + 1));
    }
    let mut args = Vec::new();
    for (name, value) in pairs {
        let spelled = match rng.index(3) {
            0 => name.to_lowercase(),
            1 => name.to_string(),
            _ => name[..1].to_string() + &name[1..].to_lowercase(),
        };
        args.push(Arg::Text(spelled.into_bytes()));
        args.push(value);
    }
    match rng.index(100) {
        0..=1 => args.push(text("NOSUCH")),
        2..=3 if !args.is_empty() => {
            args.pop();
        }
        4..=5 if args.len() >= 2 => {
            let (name, value) = (args[0].clone(), args[1].clone());
            args.extend([name, value]);
        }
        6 => args.extend([text("BOGUS"), text("1")]),
        _ => {}
    }
    args
}

fn generate(rng: &mut Rng, issued: usize, latest: &HashMap<String, usize>) -> Step {
    let key = key(rng);
    let held = latest.get(&key).copied();
    let roll = rng.index(100);
    let (record, name, args) = match roll {
        0..=34 => {
            let mut pairs = Vec::new();
            if rng.chance(35) {
                let payload = rng.pick(&["a", "b", "", "\u{0}bin\r\n"]);
                pairs.push(("PAYLOAD", text(payload)));
            }
            if rng.chance(30) {
                pairs.push(("MAXTRIES", text(rng.pick(&["1", "1", "2", "2", "3", "0", "-1", "x"]))));
            }
            if rng.chance(4) {
                pairs.push(("WAIT", text(rng.pick(&["0", "-1", "3600001", "zz"]))));
            }
            if rng.chance(2) {
                // The filter named as the record itself is refused by both.
                pairs.push(("BLOOM", Arg::Text(key.as_bytes().to_vec())));
            }
            let mut args = vec![lease(rng)];
            args.extend(options(rng, pairs));
            if rng.chance(2) {
                args.clear();
            }
            (true, "claim", args)
        }
        35..=49 => {
            let mut pairs = Vec::new();
            if rng.chance(40) {
                let result = rng.pick(&["ok", "", "charged 12.50", "\u{0}\u{1}binary\r\n"]);
                pairs.push(("RESULT", text(result)));
            }
            if rng.chance(25) {
                pairs.push(("RETAIN", lease(rng)));
            }
            let mut args = vec![token(rng, issued, held)];
            args.extend(options(rng, pairs));
            (true, "done", args)
        }
        50..=64 => {
            let mut args = vec![token(rng, issued, held)];
            if rng.chance(3) {
                args.push(text("extra"));
            }
            (true, "release", args)
        }
        65..=72 => (true, "extend", vec![token(rng, issued, held), lease(rng)]),
        73..=80 => {
            let args = if rng.chance(3) { vec![text("extra")] } else { vec![] };
            (true, "get", args)
        }
        81..=85 => (true, "once", vec![lease(rng)]),
        86..=89 => (true, "requeue", if rng.chance(5) { vec![text("extra")] } else { vec![] }),
        90..=93 => {
            let mut pairs = Vec::new();
            if rng.chance(50) {
                pairs.push(("STATE", text(rng.pick(&["processing", "EXPIRED", "released", "done", "stuck"]))));
            }
            if rng.chance(40) {
                pairs.push(("MINTRIES", text(rng.pick(&["1", "2", "3", "0", "x"]))));
            }
            if rng.chance(20) {
                // Never a boundary the two servers' clocks could split.
                pairs.push(("IDLE", text(rng.pick(&["100000", "0"]))));
            }
            if rng.chance(30) {
                pairs.push(("MATCH", text(rng.pick(&["order:*", "*", "k?", "{t}*"]))));
            }
            if rng.chance(40) {
                pairs.push(("COUNT", text(rng.pick(&["1", "2", "1000", "0"]))));
            }
            let mut args = vec![text(if rng.chance(3) { "x" } else { "0" })];
            args.extend(options(rng, pairs));
            (true, "scan", args)
        }
        _ => (false, "DEL", vec![]),
    };
    Step { record, name, key, args }
}

/// A reply with its tokens numbered and its times kept for a loose match.
#[derive(Clone, Debug, PartialEq)]
enum Shape {
    Int(i64),
    /// A time in ms (GET's lease_ms, pttl, claimed_at, done_at).
    Time(i64),
    Text(Vec<u8>),
    Status(String),
    Nil,
    Error(String),
    Token(usize),
    Fingerprint,
    Array(Vec<Shape>),
    Fields(BTreeMap<String, Shape>),
}

fn agrees(a: &Shape, b: &Shape) -> bool {
    match (a, b) {
        (Shape::Time(x), Shape::Time(y)) => (*x == 0) == (*y == 0) && (x - y).abs() <= TIME_SLACK_MS,
        (Shape::Array(x), Shape::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| agrees(a, b)),
        (Shape::Fields(x), Shape::Fields(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|((ka, a), (kb, b))| ka == kb && agrees(a, b))
        }
        _ => a == b,
    }
}

fn plain(v: &Value) -> Shape {
    match v {
        Value::Int(i) => Shape::Int(*i),
        Value::BulkString(b) => Shape::Text(b.clone()),
        Value::SimpleString(s) => Shape::Status(s.clone()),
        Value::Okay => Shape::Status("OK".into()),
        Value::Nil => Shape::Nil,
        Value::Array(items) => Shape::Array(items.iter().map(plain).collect()),
        other => panic!("unexpected reply {other:?}"),
    }
}

/// GET's fields: the module's as IDEM.GET gives them (in its RESP2
/// order), the library's in any order. A module without OWNER (before
/// issue 36 reaches main) has no owner to show: nil.
fn get_fields(v: &Value, module: bool) -> Option<Fields> {
    if !module {
        return get_fields_any_order(v.clone());
    }
    let mut fields = fields_from_reply(v.clone())?;
    fields.entry("owner".to_string()).or_insert(Value::Nil);
    Some(fields)
}

/// Numbers the tokens a CLAIM reply issues (appending them to `tokens`).
fn shape(step: &Step, module: bool, reply: &RedisResult<Value>, tokens: &mut Vec<String>) -> Shape {
    let v = match reply {
        Err(e) => return Shape::Error(err_text(e)),
        Ok(v) => v,
    };
    if !step.record {
        return plain(v);
    }
    match step.name {
        "claim" => {
            let (status, value, attempt) = parse_claim(v.clone());
            let value = match status.as_str() {
                "NEW" | "SEEN" | "RETRY" => {
                    let token = as_token(&value);
                    assert!(!tokens.contains(&token), "token {token} issued twice");
                    tokens.push(token);
                    Shape::Token(tokens.len() - 1)
                }
                // Ms left on the lease: a time, read a few ms apart.
                "BUSY" => Shape::Time(as_int(&value)),
                _ => plain(&value),
            };
            Shape::Array(vec![Shape::Status(status), value, Shape::Int(attempt)])
        }
        "get" => match get_fields(v, module) {
            None => Shape::Nil,
            Some(fields) => Shape::Fields(
                fields
                    .into_iter()
                    .map(|(name, value)| {
                        let shape = match name.as_str() {
                            "lease_ms" | "pttl" | "claimed_at" | "done_at" => Shape::Time(as_int(&value)),
                            "state" => Shape::Status(as_str(&value)),
                            "fingerprint" => match as_bytes(&value) {
                                None => Shape::Nil,
                                Some(hex) => {
                                    assert!(hex.len() == 32 && hex.iter().all(u8::is_ascii_hexdigit), "{hex:?}");
                                    Shape::Fingerprint
                                }
                            },
                            _ => plain(&value),
                        };
                        (name, shape)
                    })
                    .collect(),
            ),
        },
        _ => plain(v),
    }
}

/// A whole `IDEM.SCAN` (or `idem_scan`) iteration from the cursor in
/// `argv` (after `prefix` arguments): the keys returned, sorted and
/// deduplicated, or the first error. Cursors may differ between servers.
fn full_scan(con: &mut redis::Connection, mut argv: Vec<Vec<u8>>, prefix: usize) -> RedisResult<Value> {
    let mut keys = std::collections::BTreeSet::new();
    loop {
        let Value::Array(reply) = run_one(con, &argv)? else { panic!("a scan reply is an array") };
        let [cursor, Value::Array(found)] = &reply[..] else { panic!("scan reply {reply:?}") };
        keys.extend(found.iter().map(as_str));
        match as_str(cursor).as_str() {
            "0" => return Ok(Value::Array(keys.into_iter().map(|k| Value::BulkString(k.into_bytes())).collect())),
            next => argv[prefix] = next.as_bytes().to_vec(),
        }
    }
}

fn run(con: &mut redis::Connection, argv: &[Vec<u8>]) -> RedisResult<Value> {
    match argv[0].as_slice() {
        b"IDEM.SCAN" if argv.len() > 1 => full_scan(con, argv.to_vec(), 1),
        b"FCALL_RO" if argv.len() > 3 && argv[1] == b"idem_scan" => full_scan(con, argv.to_vec(), 3),
        _ => run_one(con, argv),
    }
}

fn run_one(con: &mut redis::Connection, argv: &[Vec<u8>]) -> RedisResult<Value> {
    let mut cmd = redis::cmd(std::str::from_utf8(&argv[0]).unwrap());
    for arg in &argv[1..] {
        cmd.arg(arg.as_slice());
    }
    cmd.query(con)
}

fn show(argv: &[Vec<u8>]) -> String {
    argv.iter().map(|a| format!("{:?}", String::from_utf8_lossy(a))).collect::<Vec<_>>().join(" ")
}

struct Side {
    con: redis::Connection,
    tokens: Vec<String>,
}

fn run_seed(seed: u64, resp3: bool, module: &Server, library: &Server) {
    let connect = |s: &Server| if resp3 { s.conn_resp3() } else { s.conn() };
    let mut sides =
        [Side { con: connect(module), tokens: Vec::new() }, Side { con: connect(library), tokens: Vec::new() }];
    for side in sides.iter_mut() {
        let _: () = redis::cmd("FLUSHALL").query(&mut side.con).unwrap();
        let _: () = redis::cmd("SET").arg(STRING_KEY).arg("x").query(&mut side.con).unwrap();
    }
    let mut rng = Rng(seed);
    let mut log: Vec<String> = Vec::new();
    let mut latest: HashMap<String, usize> = HashMap::new();
    for n in 0..STEPS {
        let issued = sides[0].tokens.len();
        let step = generate(&mut rng, issued, &latest);
        let mut shapes = Vec::new();
        let mut argvs = Vec::new();
        for (i, side) in sides.iter_mut().enumerate() {
            let argv = step.argv(i == 0, &side.tokens);
            let reply = run(&mut side.con, &argv);
            shapes.push(shape(&step, i == 0, &reply, &mut side.tokens));
            argvs.push((argv, reply));
        }
        log.push(format!("{n}: {} -> {:?}", show(&argvs[0].0), argvs[0].1));
        if sides[0].tokens.len() > issued {
            latest.insert(step.key.clone(), issued);
        }
        if !agrees(&shapes[0], &shapes[1]) {
            let tail = log[log.len().saturating_sub(25)..].join("\n");
            panic!(
                "seed {seed} (resp3 {resp3}) step {n}: the editions disagree\n  module:  {} -> {:?}\n  library: {} -> {:?}\n  shapes: {:?} vs {:?}\nlast steps (module side):\n{tail}",
                show(&argvs[0].0),
                argvs[0].1,
                show(&argvs[1].0),
                argvs[1].1,
                shapes[0],
                shapes[1]
            );
        }
    }
    // Every record ends the same on both, as GET shows it.
    for key in KEYS {
        let step = Step { record: true, name: "get", key: key.to_string(), args: vec![] };
        let shapes: Vec<Shape> = sides
            .iter_mut()
            .enumerate()
            .map(|(i, side)| {
                let reply = run(&mut side.con, &step.argv(i == 0, &side.tokens));
                shape(&step, i == 0, &reply, &mut side.tokens)
            })
            .collect();
        assert!(agrees(&shapes[0], &shapes[1]), "seed {seed}: {key} ends as {:?} and {:?}", shapes[0], shapes[1]);
    }
    let count = |what: &str| log.iter().filter(|l| l.contains(what)).count();
    eprintln!(
        "seed {seed} (resp3 {resp3}): {STEPS} steps equal, {} tokens; RETRY {}, EXHAUSTED {}, MISMATCH {}, BUSY {}",
        sides[0].tokens.len(),
        count("\"RETRY\""),
        count("\"EXHAUSTED\""),
        count("\"MISMATCH\""),
        count("\"BUSY\"")
    );
}

fn seeds() -> Vec<u64> {
    if let Ok(seed) = std::env::var("IDEM_DIFF_SEED") {
        return vec![seed.parse().expect("IDEM_DIFF_SEED")];
    }
    let count: u64 = std::env::var("IDEM_DIFF_SEEDS").ok().and_then(|n| n.parse().ok()).unwrap_or(12);
    (1..=count).map(|n| n * 7919).collect()
}

#[test]
fn library_answers_as_the_module_does() {
    let module = Server::start();
    let library = library_server(&[]);
    for (i, seed) in seeds().into_iter().enumerate() {
        run_seed(seed, i % 2 == 1, &module, &library);
    }
}

/// The replies that need no random sequence: each error of each command,
/// as one list, compared reply by reply.
#[test]
fn every_argument_error_reads_the_same() {
    let module = Server::start();
    let library = library_server(&[]);
    let cases: &[(&str, &[&str])] = &[
        ("claim", &[]),
        ("claim", &["0"]),
        ("claim", &["-1"]),
        ("claim", &["x"]),
        ("claim", &["10", "PAYLOAD"]),
        ("claim", &["10", "payload", "a", "PAYLOAD", "b"]),
        ("claim", &["10", "MAXTRIES", "0"]),
        ("claim", &["10", "MAXTRIES", "-0"]),
        ("claim", &["10", "maxtries", "1.0"]),
        ("claim", &["10", "WAIT", "-1"]),
        ("claim", &["10", "WAIT", "3600001"]),
        ("claim", &["10", "BLOOM", "k"]),
        ("claim", &["10", "Other", "1"]),
        ("done", &[]),
        ("done", &["0123456789abcdef0123456789abcdef0"]),
        ("done", &["t", "RESULT"]),
        ("done", &["t", "RETAIN", "0"]),
        ("done", &["t", "RETAIN", "1", "retain", "2"]),
        ("done", &["t", "BLOOM", "k"]),
        ("release", &[]),
        ("release", &["t", "u"]),
        ("release", &["0123456789abcdef0123456789abcdef0"]),
        ("extend", &["t"]),
        ("extend", &["t", "0"]),
        ("extend", &["0123456789abcdef0123456789abcdef0", "10"]),
        ("extend", &["t", "10"]),
        ("get", &["x"]),
        ("once", &[]),
        ("once", &["0"]),
        ("requeue", &["x"]),
        ("scan", &[]),
        ("scan", &["-1"]),
        ("scan", &["18446744073709551616"]),
        ("scan", &["0", "COUNT", "0"]),
        ("scan", &["0", "COUNT", "x"]),
        ("scan", &["0", "STATE", "stuck"]),
        ("scan", &["0", "MINTRIES", "0"]),
        ("scan", &["0", "IDLE", "0"]),
        ("scan", &["0", "IDLE", "9007199254741"]),
        ("scan", &["0", "MATCH"]),
        ("scan", &["0", "idle", "1", "IDLE", "2"]),
        ("scan", &["0", "TYPE", "hash"]),
    ];
    let mut cons = [module.conn(), library.conn()];
    for (name, args) in cases {
        let step = Step { record: true, name, key: "k".into(), args: args.iter().map(|a| text(a)).collect() };
        let replies: Vec<RedisResult<Value>> =
            cons.iter_mut().enumerate().map(|(i, con)| run(con, &step.argv(i == 0, &[]))).collect();
        let texts: Vec<String> = replies
            .iter()
            .map(|r| r.as_ref().map_err(err_text).map(|v| format!("{v:?}")).unwrap_or_else(|e| e))
            .collect();
        assert!(replies[0].is_err(), "{name} {args:?}: the module did not refuse it: {:?}", replies[0]);
        assert_eq!(texts[0], texts[1], "{name} {args:?}");
    }
    // Oversized RESULT, with the default idem.max-result.
    let big = vec![b'r'; 1_048_577];
    let step =
        Step { record: true, name: "done", key: "k".into(), args: vec![text("t"), text("RESULT"), Arg::Text(big)] };
    let texts: Vec<String> =
        cons.iter_mut().enumerate().map(|(i, con)| err_text(&run(con, &step.argv(i == 0, &[])).unwrap_err())).collect();
    assert_eq!(texts[0], texts[1]);
}
