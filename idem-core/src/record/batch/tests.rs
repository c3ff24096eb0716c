//! The batch transitions against the single ones: a batch answers, and
//! leaves, what the same single commands in key order answer and leave,
//! duplicates of a key included; and its arguments' errors.

use std::collections::HashMap;

use proptest::prelude::*;

use super::*;
use crate::record::{self, MAX_OWNER, Owner, Phase};

const LIFETIMES: Lifetimes = Lifetimes { history: 3_600_000 };
const T0: Millis = 1_800_000_000_000;
const RETAIN: Millis = 86_400_000;

fn words(text: &str) -> Vec<Vec<u8>> {
    text.split(' ').map(|w| w.as_bytes().to_vec()).collect()
}

fn argv(words: &[Vec<u8>]) -> Vec<&[u8]> {
    words.iter().map(|w| &w[..]).collect()
}

/// Records with their absolute expiry, as Redis would hold them.
#[derive(Clone, Default, Debug, PartialEq)]
struct Store {
    keys: HashMap<Vec<u8>, (Record, Millis)>,
    /// Keys of another type.
    strings: Vec<Vec<u8>>,
}

impl Store {
    fn live(&mut self, key: &[u8], now: Millis) -> Option<&mut Record> {
        if self.keys.get(key).is_some_and(|(_, at)| now >= *at) {
            self.keys.remove(key);
        }
        self.keys.get_mut(key).map(|(record, _)| record)
    }

    fn apply(&mut self, key: &[u8], write: Write) {
        match write {
            Write::None => {}
            Write::Update { expire_at } => self.keys.get_mut(key).expect("record").1 = expire_at,
            Write::Create { record, expire_at } => {
                self.keys.insert(key.to_vec(), (record, expire_at));
            }
        }
    }

