//! The replies the model expects, and how a server's reply is matched.

use redis::Value;

use crate::common::reply::GET_FIELDS;

// ---------------------------------------------------------------------------
// Expected replies
// ---------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq)]
pub enum CVal {
    /// A fresh token.
    Token,
    Nil,
    /// The stored result of a done record.
    Result(Option<Vec<u8>>),
    /// ms left on the lease.
    Ms(i64),
}

#[derive(Clone, Debug, PartialEq)]
pub struct GetExp {
    pub state: &'static str,
    pub attempt: i64,
    pub lease_ms: i64,
    pub pttl: i64,
    pub claimed_at: i64,
    pub done_at: i64,
    pub result: Option<Vec<u8>>,
    pub fingerprint: Option<String>,
    pub tries: i64,
    pub owner: Option<Vec<u8>>,
    /// The key's TTL and the module's clock are two readings of the clock,
    /// each anywhere in the step's bracket: `pttl` may be off by up to
    /// (below, above) ms from its value at the module's time.
    pub pttl_slack: (i64, i64),
}

#[derive(Clone, Debug, PartialEq)]
pub struct InfoExp {
    pub rate: f64,
    pub capacity: i64,
    pub window: i64,
    pub shard: i64,
    pub expansion: i64,
    /// (start, distinct items added) of each live shard, oldest first.
    pub shards: Vec<(i64, i64)>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Exp {
    Int(i64),
    Nil,
    Okay,
    /// A simple or bulk string.
    Text(&'static str),
    /// An error reply starting with this.
    Err(&'static str),
    /// A DUMP payload (any bulk string).
    Payload,
    /// A Bloom answer. `seen`: what the model knows (the item is in a live
    /// shard). `add`: the reply of ADD (1 = new), else of EXISTS (1 = maybe
    /// seen).
    Bloom {
        seen: bool,
        add: bool,
    },
    Array(Vec<Exp>),
    /// `[status, value, attempt]`; `seen_ok`: NEW may come as SEEN (a false
    /// positive of the BLOOM filter).
    Claim {
        status: &'static str,
        seen_ok: bool,
        value: CVal,
        attempt: i64,
    },
    Get(Box<GetExp>),
    Info(Box<InfoExp>),
}

/// What a matching reply told beyond the model.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Matched {
    /// The token of a granted claim.
    pub token: Option<String>,
    /// False positives, and queries the model knew to be negative.
    pub fp: u32,
    pub neg: u32,
}

fn text_of(v: &Value) -> Option<String> {
    match v {
        Value::SimpleString(s) => Some(s.clone()),
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::Okay => Some("OK".into()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

pub fn error_text(v: &Value) -> Option<String> {
    match v {
        Value::ServerError(e) => Some(match e.details() {
            Some(d) => format!("{} {}", e.code(), d),
            None => e.code().to_string(),
        }),
        _ => None,
    }
}

fn int_of(v: &Value) -> Result<i64, String> {
    match v {
        Value::Int(i) => Ok(*i),
        other => Err(format!("expected an integer, got {other:?}")),
    }
}

fn bytes_of(v: &Value) -> Result<Option<Vec<u8>>, String> {
    match v {
        Value::Nil => Ok(None),
        Value::BulkString(b) => Ok(Some(b.clone())),
        other => Err(format!("expected a bulk string or nil, got {other:?}")),
    }
}

pub fn is_token(t: &str) -> bool {
    t.len() == 32 && t.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
}

/// Field/value pairs of a RESP2 flat array or a RESP3 map, in order.
fn pairs(v: &Value) -> Result<Vec<(String, Value)>, String> {
    match v {
        Value::Array(items) if items.len() % 2 == 0 => {
            let mut out = Vec::new();
            for kv in items.chunks(2) {
                out.push((text_of(&kv[0]).ok_or("field name not a string")?, kv[1].clone()));
            }
            Ok(out)
        }
        Value::Map(m) => m.iter().map(|(k, v)| Ok((text_of(k).ok_or("field name not a string")?, v.clone()))).collect(),
        other => Err(format!("expected a map or a flat array, got {other:?}")),
    }
}

fn fields(v: &Value, names: &[&str]) -> Result<Vec<Value>, String> {
    let p = pairs(v)?;
    let got: Vec<&str> = p.iter().map(|(k, _)| k.as_str()).collect();
    if got != names {
        return Err(format!("field names {got:?}, expected {names:?}"));
    }
    Ok(p.into_iter().map(|(_, v)| v).collect())
}

/// Checks `v` against `exp`; on a match, adds what it learnt to `m`.
pub fn matches(exp: &Exp, v: &Value, m: &mut Matched) -> Result<(), String> {
    if let Some(e) = error_text(v) {
        return match exp {
            Exp::Err(prefix) if e.starts_with(prefix) => Ok(()),
            _ => Err(format!("error {e:?}, expected {exp:?}")),
        };
    }
    match exp {
        Exp::Int(n) => (int_of(v)? == *n).then_some(()).ok_or_else(|| format!("{v:?} != {n}")),
        Exp::Nil => (*v == Value::Nil).then_some(()).ok_or_else(|| format!("{v:?}, expected nil")),
        Exp::Okay => (text_of(v).as_deref() == Some("OK")).then_some(()).ok_or_else(|| format!("{v:?}, expected OK")),
        Exp::Text(s) => (text_of(v).as_deref() == Some(*s)).then_some(()).ok_or_else(|| format!("{v:?}, expected {s}")),
        Exp::Err(p) => Err(format!("{v:?}, expected an error {p}")),
        Exp::Payload => match v {
            Value::BulkString(_) => Ok(()),
            other => Err(format!("{other:?}, expected a DUMP payload")),
        },
        Exp::Bloom { seen, add } => {
            let bit = int_of(v)?;
            if bit != 0 && bit != 1 {
                return Err(format!("{bit}: not 0 or 1"));
            }
            let maybe_seen = if *add { bit == 0 } else { bit == 1 };
            if *seen {
                if !maybe_seen {
                    return Err(format!("{bit}: a false negative, the item is in a live shard"));
                }
            } else {
                m.neg += 1;
                if maybe_seen {
                    m.fp += 1;
                }
            }
            Ok(())
        }
        Exp::Array(exps) => match v {
            Value::Array(items) if items.len() == exps.len() => {
                for (i, (e, x)) in exps.iter().zip(items).enumerate() {
                    matches(e, x, m).map_err(|err| format!("element {i}: {err}"))?;
                }
                Ok(())
            }
            other => Err(format!("{other:?}, expected an array of {}", exps.len())),
        },
        Exp::Claim { status, seen_ok, value, attempt } => {
            let Value::Array(items) = v else { return Err(format!("{v:?}: not a 3-element array")) };
            if items.len() != 3 {
                return Err(format!("{v:?}: not a 3-element array"));
            }
            let got = text_of(&items[0]).ok_or("status not a string")?;
            if *seen_ok {
                m.neg += 1;
            }
            if got != *status {
                if *seen_ok && got == "SEEN" {
                    m.fp += 1;
                } else {
                    return Err(format!("status {got}, expected {status}"));
                }
            }
            let a = int_of(&items[2])?;
            if a != *attempt {
                return Err(format!("attempt {a}, expected {attempt}"));
            }
            match value {
                CVal::Token => {
                    let t = match &items[1] {
                        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                        other => return Err(format!("token {other:?} is not a bulk string")),
                    };
                    if !is_token(&t) {
                        return Err(format!("token {t:?} is not 32 lowercase hex digits"));
                    }
                    m.token = Some(t);
                }
                CVal::Nil => {
                    if items[1] != Value::Nil {
                        return Err(format!("value {:?}, expected nil", items[1]));
                    }
                }
                CVal::Result(r) => {
                    let got = bytes_of(&items[1])?;
                    if got != *r {
                        return Err(format!("result {got:?}, expected {r:?}"));
                    }
                }
                CVal::Ms(ms) => {
                    let got = int_of(&items[1])?;
                    if got != *ms {
                        return Err(format!("lease left {got} ms, expected {ms}"));
                    }
                }
            }
            Ok(())
        }
        Exp::Get(g) => {
            let f = fields(v, &GET_FIELDS)?;
            let state = text_of(&f[0]).ok_or("state not a string")?;
            let got = GetExp {
                state: match state.as_str() {
                    "processing" => "processing",
                    "expired" => "expired",
                    "released" => "released",
                    "done" => "done",
                    other => return Err(format!("state {other:?}")),
                },
                attempt: int_of(&f[1])?,
                lease_ms: int_of(&f[2])?,
                pttl: int_of(&f[3])?,
                claimed_at: int_of(&f[4])?,
                done_at: int_of(&f[5])?,
                result: bytes_of(&f[6])?,
                fingerprint: bytes_of(&f[7])?.map(|b| String::from_utf8_lossy(&b).into_owned()),
                tries: int_of(&f[8])?,
                owner: bytes_of(&f[9])?,
                pttl_slack: g.pttl_slack,
            };
            let pttl_ok = if g.pttl < 0 {
                got.pttl == g.pttl
            } else {
                (g.pttl - g.pttl_slack.0..=g.pttl + g.pttl_slack.1).contains(&got.pttl)
            };
            let same = GetExp { pttl: g.pttl, ..got.clone() };
            (same == **g && pttl_ok).then_some(()).ok_or_else(|| format!("IDEM.GET {got:?}, expected {g:?}"))
        }
        Exp::Info(i) => {
            let f = fields(v, &["error_rate", "capacity", "window", "shard", "expansion", "items", "bytes", "shards"])?;
            let rate = match &f[0] {
                Value::Double(d) => *d,
                other => text_of(other).and_then(|s| s.parse::<f64>().ok()).ok_or("error_rate not a double")?,
            };
            if (rate - i.rate).abs() > i.rate * 1e-9 {
                return Err(format!("error_rate {rate}, expected {}", i.rate));
            }
            let head = [int_of(&f[1])?, int_of(&f[2])?, int_of(&f[3])?, int_of(&f[4])?];
            if head != [i.capacity, i.window, i.shard, i.expansion] {
                return Err(format!(
                    "capacity/window/shard/expansion {head:?}, expected {:?}",
                    [i.capacity, i.window, i.shard, i.expansion]
                ));
            }
            let Value::Array(list) = &f[7] else { return Err("shards is not an array".into()) };
            let mut shards = Vec::new();
            for s in list {
                let sf = fields(s, &["start", "items", "filters", "bytes"])?;
                shards.push((int_of(&sf[0])?, int_of(&sf[1])?, int_of(&sf[2])?, int_of(&sf[3])?));
            }
            let starts: Vec<i64> = shards.iter().map(|s| s.0).collect();
            let want: Vec<i64> = i.shards.iter().map(|s| s.0).collect();
            if starts != want {
                return Err(format!("shard starts {starts:?}, expected {want:?}"));
            }
            let mut fp = 0;
            for (got, want) in shards.iter().zip(&i.shards) {
                // An item a shard's own bits already showed is not inserted
                // again: a false positive may leave a shard one short.
                if got.1 > want.1 || got.1 < 0 {
                    return Err(format!("shard {} has {} items, expected at most {}", got.0, got.1, want.1));
                }
                fp += (want.1 - got.1) as u32;
                if got.2 < 1 || got.3 <= 0 {
                    return Err(format!("shard {}: filters {} bytes {}", got.0, got.2, got.3));
                }
            }
            let items = int_of(&f[5])?;
            let bytes = int_of(&f[6])?;
            if items != shards.iter().map(|s| s.1).sum::<i64>() || bytes != shards.iter().map(|s| s.3).sum::<i64>() {
                return Err(format!("items {items} / bytes {bytes} are not the sums over {shards:?}"));
            }
            m.fp += fp;
            Ok(())
        }
    }
}
