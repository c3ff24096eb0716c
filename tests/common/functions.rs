//! The Functions edition (functions/idem.lua): loading it into a server and
//! calling its functions the way a client does.
use crate::common::commands::{pexpiretime, server_ms};
use crate::common::reply::{Fields, GET_FIELDS, as_int, as_str, as_token, err_text, parse_claim};
use crate::common::server::Server;
use redis::{RedisResult, Value};
use std::collections::BTreeSet;
use std::path::Path;

/// The library's source, as a user loads it.
pub fn library_source() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("functions").join("idem.lua");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// `FUNCTION LOAD REPLACE <library>`.
pub fn load_library(con: &mut redis::Connection) {
    let name: String =
        redis::cmd("FUNCTION").arg("LOAD").arg("REPLACE").arg(library_source()).query(con).expect("FUNCTION LOAD");
    assert_eq!(name, "idem");
}

/// A server without the module, with the library loaded.
pub fn library_server(extra_args: &[&str]) -> Server {
    let server = Server::without_module(extra_args);
    load_library(&mut server.conn());
    server
}

/// `FCALL <function> 1 key args...`, raw reply.
pub fn fcall<A: redis::ToRedisArgs>(
    con: &mut redis::Connection,
    function: &str,
    key: &str,
    args: A,
) -> RedisResult<Value> {
    redis::cmd("FCALL").arg(function).arg(1).arg(key).arg(args).query(con)
}

/// `FCALL idem_claim 1 key lease opts...` → `(status, value, attempt)`.
pub fn fclaim(con: &mut redis::Connection, key: &str, lease: i64, opts: &[&str]) -> (String, Value, i64) {
    let v = fcall(con, "idem_claim", key, (lease, opts))
        .unwrap_or_else(|e| panic!("idem_claim {key} {lease} {opts:?}: {e}"));
    parse_claim(v)
}

/// Claims an absent key through the library: NEW, attempt 1; the token.
pub fn fclaim_new(con: &mut redis::Connection, key: &str, lease: i64) -> String {
    let (status, value, attempt) = fclaim(con, key, lease, &[]);
    assert_eq!((status.as_str(), attempt), ("NEW", 1), "idem_claim {key}: value {value:?}");
    as_token(&value)
}

/// A function's integer reply, or its error text.
pub fn fint<A: redis::ToRedisArgs>(
    con: &mut redis::Connection,
    function: &str,
    key: &str,
    args: A,
) -> Result<i64, String> {
    fcall(con, function, key, args).map(|v| as_int(&v)).map_err(|e| err_text(&e))
}

/// A function's error text; panics on a success.
pub fn ferr<A: redis::ToRedisArgs>(con: &mut redis::Connection, function: &str, key: &str, args: A) -> String {
    match fcall(con, function, key, args) {
        Ok(v) => panic!("{function} {key}: expected an error, got {v:?}"),
        Err(e) => err_text(&e),
    }
}

/// `idem_get` as a map of fields (nil: `None`), whatever the protocol.
pub fn fget(con: &mut redis::Connection, key: &str) -> Option<Fields> {
    let v = fcall(con, "idem_get", key, &[] as &[&str]).unwrap_or_else(|e| panic!("idem_get {key}: {e}"));
    get_fields_any_order(v)
}

/// The fields of `idem_get`: `IDEM.GET`'s, sorted.
pub fn library_get_fields() -> Vec<&'static str> {
    let mut names = GET_FIELDS.to_vec();
    names.sort();
    names
}

/// idem_get's reply as fields. The library's RESP2 array comes in another
/// order (docs/functions.md), so order is not checked.
pub fn get_fields_any_order(v: Value) -> Option<Fields> {
    let expected = library_get_fields();
    let pairs: Vec<(Value, Value)> = match v {
        Value::Nil => return None,
        Value::Array(items) => {
            assert_eq!(items.len(), 2 * expected.len(), "GET: expected field/value pairs, got {items:?}");
            items.chunks(2).map(|p| (p[0].clone(), p[1].clone())).collect()
        }
        Value::Map(pairs) => pairs,
        other => panic!("GET: expected nil, an array or a map, got {other:?}"),
    };
    let mut fields = Fields::new();
    for (k, v) in pairs {
        let name = as_str(&k);
        assert!(fields.insert(name.clone(), v).is_none(), "GET: field {name} twice");
    }
    let mut names: Vec<&str> = fields.keys().map(String::as_str).collect();
    names.sort();
    assert_eq!(names, expected, "GET field names");
    Some(fields)
}

/// A key as the server holds it, for before/after comparisons whatever
/// its type: a record (a string), a hash record of an earlier build or a user's hash, or
/// another type by name.
#[derive(Debug, PartialEq)]
pub enum Stored {
    Absent,
    String(Vec<u8>),
    Hash(std::collections::BTreeMap<Vec<u8>, Vec<u8>>),
    Other(String),
}

