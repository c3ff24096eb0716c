//! Replies and errors: their text, their shapes (CLAIM's triple,
//! IDEM.GET's fields, IDEM.BF.INFO's fields and shards), parsed and checked.
use redis::{RedisError, RedisResult, Value};
use std::collections::HashMap;

/// An error reply as the server sent it: `"CODE detail"`.
pub fn err_text(e: &RedisError) -> String {
    match (e.code(), e.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        (Some(code), None) => code.to_string(),
        _ => format!("<not a server error: {e}>"),
    }
}

/// Runs a command that must fail; returns the error text.
pub fn expect_err<A: redis::ToRedisArgs>(con: &mut redis::Connection, name: &str, args: A) -> String {
    let mut c = redis::cmd(name);
    c.arg(args);
    match c.query::<Value>(con) {
        Ok(v) => panic!("{name}: expected an error, got {v:?}"),
        Err(e) => {
            assert!(e.code().is_some(), "{name}: expected a server error, got {e}");
            err_text(&e)
        }
    }
}

/// Runs any command, returns its raw reply.
pub fn q<A: redis::ToRedisArgs>(con: &mut redis::Connection, name: &str, args: A) -> RedisResult<Value> {
    let mut c = redis::cmd(name);
    c.arg(args);
    c.query(con)
}

/// A string from a simple or bulk string reply.
pub fn as_str(v: &Value) -> String {
    match v {
        Value::SimpleString(s) => s.clone(),
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::Okay => "OK".into(),
        Value::VerbatimString { text, .. } => text.clone(),
        other => panic!("expected a string reply, got {other:?}"),
    }
}

pub fn as_int(v: &Value) -> i64 {
    match v {
        Value::Int(i) => *i,
        other => panic!("expected an integer reply, got {other:?}"),
    }
}

pub fn as_bytes(v: &Value) -> Option<Vec<u8>> {
    match v {
        Value::Nil => None,
        Value::BulkString(b) => Some(b.clone()),
        other => panic!("expected a bulk string or nil, got {other:?}"),
    }
}

/// Checks a token is 32 lowercase hex digits and returns it.
pub fn as_token(v: &Value) -> String {
    let t = match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).expect("token is UTF-8"),
        other => panic!("expected a token (bulk string), got {other:?}"),
    };
    assert_eq!(t.len(), 32, "token {t:?} is not 32 characters");
    assert!(t.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)), "token {t:?} is not lowercase hex");
    t
}

/// A random well-formed token (32 lowercase hex digits) that no claim issued.
pub fn random_token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// `(status, value, attempt)` from a CLAIM reply.
pub fn parse_claim(v: Value) -> (String, Value, i64) {
    match v {
        Value::Array(items) if items.len() == 3 => {
            let mut it = items.into_iter();
            let status = as_str(&it.next().unwrap());
            let value = it.next().unwrap();
            let attempt = as_int(&it.next().unwrap());
            (status, value, attempt)
        }
        other => panic!("expected a 3-element CLAIM reply, got {other:?}"),
    }
}

/// The fields of `IDEM.GET`, in the order docs/commands.md lists them.
pub const GET_FIELDS: [&str; 10] =
    ["state", "attempt", "lease_ms", "pttl", "claimed_at", "done_at", "result", "fingerprint", "tries", "owner"];

pub type Fields = HashMap<String, Value>;

pub fn fields_from_reply(v: Value) -> Option<Fields> {
    let pairs: Vec<(Value, Value)> = match v {
        Value::Nil => return None,
        Value::Array(items) => {
            assert_eq!(items.len(), 2 * GET_FIELDS.len(), "IDEM.GET: expected 10 field/value pairs, got {items:?}");
            let mut pairs = Vec::new();
            let mut it = items.into_iter();
            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                pairs.push((k, v));
            }
            let names: Vec<String> = pairs.iter().map(|(k, _)| as_str(k)).collect();
            assert_eq!(names, GET_FIELDS, "IDEM.GET field order (RESP2)");
            pairs
        }
        Value::Map(pairs) => pairs,
        other => panic!("IDEM.GET: expected nil, an array or a map, got {other:?}"),
    };
    let mut fields = Fields::new();
    for (k, v) in pairs {
        let name = as_str(&k);
        let v = match (name.as_str(), v) {
            // Accept the state as a simple or a bulk string.
            ("state", v) => Value::SimpleString(as_str(&v)),
            (_, v) => v,
        };
        assert!(fields.insert(name.clone(), v).is_none(), "IDEM.GET: field {name} twice");
    }
    let mut names: Vec<&str> = fields.keys().map(String::as_str).collect();
    names.sort();
    let mut expected = GET_FIELDS.to_vec();
    expected.sort();
    assert_eq!(names, expected, "IDEM.GET field names");
    Some(fields)
}