    /// Runs a batch on this store as the command layer does: one held
    /// record per distinct key, then each written key stored.
    fn batch<R>(
        &mut self,
        args: &[&[u8]],
        layout: Layout,
        now: Millis,
        run: impl FnOnce(&mut Batch<'_>) -> R,
    ) -> (R, Vec<u8>) {
        let (positions, firsts) = distinct(args, layout);
        let names: Vec<Vec<u8>> = firsts.iter().map(|&p| args[layout.key(p)].to_vec()).collect();
        for name in &names {
            self.live(name, now);
        }
        let mut copies: Vec<Option<Record>> = names.iter().map(|n| self.keys.get(n).map(|e| e.0.clone())).collect();
        let held = copies.iter_mut().zip(&names).map(|(copy, name)| match copy {
            _ if self.strings.contains(name) => Held::WrongType,
            Some(record) => Held::Stored(record),
            None => Held::Absent,
        });
        let mut batch = Batch::new(positions, held.collect::<Vec<_>>());
        let replies = run(&mut batch);
        let mut effect = Vec::new();
        batch.effect(&mut effect);
        let written: Vec<(usize, Millis)> = batch.written().collect();
        let created: Vec<Option<Record>> = batch.keys.into_iter().map(|(held, _)| held.into_created()).collect();
        for (index, expire_at) in written {
            let record = created[index].clone().or_else(|| copies[index].clone()).expect("a written record");
            self.keys.insert(names[index].clone(), (record, expire_at));
        }
        (replies, effect)
    }
}

fn tokens() -> impl FnMut() -> Token {
    let mut next = 0u8;
    move || {
        next += 1;
        Token([next; 16])
    }
}

#[test]
fn a_key_given_twice_sees_its_first_occurrence() {
    let mut store = Store::default();
    let w = words("IDEM.MCLAIM 30 3 a b a");
    let args = argv(&w);
    let parsed = parse_mclaim(&args[..], T0).unwrap();
    let (replies, effect) =
        store.batch(&args, parsed.layout, T0, |b| mclaim(&args[..], &parsed, b, T0, LIFETIMES, |_| false, tokens()));
    let replies: Vec<ClaimReply> = replies.into_iter().map(Result::unwrap).collect();
    assert_eq!(
        replies,
        [
            ClaimReply::New { token: Token([1; 16]) },
            ClaimReply::New { token: Token([2; 16]) },
            ClaimReply::Busy { lease_left: 30_000, attempt: 1 },
        ]
    );
    // One record per distinct key in the effect, in first-occurrence order.
    let decoded = decode_effect(&effect, 2).unwrap();
    assert_eq!(decoded[0].0, store.keys[&b"a"[..]].0);
    assert_eq!(decoded[1].0.token, Token([2; 16]));

    // DONE twice in one MDONE: completed, then already done.
    let tok = String::from_utf8(Token([1; 16]).to_hex().to_vec()).unwrap();
    let w = words(&format!("IDEM.MDONE 2 a {tok} a {tok} RESULTS r1 r2"));
    let args = argv(&w);
    let parsed = parse_mdone(&args[..], T0 + 5, RETAIN).unwrap();
    let (replies, _) =
        store.batch(&args, parsed.layout, T0 + 5, |b| mdone(&args[..], &parsed, b, T0 + 5, 100, true, |_| Ok(())));
    let replies: Vec<DoneReply> = replies.into_iter().map(Result::unwrap).collect();
    assert_eq!(replies, [DoneReply::Completed, DoneReply::AlreadyDone]);
    assert_eq!(store.keys[&b"a"[..]].0.result.as_deref(), Some(&b"r1"[..]));
    assert_eq!(store.keys[&b"a"[..]].0.phase, Phase::Done);
}

#[test]
fn per_key_errors_leave_the_other_keys_to_their_answers() {
    let mut store = Store { strings: vec![b"s".to_vec()], ..Store::default() };
    let w = words("IDEM.MCLAIM 30 2 s a");
    let args = argv(&w);
    let parsed = parse_mclaim(&args[..], T0).unwrap();
    let (replies, _) =
        store.batch(&args, parsed.layout, T0, |b| mclaim(&args[..], &parsed, b, T0, LIFETIMES, |_| false, tokens()));
    assert!(replies[0].as_ref().unwrap_err().message().starts_with("WRONGTYPE"));
    assert!(matches!(replies[1], Ok(ClaimReply::New { .. })));

    // A token too long, a stale token, a result too large, a good one.
    let good = String::from_utf8(Token([1; 16]).to_hex().to_vec()).unwrap();
    let long = "x".repeat(33);
    let w = words(&format!(
        "IDEM.MDONE 4 a {long} a 00000000000000000000000000000000 a {good} a {good} RESULTS x x 0123456789abc x"
    ));
    let args = argv(&w);
    let parsed = parse_mdone(&args[..], T0, RETAIN).unwrap();
    let (replies, _) = store.batch(&args, parsed.layout, T0, |b| mdone(&args[..], &parsed, b, T0, 8, true, |_| Ok(())));
    let messages: Vec<String> =
        replies.iter().map(|r| r.as_ref().map_or_else(|e| e.message(), |d| format!("{d:?}"))).collect();
    assert_eq!(messages[0], "ERR invalid token");
    assert_eq!(messages[1], "Stale");
    assert!(messages[2].contains("larger than idem.max-result"), "{}", messages[2]);
    assert_eq!(messages[3], "Completed");
    assert_eq!(store.keys[&b"a"[..]].0.result.as_deref(), Some(&b"x"[..]));
}

#[test]
fn arguments_are_checked_before_any_key() {
    let mclaim = |text: &str| {
        let w = words(text);
        parse_mclaim(&argv(&w)[..], T0).map(|_| ()).map_err(|e| e.message())
    };
    assert!(mclaim("IDEM.MCLAIM 30 0 a").unwrap_err().contains("numkeys must be between 1 and 10000"));
    assert!(mclaim("IDEM.MCLAIM 30 -1 a").unwrap_err().contains("numkeys must be between 1 and 10000"));
    assert!(mclaim("IDEM.MCLAIM 30 10001 a").unwrap_err().contains("numkeys must be between 1 and 10000"));
    assert!(mclaim("IDEM.MCLAIM 30 x a").unwrap_err().contains("not an integer"));
    assert!(mclaim("IDEM.MCLAIM 30 3 a b").unwrap_err().starts_with("ERR syntax error"));
    assert!(mclaim("IDEM.MCLAIM 30 99999999999999999999 a").unwrap_err().contains("not an integer"));
    assert!(mclaim("IDEM.MCLAIM 0 1 a").unwrap_err().contains("invalid expire time"));
    assert!(mclaim("IDEM.MCLAIM 30 2 a b PAYLOADS p").unwrap_err().contains("needs 2 values"));
    assert!(mclaim("IDEM.MCLAIM 30 2 a b PAYLOADS p q r").unwrap_err().contains("unknown option 'r'"));
    assert!(mclaim("IDEM.MCLAIM 30 2 a b MAXTRIES 0").unwrap_err().contains("MAXTRIES"));
    assert!(mclaim("IDEM.MCLAIM 30 2 a b BLOOM b").unwrap_err().contains("another key"));
    assert!(mclaim("IDEM.MCLAIM 30 1 a WAIT 10").unwrap_err().contains("unknown option"));
    assert!(mclaim("IDEM.MCLAIM 30 1 a BLOOM f bloom g").unwrap_err().contains("given twice"));
    assert_eq!(mclaim("IDEM.MCLAIM 30 2 a b payloads BLOOM MAXTRIES maxtries 2 bloom f"), Ok(()));
    let long = "w".repeat(MAX_OWNER + 1);
    assert_eq!(mclaim(&format!("IDEM.MCLAIM 30 1 a OWNER {long}")), Err("ERR OWNER must be 1 to 64 bytes".into()));
    assert_eq!(mclaim("IDEM.MCLAIM 30 1 a OWNER "), Err("ERR OWNER must be 1 to 64 bytes".into()));
    assert!(mclaim("IDEM.MCLAIM 30 1 a OWNER w1 owner w2").unwrap_err().contains("option OWNER given twice"));
    assert!(mclaim("IDEM.MCLAIM 30 1 a OWNER").unwrap_err().contains("option OWNER needs a value"));
    let w = words(&format!("IDEM.MCLAIM 30 2 a b OWNER {} PAYLOADS OWNER BLOOM", &long[1..]));
    let parsed = parse_mclaim(&argv(&w)[..], T0).unwrap();
    assert_eq!(parsed.claim.owner.map(|o| o.as_bytes().to_vec()), Some(long.as_bytes()[1..].to_vec()));

    let mdone = |text: &str| {
        let w = words(text);
        parse_mdone(&argv(&w)[..], T0, RETAIN).map(|p| p.layout.numkeys).map_err(|e| e.message())
    };
    assert_eq!(mdone("IDEM.MDONE 1 a t"), Ok(1));
    assert!(mdone("IDEM.MDONE 2 a t b").unwrap_err().starts_with("ERR syntax error"));
    assert!(mdone("IDEM.MDONE 1 a t RESULTS").unwrap_err().contains("needs a value"));
    assert!(mdone("IDEM.MDONE 2 a t b u RESULTS r").unwrap_err().contains("needs 2 values"));
    assert!(mdone("IDEM.MDONE 1 a t RETAIN 0").unwrap_err().contains("invalid expire time"));
    assert!(mdone("IDEM.MDONE 0 a t").unwrap_err().contains("numkeys"));

    let mrelease = |text: &str| {
        let w = words(text);
        parse_mrelease(&argv(&w)[..]).map(|l| l.numkeys).map_err(|e| e.message())
    };
    assert_eq!(mrelease("IDEM.MRELEASE 2 a t b u"), Ok(2));
    assert!(mrelease("IDEM.MRELEASE 2 a t b").unwrap_err().starts_with("ERR syntax error"));
    assert!(mrelease("IDEM.MRELEASE 1 a t b").unwrap_err().starts_with("ERR syntax error"));
}

#[test]
fn key_positions_come_from_the_parsers_walker() {
    let at = |text: &str, command| {
        let w = words(text);
        key_positions(&argv(&w)[..], command)
    };
    // A payload spelling BLOOM is a payload; the filter is the option's value.
    assert_eq!(at("IDEM.MCLAIM 30 2 BLOOM b PAYLOADS BLOOM x BLOOM f", Command::MClaim), (vec![3, 4], Some(9)));
    // So is an owner, and a payload spelling OWNER.
    assert_eq!(at("IDEM.MCLAIM 30 1 a OWNER BLOOM BLOOM f", Command::MClaim), (vec![3], Some(7)));
    assert_eq!(at("IDEM.MCLAIM 30 1 a PAYLOADS OWNER BLOOM f", Command::MClaim), (vec![3], Some(7)));
    assert_eq!(at("IDEM.MCLAIM 30 1 a OWNER BLOOM", Command::MClaim), (vec![3], None));
    assert_eq!(at("IDEM.MDONE 2 a BLOOM b t RESULTS BLOOM r RETAIN 5", Command::MDone), (vec![2, 4], None));
    assert_eq!(at("IDEM.MDONE 1 a t BLOOM f", Command::MDone), (vec![2], Some(5)));
    assert_eq!(at("IDEM.MRELEASE 2 a t b u", Command::MRelease), (vec![2, 4], None));
    // Calls that do not parse name no keys: they fail before any.
    assert_eq!(at("IDEM.MCLAIM 30 5 a b", Command::MClaim), (vec![], None));
    assert_eq!(at("IDEM.MDONE -1 a t", Command::MDone), (vec![], None));
}

#[test]
fn a_damaged_batch_effect_is_refused_whole() {
    let record = Record::done_without_claim(T0, Some(b"r"));
    let mut one = Vec::new();
    let len = codec::effect(&record, Some(T0 + 1)).len() as u32;
    one.extend_from_slice(&len.to_le_bytes());
    one.extend_from_slice(&codec::effect(&record, Some(T0 + 1)));
    let two = [one.clone(), one.clone()].concat();
    assert_eq!(decode_effect(&two, 2).unwrap().len(), 2);
    assert!(decode_effect(&two, 1).is_err());
    assert!(decode_effect(&two, 3).is_err());
    assert!(decode_effect(&two[..two.len() - 1], 2).is_err());
    assert!(decode_effect(&[0xff, 0xff, 0xff, 0x7f], 1).is_err());
}

/// A prepared key: what single commands leave it as.
#[derive(Clone, Copy, Debug)]
enum Prep {
    Absent,
    Busy,
    Released,
    Lapsed,
    Done,
    Exhausted,
    Fingerprinted,
    WrongType,
    /// Released at the largest attempt: a claim answers an error.
    AtLastAttempt,
}

fn prepare(store: &mut Store, key: &[u8], prep: Prep, tokens: &mut impl FnMut() -> Token) {
    let now = T0 - 100_000;
    // Held by an owner that a batch's claim replaces (or, without OWNER,
    // clears).
    let args =
        |fingerprint| ClaimArgs { lease: 10_000, fingerprint, owner: Owner::new(b"prev"), ..ClaimArgs::default() };
    let mut claim_it = |store: &mut Store, fingerprint| {
        let (reply, write) =
            claim(store.live(key, now), &args(fingerprint), now, LIFETIMES, &mut *tokens).expect("a claim");
        store.apply(key, write);
        match reply {
            ClaimReply::New { token } | ClaimReply::Retry { token, .. } => token,
            other => panic!("{other:?}"),
        }
    };
    match prep {
        Prep::Absent => {}
        Prep::WrongType => store.strings.push(key.to_vec()),
        Prep::Lapsed => drop(claim_it(store, None)),
        Prep::Fingerprinted => drop(claim_it(store, Some(Fingerprint::from(7)))),
        Prep::Busy => {
            let (_, write) =
                claim(None, &ClaimArgs { lease: 1_000_000, ..args(None) }, now, LIFETIMES, &mut *tokens).expect("NEW");
            store.apply(key, write);
        }
        Prep::Released | Prep::Exhausted => {
            let token = claim_it(store, None);
            let (_, write) = release(store.live(key, now), Some(token), now, LIFETIMES);
            store.apply(key, write);
            if let Prep::Exhausted = prep {
                let token = claim_it(store, None);
                let (_, write) = release(store.live(key, now), Some(token), now, LIFETIMES);
                store.apply(key, write);
            }
        }
        Prep::Done => {
            let token = claim_it(store, None);
            let (_, write) = done(store.live(key, now), Some(token), Some(b"kept"), RETAIN, now);
            store.apply(key, write);
        }
        Prep::AtLastAttempt => {
            let token = claim_it(store, None);
            let (_, write) = release(store.live(key, now), Some(token), now, LIFETIMES);
            store.apply(key, write);
            store.live(key, now).expect("released").attempt = record::MAX_ATTEMPT;
        }
    }
}

fn prep() -> impl Strategy<Value = Prep> {
    prop_oneof![
        Just(Prep::Absent),
        Just(Prep::Busy),
        Just(Prep::Released),
        Just(Prep::Lapsed),
        Just(Prep::Done),
        Just(Prep::Exhausted),
        Just(Prep::Fingerprinted),
        Just(Prep::WrongType),
        Just(Prep::AtLastAttempt),
    ]
}

/// Single commands in key order on `store`; WRONGTYPE keys answer Err.
fn singles_claim(
    store: &mut Store,
    keys: &[Vec<u8>],
    payloads: &[u8],
    (max, owner): (Option<u64>, Option<Owner>),
    seen: &[bool],
) -> Vec<String> {
    let mut next = tokens();
    keys.iter()
        .enumerate()
        .map(|(i, key)| {
            if store.strings.contains(key) {
                return "WRONGTYPE".to_string();
            }
            let record = store.live(key, T0);
            let maybe_seen = record.is_none() && seen[i];
            let args = ClaimArgs {
                lease: 30_000,
                fingerprint: Some(record::fingerprint(&[payloads[i]])),
                max_tries: max,
                maybe_seen,
                wait: 0,
                owner,
            };
            match claim(record, &args, T0, LIFETIMES, &mut next) {
                Ok((reply, write)) => {
                    store.apply(key, write);
                    format!("{reply:?}")
                }
                Err(error) => error.message()[..9].to_string(),
            }
        })
        .collect()
}

proptest! {
    #[test]
    fn mclaim_answers_and_leaves_what_single_claims_do(
        preps in proptest::collection::vec(prep(), 4),
        picks in proptest::collection::vec((0..4usize, 0..2u8, any::<bool>()), 1..12),
        max in proptest::option::of(1..4u64),
        owner in proptest::option::of(0..2u8),
    ) {
        let mut base = Store::default();
        let mut setup_tokens = || Token([0xee; 16]);
        for (i, prep) in preps.iter().enumerate() {
            prepare(&mut base, format!("k{i}").as_bytes(), *prep, &mut setup_tokens);
        }
        let keys: Vec<Vec<u8>> = picks.iter().map(|(k, _, _)| format!("k{k}").into_bytes()).collect();
        let payloads: Vec<u8> = picks.iter().map(|(_, p, _)| b'a' + p).collect();
        let seen: Vec<bool> = picks.iter().map(|(_, _, s)| *s).collect();

        let mut singles = base.clone();
        let owner_name = owner.map(|o| format!("worker-{o}"));
        let owner_arg = owner_name.as_ref().map(|name| Owner::new(name.as_bytes()).unwrap());
        let want = singles_claim(&mut singles, &keys, &payloads, (max, owner_arg), &seen);

        let mut text = format!("IDEM.MCLAIM 30 {}", keys.len());
        for key in &keys { text += &format!(" {}", String::from_utf8_lossy(key)); }
        text += " PAYLOADS";
        for p in &payloads { text += &format!(" {}", *p as char); }
        if let Some(max) = max { text += &format!(" MAXTRIES {max}"); }
        if let Some(name) = &owner_name { text += &format!(" OWNER {name}"); }
        text += " BLOOM filter";
        let w = words(&text);
        let args = argv(&w);
        let parsed = parse_mclaim(&args[..], T0).unwrap();
        let mut batched = base.clone();
        let (replies, _) = batched.batch(&args, parsed.layout, T0, |b| {
            mclaim(&args[..], &parsed, b, T0, LIFETIMES, |position| seen[position], tokens())
        });
        let got: Vec<String> = replies
            .into_iter()
            .map(|r| r.map_or_else(|e| e.message()[..9].to_string(), |c| format!("{c:?}")))
            .collect();
        prop_assert_eq!(got, want);
        prop_assert_eq!(batched, singles);
    }

    #[test]
    fn mdone_and_mrelease_answer_and_leave_what_single_ones_do(
        preps in proptest::collection::vec(prep(), 3),
        picks in proptest::collection::vec((0..3usize, 0..3u8), 1..10),
        release_them in any::<bool>(),
    ) {
        let mut base = Store::default();
        let mut setup_tokens = || Token([0xee; 16]);
        for (i, prep) in preps.iter().enumerate() {
            prepare(&mut base, format!("k{i}").as_bytes(), *prep, &mut setup_tokens);
        }
        // The live token, another token, or no token at all.
        let token_text = |pick: u8| match pick {
            0 => String::from_utf8(Token([0xee; 16]).to_hex().to_vec()).unwrap(),
            1 => "0".repeat(32),
            _ => "not-a-token".to_string(),
        };
        let mut singles = base.clone();
        let mut want = Vec::new();
        for (k, t) in &picks {
            let key = format!("k{k}").into_bytes();
            if singles.strings.contains(&key) {
                want.push("WRONGTYPE".to_string());
                continue;
            }
            let token = Token::from_hex(token_text(*t).as_bytes());
            let record = singles.live(&key, T0);
            let (reply, write) = if release_them {
                let (released, write) = release(record, token, T0, LIFETIMES);
                (format!("{released:?}"), write)
            } else {
                let (reply, write) = done(record, token, Some(b"r"), RETAIN, T0);
                (format!("{reply:?}"), write)
            };
            singles.apply(&key, write);
            want.push(reply);
        }
        let command = if release_them { "IDEM.MRELEASE" } else { "IDEM.MDONE" };
        let mut text = format!("{command} {}", picks.len());
        for (k, t) in &picks { text += &format!(" k{k} {}", token_text(*t)); }
        if !release_them {
            text += " RESULTS";
            for _ in &picks { text += " r"; }
        }
        let w = words(&text);
        let args = argv(&w);
        let mut batched = base.clone();
        let got: Vec<String> = if release_them {
            let layout = parse_mrelease(&args[..]).unwrap();
            let (replies, _) = batched.batch(&args, layout, T0, |b| mrelease(&args[..], layout, b, T0, LIFETIMES));
            replies.into_iter().map(|r| r.map_or_else(|e| e.message()[..9].to_string(), |x| format!("{x:?}"))).collect()
        } else {
            let parsed = parse_mdone(&args[..], T0, RETAIN).unwrap();
            let (replies, _) =
                batched.batch(&args, parsed.layout, T0, |b| mdone(&args[..], &parsed, b, T0, 100, true, |_| Ok(())));
            replies.into_iter().map(|r| r.map_or_else(|e| e.message()[..9].to_string(), |x| format!("{x:?}"))).collect()
        };
        prop_assert_eq!(got, want);
        prop_assert_eq!(batched, singles);
    }
}