pub fn stored(con: &mut redis::Connection, key: &str) -> Stored {
    let kind: String = redis::cmd("TYPE").arg(key).query(con).expect("TYPE");
    match kind.as_str() {
        "none" => Stored::Absent,
        "string" => Stored::String(redis::cmd("GET").arg(key).query(con).expect("GET")),
        "hash" => Stored::Hash(redis::cmd("HGETALL").arg(key).query(con).expect("HGETALL")),
        _ => Stored::Other(kind),
    }
}

/// A record in the library's packed form (docs/functions.md, "A record"),
/// for tests that craft one or damage one.
#[derive(Clone, Debug, Default)]
pub struct Packed {
    pub phase: u8,
    pub attempt: u64,
    pub claimed: u64,
    /// The lease end, the release time or done_at.
    pub at: u64,
    pub token: Option<Vec<u8>>,
    pub fp: Option<Vec<u8>>,
    pub base: Option<u64>,
    pub extended: Option<u64>,
    pub owner: Option<Vec<u8>>,
    pub result: Option<Vec<u8>>,
}

impl Packed {
    pub fn bytes(&self) -> Vec<u8> {
        let int7 = |v: u64| v.to_le_bytes()[..7].to_vec();
        let present = [
            self.token.is_some(),
            self.fp.is_some(),
            self.base.is_some(),
            self.extended.is_some(),
            self.owner.is_some(),
            self.result.is_some(),
        ];
        let flags = present.iter().enumerate().fold(0u8, |f, (bit, &on)| if on { f | 1 << bit } else { f });
        let mut out = vec![1, self.phase, flags];
        for v in [self.attempt, self.claimed, self.at] {
            out.extend(int7(v));
        }
        out.extend(self.token.iter().flatten());
        out.extend(self.fp.iter().flatten());
        for v in [self.base, self.extended].into_iter().flatten() {
            out.extend(int7(v));
        }
        if let Some(owner) = &self.owner {
            out.push(owner.len() as u8);
            out.extend(owner);
        }
        out.extend(self.result.iter().flatten());
        out
    }
}

/// A well-formed token that no claim issued.
pub const TOKEN: &str = "0123456789abcdef0123456789abcdef";
pub const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