pub fn f_str(f: &Fields, name: &str) -> String {
    as_str(&f[name])
}

pub fn f_int(f: &Fields, name: &str) -> i64 {
    as_int(&f[name])
}

pub fn f_bytes(f: &Fields, name: &str) -> Option<Vec<u8>> {
    as_bytes(&f[name])
}

pub fn int(v: &Value) -> i64 {
    as_int(v)
}

pub fn ints(v: &Value) -> Vec<i64> {
    redis::from_redis_value(v).unwrap_or_else(|e| panic!("expected an array of integers, got {v:?}: {e}"))
}

pub const INFO_FIELDS: [&str; 8] =
    ["error_rate", "capacity", "window", "shard", "expansion", "items", "bytes", "shards"];
pub const SHARD_FIELDS: [&str; 4] = ["start", "items", "filters", "bytes"];

#[derive(Debug, Clone, PartialEq)]
pub struct ShardInfo {
    pub start: i64,
    pub items: i64,
    pub filters: i64,
    pub bytes: i64,
}

/// `IDEM.BF.INFO`, parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct BfInfo {
    pub error_rate: f64,
    pub capacity: i64,
    pub window: i64,
    pub shard: i64,
    pub expansion: i64,
    pub items: i64,
    pub bytes: i64,
    pub shards: Vec<ShardInfo>,
}

impl BfInfo {
    pub fn starts(&self) -> Vec<i64> {
        self.shards.iter().map(|s| s.start).collect()
    }
}

/// Field/value pairs of a RESP2 flat array or a RESP3 map, checking the
/// names, their order, and that each is there once.
pub fn pairs(v: Value, names: &[&str], what: &str) -> Vec<Value> {
    let pairs: Vec<(Value, Value)> = match v {
        Value::Array(items) => {
            assert_eq!(items.len(), 2 * names.len(), "{what}: expected {} field/value pairs: {items:?}", names.len());
            let mut out = Vec::new();
            let mut it = items.into_iter();
            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                out.push((k, v));
            }
            out
        }
        Value::Map(m) => m,
        other => panic!("{what}: expected a flat array or a map, got {other:?}"),
    };
    let got: Vec<String> = pairs.iter().map(|(k, _)| as_str(k)).collect();
    assert_eq!(got, names, "{what}: field names / order");
    pairs.into_iter().map(|(_, v)| v).collect()
}

pub fn parse_bf_info(v: Value) -> Option<BfInfo> {
    if v == Value::Nil {
        return None;
    }
    let vals = pairs(v, &INFO_FIELDS, "IDEM.BF.INFO");
    let error_rate = match &vals[0] {
        // RESP2: a double is a bulk string.
        Value::BulkString(b) => std::str::from_utf8(b).unwrap().parse::<f64>().expect("error_rate parses as a float"),
        Value::Double(d) => *d,
        other => panic!("IDEM.BF.INFO error_rate: expected a double (bulk string in RESP2), got {other:?}"),
    };
    let shards = match &vals[7] {
        Value::Array(list) => list
            .iter()
            .map(|s| {
                let f = pairs(s.clone(), &SHARD_FIELDS, "IDEM.BF.INFO shard");
                ShardInfo { start: as_int(&f[0]), items: as_int(&f[1]), filters: as_int(&f[2]), bytes: as_int(&f[3]) }
            })
            .collect(),
        other => panic!("IDEM.BF.INFO shards: expected an array, got {other:?}"),
    };
    Some(BfInfo {
        error_rate,
        capacity: as_int(&vals[1]),
        window: as_int(&vals[2]),
        shard: as_int(&vals[3]),
        expansion: as_int(&vals[4]),
        items: as_int(&vals[5]),
        bytes: as_int(&vals[6]),
        shards,
    })
}
