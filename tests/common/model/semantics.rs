//! What each command does to the model's world, from docs/commands.md.

use crate::common::model::command::Cmd;
use crate::common::model::expect::{CVal, Exp, GetExp, InfoExp};
use crate::common::model::state::{Entry, Filt, Phase, Rec, Shard, Val, World};
use crate::common::model::{Cfg, DAY, PENDING};
use std::collections::BTreeSet;

// ---------------------------------------------------------------------------
// Semantics
// ---------------------------------------------------------------------------

pub fn fingerprint(payload: &[u8]) -> String {
    format!("{:032x}", xxhash_rust::xxh3::xxh3_128(payload))
}

fn wrongtype() -> Exp {
    Exp::Err("WRONGTYPE")
}

/// What a filter key holds for a module command: a live filter, nothing, or
/// another type.
enum FKey<'a> {
    Missing,
    Filter(&'a Filt),
    Other,
}

fn fkey<'a>(w: &'a World, db: usize, key: &str) -> FKey<'a> {
    match w.get(db, key) {
        None => FKey::Missing,
        // A filter with no live shard is gone for the module.
        Some(Entry { val: Val::Filt(f), .. }) if f.shards.is_empty() => FKey::Missing,
        Some(Entry { val: Val::Filt(f), .. }) => FKey::Filter(f),
        Some(_) => FKey::Other,
    }
}

/// Adds `items` at `t` to the filter in `key` (created from the configs when
/// missing); the answers (true = seen before) and the worlds it may leave.
/// `None` when the key holds another type.
fn filter_add(w: &World, db: usize, key: &str, items: &[String], t: i64, cfg: &Cfg) -> Option<Vec<(Vec<bool>, World)>> {
    let mut starts: Vec<Filt> = Vec::new();
    let mut user_expiry: Option<(Option<i64>, bool)> = None;
    match w.get(db, key) {
        None => starts.push(Filt::new(cfg.bf_rate, cfg.bf_capacity, cfg.bf_window, DAY, 2)),
        Some(Entry { val: Val::Filt(f), expire }) => {
            if f.shards.is_empty() {
                // Dead: deleted and made again from the configs, or kept with
                // a fresh shard.
                starts.push(Filt::new(cfg.bf_rate, cfg.bf_capacity, cfg.bf_window, DAY, 2));
                let mut kept = f.clone();
                kept.user_expiry = false;
                starts.push(kept);
            } else {
                starts.push(f.clone());
                user_expiry = Some((*expire, f.user_expiry));
            }
        }
        Some(_) => return None,
    }
    let mut out = Vec::new();
    for mut f in starts {
        let cur = f.current_start(t);
        let new_shard = !f.shards.contains_key(&cur);
        let mut answers = Vec::new();
        for item in items {
            answers.push(f.contains(item));
            f.shards.entry(cur).or_insert_with(|| Shard { items: BTreeSet::new() }).items.insert(item.clone());
        }
        let mut w2 = w.clone();
        match user_expiry {
            Some((expire, true)) if !new_shard => {
                // The user's expiry stays, or the module puts its own back.
                let mut kept = w2.clone();
                kept.dbs[db].insert(key.to_string(), Entry { val: Val::Filt(f.clone()), expire });
                out.push((answers.clone(), kept));
                f.user_expiry = false;
            }
            _ => f.user_expiry = false,
        }
        let expire = f.newest_end();
        w2.dbs[db].insert(key.to_string(), Entry { val: Val::Filt(f), expire });
        out.push((answers, w2));
    }
    Some(out)
}

fn rec_of<'a>(w: &'a World, db: usize, key: &str) -> Result<Option<&'a Rec>, ()> {
    match w.get(db, key) {
        None => Ok(None),
        Some(Entry { val: Val::Rec(r), .. }) => Ok(Some(r)),
        Some(_) => Err(()),
    }
}

fn put_rec(w: &mut World, db: usize, key: &str, r: Rec, expire: Option<i64>) {
    w.dbs[db].insert(key.to_string(), Entry { val: Val::Rec(r), expire });
}