/// Hashes that are not hash records as earlier builds wrote them: what the hostile probe found, then one defect each
/// in records that are otherwise well-formed (`L` is a lease end in the
/// future, `T` a token).
pub fn malformed_hashes() -> Vec<(&'static str, Vec<(&'static str, String)>)> {
    let live = |extra: &[(&'static str, &str)]| {
        let mut fields = vec![("s", "p".to_string()), ("a", "1".into()), ("c", "1".into()), ("l", "L".into())];
        fields.push(("t", TOKEN.into()));
        for &(name, value) in extra {
            fields.retain(|(n, _)| *n != name);
            if value != "-" {
                fields.push((name, value.into()));
            }
        }
        fields
    };
    let done = |extra: &[(&'static str, &str)]| {
        let mut fields = vec![("s", "d".to_string()), ("a", "1".into()), ("c", "1".into()), ("d", "1".into())];
        for &(name, value) in extra {
            fields.retain(|(n, _)| *n != name);
            if value != "-" {
                fields.push((name, value.into()));
            }
        }
        fields
    };
    let pairs = |fields: &[(&'static str, &str)]| fields.iter().map(|&(n, v)| (n, v.to_string())).collect();
    vec![
        ("s=p alone", pairs(&[("s", "p")])),
        ("an unknown phase", pairs(&[("s", "zz"), ("a", "1")])),
        ("s=d alone", pairs(&[("s", "d")])),
        ("attempt 1e400", live(&[("s", "r"), ("a", "1e400")])),
        ("lease end 1e20", pairs(&[("s", "p"), ("a", "1"), ("l", "1e20"), ("t", TOKEN)])),
        ("a user's hash with s and a", pairs(&[("s", "r"), ("a", "1"), ("name", "bob")])),
        ("a record with a field of the user's", live(&[("name", "bob")])),
        ("a done record with a field of the user's", done(&[("x", "")])),
        ("an empty field name", live(&[("", "v")])),
        ("no phase", live(&[("s", "-")])),
        ("an empty phase", live(&[("s", "")])),
        ("no attempt", live(&[("a", "-")])),
        ("a negative attempt", live(&[("a", "-1")])),
        ("attempt 01", live(&[("a", "01")])),
        ("attempt 1.5", live(&[("a", "1.5")])),
        ("attempt with a space", live(&[("a", " 1")])),
        ("attempt 2^53", live(&[("a", "9007199254740992")])),
        ("attempt 0 while processing", live(&[("a", "0")])),
        ("no lease end while processing", live(&[("l", "-")])),
        ("lease end 2^63", live(&[("l", "9223372036854775808")])),
        ("lease end in hex", live(&[("l", "0x10")])),
        ("no claim time while processing", live(&[("c", "-")])),
        ("a claim time of text", live(&[("c", "yesterday")])),
        ("no token while processing", live(&[("t", "-")])),
        ("an empty token while released", live(&[("s", "r"), ("t", "")])),
        ("a short token", live(&[("t", "abc")])),
        ("an upper-case token", live(&[("t", "0123456789ABCDEF0123456789ABCDEF")])),
        ("a fingerprint of text", live(&[("f", "not a fingerprint at all, 32 ch.")])),
        ("a done time while processing", live(&[("d", "1")])),
        ("a result while processing", live(&[("r", "x")])),
        ("a done record without its done time", done(&[("d", "-")])),
        ("a done record with a live token", done(&[("t", TOKEN)])),
        ("a done record with a bad done time", done(&[("d", "-5")])),
        ("an owner (hash records kept none)", live(&[("o", "w")])),
        // What the hostile probe of issue 35 left for idem_scan.
        ("a user's hash with a lease of text", pairs(&[("s", "p"), ("a", "34"), ("l", "en")])),
        ("a user's hash with a phase and an attempt", pairs(&[("s", "d"), ("a", "5")])),
        ("a done record with attempt 1.5", done(&[("a", "1.5")])),
    ]
}

/// Writes each of them as `hash:<i>` (`L` in a value: a lease end
/// ten minutes ahead); returns the keys with what each is.
pub fn write_malformed_hashes(con: &mut redis::Connection) -> Vec<(String, String)> {
    let lease_end = (server_ms(con) + 600_000).to_string();
    let mut written = Vec::new();
    for (i, (what, fields)) in malformed_hashes().into_iter().enumerate() {
        let key = format!("hash:{i}");
        let mut hset = redis::cmd("HSET");
        hset.arg(&key);
        for (name, value) in &fields {
            hset.arg(*name).arg(if value == "L" { lease_end.as_str() } else { value.as_str() });
        }
        let _: i64 = hset.query(con).unwrap();
        written.push((key, format!("{what} {fields:?}")));
    }
    written
}

/// Every function, with arguments that would write if the key held a
/// record (the token is the one the damaged records hold).
pub fn calls() -> Vec<(&'static str, Vec<String>)> {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect();
    vec![
        ("idem_claim", s(&["30"])),
        ("idem_claim", s(&["30", "PAYLOAD", "p", "MAXTRIES", "5", "OWNER", "w"])),
        ("idem_done", s(&[TOKEN, "RESULT", "r"])),
        ("idem_release", s(&[TOKEN])),
        ("idem_extend", s(&[TOKEN, "30"])),
        ("idem_once", s(&["30"])),
        ("idem_get", vec![]),
        ("idem_requeue", vec![]),
    ]
}

/// Every function answers `key` WRONGTYPE and leaves it as it was, its
/// expiry included (none).
pub fn assert_refused(con: &mut redis::Connection, key: &str, what: &str) {
    let before = stored(con, key);
    for (function, args) in calls() {
        match fcall(con, function, key, &args) {
            Err(e) => assert_eq!(err_text(&e), WRONGTYPE, "{function} {args:?} on {what}"),
            Ok(v) => panic!("{function} {args:?} on {what} answered {v:?}"),
        }
        assert_eq!(stored(con, key), before, "{function} on {what} changed it");
        assert_eq!(pexpiretime(con, key), -1, "{function} on {what} set an expiry");
    }
    let reply = redis::cmd("FCALL_RO").arg("idem_get").arg(1).arg(key).query::<Value>(con);
    assert_eq!(reply.map_err(|e| err_text(&e)), Err(WRONGTYPE.to_string()), "FCALL_RO idem_get on {what}");
}

/// A whole `FCALL_RO idem_scan 0 cursor COUNT 7 <filters>` iteration: the
/// keys listed, or the first error.
pub fn scan_all(con: &mut redis::Connection, filters: &[&str]) -> Result<BTreeSet<String>, String> {
    let mut keys = BTreeSet::new();
    let mut cursor = "0".to_string();
    loop {
        let (next, found): (String, Vec<String>) = redis::cmd("FCALL_RO")
            .arg("idem_scan")
            .arg(0)
            .arg(&cursor)
            .arg("COUNT")
            .arg(7)
            .arg(filters)
            .query(con)
            .map_err(|e| err_text(&e))?;
        keys.extend(found);
        if next == "0" {
            return Ok(keys);
        }
        cursor = next;
    }
}
