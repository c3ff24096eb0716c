//! The Functions edition (functions/idem.lua): loading it into a server and
//! calling its functions the way a client does.
use crate::common::reply::{Fields, GET_FIELDS, as_int, as_str, as_token, err_text, parse_claim};
use crate::common::server::Server;
use redis::{RedisResult, Value};
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

/// The fields of `idem_get`: `IDEM.GET`'s, `owner` included (the module
/// gains it with OWNER, issue 36), sorted.
pub fn library_get_fields() -> Vec<&'static str> {
    let mut names = GET_FIELDS.to_vec();
    if !names.contains(&"owner") {
        names.push("owner");
    }
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