/// Every answer the docs allow for `cmd` on database `db` of `w` (which is
/// already at `t`, see `World::at` and `variants`), each with the world it
/// leaves.
pub fn apply(w: &World, db: usize, cmd: &Cmd, t: i64, cfg: &Cfg) -> Vec<(Exp, World)> {
    let mut out = apply_documented(w, db, cmd, t, cfg);
    // `BLOOM` naming the record's own key: the docs do not say; the module
    // refuses it with an error (and changes nothing).
    if let Cmd::Claim { key, bloom: Some(b), .. } | Cmd::Done { key, bloom: Some(b), .. } = cmd
        && key == b
    {
        out.push((Exp::Err("ERR"), w.clone()));
    }
    out
}

fn apply_documented(w: &World, db: usize, cmd: &Cmd, t: i64, cfg: &Cfg) -> Vec<(Exp, World)> {
    use Cmd::*;
    let same = |e: Exp| vec![(e, w.clone())];
    match cmd {
        Batch(_) => unreachable!("tests/stateful.rs checks a batch part by part"),
        Claim { key, lease, payload, maxtries, bloom, owner } => {
            let fp = payload.as_deref().map(fingerprint);
            let bloom_key = bloom.as_deref().map(|b| fkey(w, db, b));
            let bloom_wrong = matches!(bloom_key, Some(FKey::Other));
            let rec = match rec_of(w, db, key) {
                Err(()) => return same(wrongtype()),
                Ok(r) => r,
            };
            let lease_ms = lease * 1000;
            let granted = |attempt: i64, old: Option<&Rec>| {
                let fingerprint = old.and_then(|r| r.fingerprint.clone()).or(fp.clone());
                let r = Rec {
                    phase: Phase::Processing,
                    attempt,
                    lease_end: t + lease_ms,
                    claimed_at: t,
                    done_at: 0,
                    result: None,
                    fingerprint,
                    token: Some(PENDING.to_string()),
                    tries_base: old.map_or(0, |r| r.tries_base),
                    // The claim's, replacing the last holder's; none clears it.
                    owner: owner.clone(),
                };
                let mut w2 = w.clone();
                put_rec(&mut w2, db, key, r, Some(t + lease_ms + cfg.history_ms));
                w2
            };
            let Some(r) = rec else {
                if bloom_wrong {
                    return same(wrongtype());
                }
                let seen = matches!(&bloom_key, Some(FKey::Filter(f)) if f.contains(key));
                let exp = if seen {
                    Exp::Claim { status: "SEEN", seen_ok: false, value: CVal::Token, attempt: 1 }
                } else {
                    Exp::Claim { status: "NEW", seen_ok: bloom_key.is_some(), value: CVal::Token, attempt: 1 }
                };
                return vec![(exp, granted(1, None))];
            };
            let mut out = if let (Some(want), Some(have)) = (&fp, &r.fingerprint)
                && want != have
            {
                same(Exp::Claim { status: "MISMATCH", seen_ok: false, value: CVal::Nil, attempt: r.attempt })
            } else if r.phase == Phase::Done {
                same(Exp::Claim {
                    status: "DONE",
                    seen_ok: false,
                    value: CVal::Result(r.result.clone()),
                    attempt: r.attempt,
                })
            } else if r.phase == Phase::Processing && t < r.lease_end {
                same(Exp::Claim {
                    status: "BUSY",
                    seen_ok: false,
                    value: CVal::Ms(r.lease_end - t),
                    attempt: r.attempt,
                })
            } else if maxtries.is_some_and(|n| r.attempt - r.tries_base >= n) {
                same(Exp::Claim { status: "EXHAUSTED", seen_ok: false, value: CVal::Nil, attempt: r.attempt })
            } else {
                vec![(
                    Exp::Claim { status: "RETRY", seen_ok: false, value: CVal::Token, attempt: r.attempt + 1 },
                    granted(r.attempt + 1, Some(r)),
                )]
            };
            // A record decides; whether the filter's type is checked first
            // the docs do not say.
            if bloom_wrong {
                out.push((wrongtype(), w.clone()));
            }
            out
        }
        Done { key, token, result, retain, bloom } => {
            let retain_ms = retain.map_or(cfg.retain_ms, |r| r * 1000);
            let rec = match rec_of(w, db, key) {
                Err(()) => return same(wrongtype()),
                Ok(r) => r,
            };
            let completed = match rec {
                None => Some(Rec {
                    phase: Phase::Done,
                    attempt: 0,
                    lease_end: 0,
                    claimed_at: 0,
                    done_at: t,
                    result: result.clone(),
                    fingerprint: None,
                    token: None,
                    tries_base: 0,
                    owner: None,
                }),
                Some(r) if r.phase == Phase::Done => None,
                Some(r) if r.token.as_deref() == Some(token.as_str()) => Some(Rec {
                    phase: Phase::Done,
                    lease_end: 0,
                    done_at: t,
                    result: result.clone(),
                    owner: None,
                    ..r.clone()
                }),
                Some(_) => None,
            };
            let not_done = if rec.is_some_and(|r| r.phase == Phase::Done) { Exp::Int(0) } else { Exp::Err("STALE") };
            let Some(done) = completed else {
                let mut out = same(not_done);
                if bloom.as_deref().is_some_and(|b| matches!(fkey(w, db, b), FKey::Other)) {
                    out.push((wrongtype(), w.clone()));
                }
                return out;
            };
            let mut base = w.clone();
            put_rec(&mut base, db, key, done, Some(t + retain_ms));
            match bloom {
                None => vec![(Exp::Int(1), base)],
                Some(b) => match filter_add(&base, db, b, std::slice::from_ref(key), t, cfg) {
                    Some(worlds) => worlds.into_iter().map(|(_, w2)| (Exp::Int(1), w2)).collect(),
                    // The filter key holds another type: the record is
                    // completed all the same, the add dropped (+4).
                    None => vec![(Exp::Int(5), base)],
                },
            }
        }
        Release { key, token } => match rec_of(w, db, key) {
            Err(()) => same(wrongtype()),
            Ok(Some(r))
                if r.phase == Phase::Processing && t < r.lease_end && r.token.as_deref() == Some(token.as_str()) =>
            {
                let mut w2 = w.clone();
                let r2 = Rec { phase: Phase::Released, lease_end: 0, ..r.clone() };
                put_rec(&mut w2, db, key, r2, Some(t + cfg.history_ms));
                vec![(Exp::Int(1), w2)]
            }
            Ok(_) => same(Exp::Int(0)),
        },
        // Released now, attempt kept, tries restarted, no token: the
        // latest holder's DONE is STALE.
        Requeue { key } => match rec_of(w, db, key) {
            Err(()) => same(wrongtype()),
            Ok(None) => same(Exp::Int(0)),
            Ok(Some(r)) if r.phase == Phase::Processing && t < r.lease_end => {
                same(Exp::Err("ERR the record is processing"))
            }
            Ok(Some(r)) => {
                let mut w2 = w.clone();
                let r2 = Rec {
                    phase: Phase::Released,
                    lease_end: 0,
                    done_at: 0,
                    result: None,
                    token: None,
                    tries_base: r.attempt,
                    owner: None,
                    ..r.clone()
                };
                put_rec(&mut w2, db, key, r2, Some(t + cfg.history_ms));
                vec![(Exp::Int(1), w2)]
            }
        },
        Extend { key, token, lease } => match rec_of(w, db, key) {
            Err(()) => same(wrongtype()),
            Ok(Some(r)) if r.phase == Phase::Processing && r.token.as_deref() == Some(token.as_str()) => {
                let mut w2 = w.clone();
                let end = t + lease * 1000;
                let r2 = Rec { lease_end: end, ..r.clone() };
                put_rec(&mut w2, db, key, r2, Some(end + cfg.history_ms));
                vec![(Exp::Int(1), w2)]
            }
            Ok(_) => same(Exp::Err("STALE")),
        },
        Get { key } => match rec_of(w, db, key) {
            Err(()) => same(wrongtype()),
            Ok(None) => same(Exp::Nil),
            Ok(Some(r)) => {
                let live = r.phase == Phase::Processing && t < r.lease_end;
                let state = match r.phase {
                    Phase::Done => "done",
                    Phase::Released => "released",
                    Phase::Processing if live => "processing",
                    Phase::Processing => "expired",
                };
                let expire = w.get(db, key).unwrap().expire;
                same(Exp::Get(Box::new(GetExp {
                    state,
                    attempt: r.attempt,
                    lease_ms: if live { r.lease_end - t } else { 0 },
                    pttl: expire.map_or(-1, |e| e - t),
                    claimed_at: r.claimed_at,
                    done_at: if r.phase == Phase::Done { r.done_at } else { 0 },
                    result: if r.phase == Phase::Done { r.result.clone() } else { None },
                    fingerprint: r.fingerprint.clone(),
                    tries: r.attempt - r.tries_base,
                    owner: r.owner.clone(),
                    pttl_slack: (0, 0),
                })))
            }
        },
        Once { key, retain } => match rec_of(w, db, key) {
            Err(()) => same(wrongtype()),
            Ok(Some(_)) => same(Exp::Int(0)),
            Ok(None) => {
                let mut w2 = w.clone();
                let r = Rec {
                    phase: Phase::Done,
                    attempt: 0,
                    lease_end: 0,
                    claimed_at: 0,
                    done_at: t,
                    result: None,
                    fingerprint: None,
                    token: None,
                    tries_base: 0,
                    owner: None,
                };
                put_rec(&mut w2, db, key, r, Some(t + retain * 1000));
                vec![(Exp::Int(1), w2)]
            }
        },
        BfReserve { key, rate, capacity, window, shard, expansion } => {
            let create = || {
                let mut f = Filt::new(
                    *rate,
                    *capacity,
                    window.unwrap_or(cfg.bf_window),
                    shard.unwrap_or(DAY),
                    expansion.unwrap_or(2),
                );
                f.shards.insert(f.current_start(t), Shard { items: BTreeSet::new() });
                let mut w2 = w.clone();
                let expire = f.newest_end();
                w2.dbs[db].insert(key.clone(), Entry { val: Val::Filt(f), expire });
                w2
            };
            match w.get(db, key) {
                None => vec![(Exp::Okay, create())],
                // A dead filter is deleted, or still there for a moment.
                Some(Entry { val: Val::Filt(f), .. }) if f.shards.is_empty() => {
                    vec![(Exp::Okay, create()), (Exp::Err("ERR key already exists"), w.clone())]
                }
                Some(_) => same(Exp::Err("ERR key already exists")),
            }
        }
        BfAdd { key, .. } | BfMadd { key, .. } => {
            let items: Vec<String> = match cmd {
                BfAdd { item, .. } => vec![item.clone()],
                BfMadd { items, .. } => items.clone(),
                _ => unreachable!(),
            };
            match filter_add(w, db, key, &items, t, cfg) {
                None => same(wrongtype()),
                Some(worlds) => worlds
                    .into_iter()
                    .map(|(seen, w2)| {
                        let bits: Vec<Exp> = seen.iter().map(|&s| Exp::Bloom { seen: s, add: true }).collect();
                        let exp = if matches!(cmd, BfAdd { .. }) {
                            bits.into_iter().next().unwrap()
                        } else {
                            Exp::Array(bits)
                        };
                        (exp, w2)
                    })
                    .collect(),
            }
        }
        BfExists { key, item } => match fkey(w, db, key) {
            FKey::Other => same(wrongtype()),
            FKey::Missing => same(Exp::Bloom { seen: false, add: false }),
            FKey::Filter(f) => same(Exp::Bloom { seen: f.contains(item), add: false }),
        },
        BfMexists { key, items } => match fkey(w, db, key) {
            FKey::Other => same(wrongtype()),
            FKey::Missing => same(Exp::Array(items.iter().map(|_| Exp::Bloom { seen: false, add: false }).collect())),
            FKey::Filter(f) => {
                same(Exp::Array(items.iter().map(|i| Exp::Bloom { seen: f.contains(i), add: false }).collect()))
            }
        },
        BfInfo { key } => match fkey(w, db, key) {
            FKey::Other => same(wrongtype()),
            FKey::Missing => same(Exp::Nil),
            FKey::Filter(f) => same(Exp::Info(Box::new(InfoExp {
                rate: f.rate(),
                capacity: f.capacity,
                window: f.window,
                shard: f.period,
                expansion: f.expansion,
                shards: f.shards.iter().map(|(&s, sh)| (s, sh.items.len() as i64)).collect(),
            }))),
        },
        Del { key } | Unlink { key } => match w.get(db, key) {
            None => same(Exp::Int(0)),
            Some(_) => {
                let mut w2 = w.clone();
                w2.dbs[db].remove(key);
                vec![(Exp::Int(1), w2)]
            }
        },
        Exists { key } => same(Exp::Int(w.get(db, key).is_some() as i64)),
        Type { key } => same(Exp::Text(w.get(db, key).map_or("none", |e| e.val.type_name()))),
        Pttl { key } => same(Exp::Int(match w.get(db, key) {
            None => -2,
            Some(e) => e.expire.map_or(-1, |x| x - t),
        })),
        Pexpiretime { key } => same(Exp::Int(match w.get(db, key) {
            None => -2,
            Some(e) => e.expire.unwrap_or(-1),
        })),
        Pexpire { key, .. } | Expire { key, .. } => match w.get(db, key) {
            None => same(Exp::Int(0)),
            Some(_) => {
                let ms = match cmd {
                    Expire { secs, .. } => secs * 1000,
                    Pexpire { ms, .. } => *ms,
                    _ => unreachable!(),
                };
                let mut w2 = w.clone();
                let e = w2.dbs[db].get_mut(key).unwrap();
                e.expire = Some(t + ms);
                if let Val::Filt(f) = &mut e.val {
                    f.user_expiry = true;
                }
                vec![(Exp::Int(1), w2)]
            }
        },
        Persist { key } => match w.get(db, key) {
            Some(Entry { expire: Some(_), .. }) => {
                let mut w2 = w.clone();
                let e = w2.dbs[db].get_mut(key).unwrap();
                e.expire = None;
                if let Val::Filt(f) = &mut e.val {
                    f.user_expiry = true;
                }
                vec![(Exp::Int(1), w2)]
            }
            _ => same(Exp::Int(0)),
        },
        Copy { src, dst, replace } => match w.get(db, src) {
            None => same(Exp::Int(0)),
            Some(_) if w.get(db, dst).is_some() && !replace => same(Exp::Int(0)),
            Some(e) => {
                let mut w2 = w.clone();
                w2.dbs[db].insert(dst.clone(), e.clone());
                vec![(Exp::Int(1), w2)]
            }
        },
        Rename { src, dst } => match w.get(db, src) {
            None => same(Exp::Err("ERR no such key")),
            Some(e) => {
                let mut w2 = w.clone();
                let e = e.clone();
                w2.dbs[db].remove(src);
                w2.dbs[db].insert(dst.clone(), e);
                vec![(Exp::Okay, w2)]
            }
        },
        Dump { key, slot } => {
            let mut w2 = w.clone();
            match w.get(db, key) {
                None => {
                    w2.dumps[*slot] = None;
                    vec![(Exp::Nil, w2)]
                }
                Some(e) => {
                    w2.dumps[*slot] = Some(e.val.clone());
                    vec![(Exp::Payload, w2)]
                }
            }
        }
        Restore { key, slot, ttl, replace, absttl } => {
            let Some(val) = w.dumps[*slot].clone() else {
                return same(Exp::Err("<the model holds no value for this payload>"));
            };
            if w.get(db, key).is_some() && !replace {
                return same(Exp::Err("BUSYKEY"));
            }
            let mut w2 = w.clone();
            w2.dbs[db].remove(key);
            let when = if *ttl == 0 {
                None
            } else if *absttl {
                Some(*ttl)
            } else {
                Some(t + ttl)
            };
            // Redis does not create a key whose expiry has already come.
            if when.is_none_or(|e| e > t) {
                let mut val = val;
                if let Val::Filt(f) = &mut val {
                    f.user_expiry = true;
                }
                w2.dbs[db].insert(key.clone(), Entry { val, expire: when });
                w2.purge(t);
            }
            vec![(Exp::Okay, w2)]
        }
        Move { key } => {
            // Runs on db 0; the caller resolves `variants` of db 1 too.
            match w.get(0, key) {
                None => same(Exp::Int(0)),
                Some(_) if w.get(1, key).is_some() => same(Exp::Int(0)),
                Some(e) => {
                    let mut w2 = w.clone();
                    let e = e.clone();
                    w2.dbs[0].remove(key);
                    w2.dbs[1].insert(key.clone(), e);
                    vec![(Exp::Int(1), w2)]
                }
            }
        }
        Swapdb => {
            let mut w2 = w.clone();
            w2.dbs.swap(0, 1);
            vec![(Exp::Okay, w2)]
        }
        DebugReload => same(Exp::Okay),
        SetStr { key, px } => {
            let mut w2 = w.clone();
            w2.dbs[db].insert(key.clone(), Entry { val: Val::Str(b"plain".to_vec()), expire: Some(t + px) });
            vec![(Exp::Okay, w2)]
        }
    }
}
