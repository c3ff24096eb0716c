//! The operator commands' arguments and filter: `IDEM.SCAN`'s options, and
//! which records they select. `IDEM.REQUEUE`'s transition is
//! [`super::requeue`], next to the others.

use super::{Millis, Record, State};
use crate::args::{ArgList, parse_options, require};
use crate::error::{CmdError, NOT_AN_INTEGER};

/// The most keys one `IDEM.SCAN` call asks the keyspace scan for, however
/// large its `COUNT`: the work of a call stays bounded (`COUNT` is a hint).
pub const MAX_SCAN_COUNT: i64 = 1000;
/// The longest `IDLE`: its ms are exact in a Lua number (2^53), so that
/// the Functions edition refuses exactly what the module refuses.
pub const MAX_IDLE_SECONDS: i64 = (1 << 53) / 1000;
/// `SCAN`'s own default.
pub const DEFAULT_SCAN_COUNT: i64 = 10;

/// `IDEM.SCAN`'s options, in the order [`parse_scan`] takes them.
pub const SCAN_OPTIONS: &[&str] = &["MATCH", "COUNT", "STATE", "MINTRIES", "IDLE"];

/// Which records an `IDEM.SCAN` returns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanFilter {
    pub state: Option<State>,
    pub min_tries: Option<u64>,
    /// In ms: the latest change is at least this old.
    pub idle: Option<Millis>,
}

impl ScanFilter {
    pub fn selects(&self, record: &Record, now: Millis) -> bool {
        self.state.is_none_or(|state| record.state_at(now) == state)
            && self.min_tries.is_none_or(|min| record.tries() >= min)
            && self.idle.is_none_or(|idle| now.saturating_sub(record.changed_at()) >= idle)
    }
}

/// `IDEM.SCAN`'s arguments, checked.
#[derive(Debug, PartialEq, Eq)]
pub struct ScanArgs {
    /// The cursor's argument index (a decimal u64, as `SCAN` takes it).
    pub cursor: usize,
    /// The `MATCH` pattern's argument index.
    pub pattern: Option<usize>,
    /// What to ask the keyspace scan for, at most [`MAX_SCAN_COUNT`].
    pub count: i64,
    pub filter: ScanFilter,
}

const INVALID_CURSOR: CmdError = CmdError::Static(c"ERR invalid cursor");

/// A state's name as `IDEM.GET` shows it, any case.
fn state_named(name: &[u8]) -> Option<State> {
    [State::Processing, State::Expired, State::Released, State::Done]
        .into_iter()
        .find(|state| state.name().to_bytes().eq_ignore_ascii_case(name))
}

/// A whole number >= 1, or `error`.
fn positive<A: ArgList + ?Sized>(args: &A, index: usize, error: &'static std::ffi::CStr) -> Result<i64, CmdError> {
    match args.int(index)? {
        n if n >= 1 => Ok(n),
        _ => Err(CmdError::Static(error)),
    }
}

/// `IDEM.SCAN cursor [MATCH pattern] [COUNT count] [STATE state]
/// [MINTRIES n] [IDLE seconds]`.
pub fn parse_scan<A: ArgList + ?Sized>(args: &A) -> Result<ScanArgs, CmdError> {
    require(args, 2)?;
    let cursor = args.bytes(1);
    if cursor.is_empty() || cursor.len() > 20 || !cursor.iter().all(u8::is_ascii_digit) {
        return Err(INVALID_CURSOR);
    }
    std::str::from_utf8(cursor).ok().and_then(|text| text.parse::<u64>().ok()).ok_or(INVALID_CURSOR)?;
    let mut scan = ScanArgs { cursor: 1, pattern: None, count: DEFAULT_SCAN_COUNT, filter: ScanFilter::default() };
    parse_options(args, 2, SCAN_OPTIONS, |option, value| {
        match option {
            0 => scan.pattern = Some(value),
            1 => {
                let count = positive(args, value, c"ERR COUNT must be a positive integer")?;
                scan.count = count.min(MAX_SCAN_COUNT);
            }
            2 => {
                scan.filter.state = Some(
                    state_named(args.bytes(value))
                        .ok_or(CmdError::Static(c"ERR STATE must be one of processing, expired, released, done"))?,
                )
            }
            3 => {
                scan.filter.min_tries = Some(positive(args, value, c"ERR MINTRIES must be a positive integer")? as u64)
            }
            _ => {
                let seconds = positive(args, value, c"ERR IDLE must be a positive integer (seconds)")?;
                if seconds > MAX_IDLE_SECONDS {
                    return Err(NOT_AN_INTEGER);
                }
                scan.filter.idle = Some(seconds * 1000);
            }
        }
        Ok(())
    })?;
    Ok(scan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Phase, Token};

    fn parse(words: &[&str]) -> Result<ScanArgs, String> {
        let args: Vec<&[u8]> = words.iter().map(|w| w.as_bytes()).collect();
        parse_scan(&args[..]).map_err(|e| e.message())
    }

    #[test]
    fn scan_arguments_parse_and_bad_ones_are_refused() {
        let scan = parse(&["IDEM.SCAN", "0", "state", "EXPIRED", "MinTries", "3", "IDLE", "60", "COUNT", "5000"]);
        let filter = ScanFilter { state: Some(State::Expired), min_tries: Some(3), idle: Some(60_000) };
        assert_eq!(scan, Ok(ScanArgs { cursor: 1, pattern: None, count: MAX_SCAN_COUNT, filter }));
        assert_eq!(parse(&["IDEM.SCAN", "18446744073709551615", "MATCH", "a*"]).map(|s| s.pattern), Ok(Some(3)));
        for (words, error) in [
            (&["IDEM.SCAN", "-1"][..], "ERR invalid cursor"),
            (&["IDEM.SCAN", "18446744073709551616"], "ERR invalid cursor"),
            (&["IDEM.SCAN", "x"], "ERR invalid cursor"),
            (&["IDEM.SCAN", "0", "COUNT", "0"], "ERR COUNT must be a positive integer"),
            (&["IDEM.SCAN", "0", "COUNT", "x"], "ERR value is not an integer or out of range"),
            (&["IDEM.SCAN", "0", "STATE", "stuck"], "ERR STATE must be one of processing, expired, released, done"),
            (&["IDEM.SCAN", "0", "MINTRIES", "0"], "ERR MINTRIES must be a positive integer"),
            (&["IDEM.SCAN", "0", "IDLE", "0"], "ERR IDLE must be a positive integer (seconds)"),
            (&["IDEM.SCAN", "0", "IDLE", "9007199254741"], "ERR value is not an integer or out of range"),
            (&["IDEM.SCAN", "0", "TYPE", "x"], "ERR syntax error, unknown option 'TYPE'"),
            (&["IDEM.SCAN", "0", "IDLE", "1", "idle", "2"], "ERR syntax error, option IDLE given twice"),
            (&["IDEM.SCAN", "0", "MATCH"], "ERR syntax error, option MATCH needs a value"),
        ] {
            assert_eq!(parse(words).unwrap_err(), error, "{words:?}");
        }
    }

    #[test]
    fn the_filter_reads_state_tries_and_the_latest_change() {
        let now = 1_000_000;
        let mut record = Record {
            phase: Phase::Processing,
            attempt: 5,
            claimed_at: now - 90_000,
            lease_end: now - 30_000,
            done_at: 0,
            token: Token([1; 16]),
            fingerprint: None,
            result: None,
            tries_base: 2,
            extended_at: now - 40_000,
            owner: None,
        };
        let selects = |record: &Record, state: Option<State>, min_tries: Option<u64>, idle: Option<i64>| {
            ScanFilter { state, min_tries, idle: idle.map(|s| s * 1000) }.selects(record, now)
        };
        assert!(selects(&record, Some(State::Expired), Some(3), Some(40)));
        assert!(!selects(&record, Some(State::Processing), None, None));
        assert!(!selects(&record, None, Some(4), None), "tries count from the requeue");
        assert!(!selects(&record, None, None, Some(41)), "the extension is the latest change");
        record.extended_at = 0;
        assert!(selects(&record, None, None, Some(90)));
        record.phase = Phase::Released;
        assert!(selects(&record, Some(State::Released), None, Some(30)) && !selects(&record, None, None, Some(31)));
    }

    const NOW: Millis = 1_800_000_000_000;
    const LIFETIMES: crate::record::Lifetimes = crate::record::Lifetimes { history: 3_600_000 };

    fn claim_args(max_tries: Option<u64>) -> crate::record::ClaimArgs {
        let owner = crate::record::Owner::new(b"worker-1");
        crate::record::ClaimArgs { lease: 10_000, max_tries, owner, ..Default::default() }
    }

    #[test]
    fn requeue_keeps_the_fence_rising_and_restarts_the_tries() {
        use crate::record::{ClaimReply, DoneReply, RequeueReply, Write, claim, done, extend, release, requeue};
        let (mut tokens, mut next) = (Vec::new(), 0u8);
        let mut token = || {
            next += 1;
            tokens.push(Token([next; 16]));
            Token([next; 16])
        };
        assert_eq!(requeue(None, NOW, LIFETIMES), (RequeueReply::Absent, Write::None));
        let Ok((_, Write::Create { mut record, .. })) = claim(None, &claim_args(Some(2)), NOW, LIFETIMES, &mut token)
        else {
            panic!()
        };
        assert_eq!(requeue(Some(&mut record), NOW + 1, LIFETIMES).0, RequeueReply::Busy, "a live lease");
        assert_eq!(record.phase, Phase::Processing);
        let later = NOW + 20_000;
        assert!(matches!(
            claim(Some(&mut record), &claim_args(Some(2)), later, LIFETIMES, &mut token).unwrap().0,
            ClaimReply::Retry { attempt: 2, .. }
        ));
        let dead = later + 20_000;
        assert_eq!(
            claim(Some(&mut record), &claim_args(Some(2)), dead, LIFETIMES, &mut token).unwrap().0,
            ClaimReply::Exhausted { attempt: 2 }
        );
        assert_eq!(record.owner.as_deref(), Some(&b"worker-1"[..]), "a dead letter shows who had it last");
        let held = record.token;
        assert_eq!(
            requeue(Some(&mut record), dead, LIFETIMES),
            (RequeueReply::Requeued, Write::Update { expire_at: dead + 3_600_000 })
        );
        assert_eq!(
            (record.state_at(dead), record.attempt, record.tries(), record.changed_at(), record.owner.as_deref()),
            (State::Released, 2, 0, dead, None),
            "given back: the latest holder's owner dropped with its token"
        );
        // The latest holder's token no longer works.
        assert_eq!(done(Some(&mut record.clone()), Some(held), None, 1000, dead).0, DoneReply::Stale);
        assert!(extend(Some(&mut record.clone()), Some(held), 1000, dead, LIFETIMES).0.is_err());
        assert!(!release(Some(&mut record.clone()), Some(held), dead, LIFETIMES).0);
        assert_eq!(done(Some(&mut record.clone()), Some(Token::default()), None, 1000, dead).0, DoneReply::Stale);
        // Two more tries, with attempts above any before.
        let reply = claim(Some(&mut record), &claim_args(Some(2)), dead, LIFETIMES, &mut token).unwrap().0;
        assert!(matches!(reply, ClaimReply::Retry { attempt: 3, .. }), "{reply:?}");
        assert_eq!(record.tries(), 1);
        let reply = claim(Some(&mut record), &claim_args(Some(2)), dead + 20_000, LIFETIMES, &mut token).unwrap().0;
        assert!(matches!(reply, ClaimReply::Retry { attempt: 4, .. }), "{reply:?}");
        let reply = claim(Some(&mut record), &claim_args(Some(2)), dead + 40_000, LIFETIMES, &mut token).unwrap().0;
        assert_eq!(reply, ClaimReply::Exhausted { attempt: 4 });
        // A done record gives its work back too, its result dropped.
        let mut completed = Record::done_without_claim(NOW, Some(b"result"));
        assert_eq!(requeue(Some(&mut completed), NOW + 5, LIFETIMES).0, RequeueReply::Requeued);
        assert_eq!(
            (completed.phase, completed.attempt, completed.done_at, completed.result.as_deref()),
            (Phase::Released, 0, 0, None)
        );
        assert!(matches!(
            claim(Some(&mut completed), &claim_args(None), NOW + 6, LIFETIMES, &mut token).unwrap().0,
            ClaimReply::Retry { attempt: 1, .. }
        ));
    }

    #[test]
    fn the_tries_base_and_extension_round_trip_and_format_2_still_loads() {
        use crate::record::codec;
        let mut record = Record {
            phase: Phase::Processing,
            attempt: 7,
            claimed_at: NOW,
            lease_end: NOW + 30_000,
            done_at: 0,
            token: Token([9; 16]),
            fingerprint: None,
            result: None,
            tries_base: 5,
            extended_at: NOW + 10,
            owner: Some(Box::from(&b"worker-7"[..])),
        };
        let mut bytes = Vec::new();
        codec::encode(&record, &mut bytes);
        assert_eq!(codec::decode(&bytes), Ok(record.clone()));
        assert_eq!(codec::pack(&record), None, "rare records stay boxed");
        record.tries_base = 0;
        record.extended_at = 0;
        record.owner = None;
        assert!(codec::pack(&record).is_some(), "the common record packs as before");
        // A released record as 0.1 (format 2) wrote it: attempt 2, claimed
        // and released at known times, with its token.
        let mut v2 = vec![2, 1, 4, 2];
        for time in [1_796_160_670_124u64, 1_796_160_670_124] {
            let mut slot = [0u8; 10];
            v2.extend_from_slice(unsigned_varint::encode::u64(time, &mut slot));
        }
        v2.push(0);
        v2.extend_from_slice(&[0xaf; 16]);
        let old = codec::decode(&v2).expect("format 2 loads");
        assert_eq!(
            (old.phase, old.attempt, old.tries(), old.tries_base, old.extended_at),
            (Phase::Released, 2, 2, 0, 0)
        );
        let mut again = Vec::new();
        codec::encode(&old, &mut again);
        assert_eq!(again[0], codec::FORMAT_VERSION);
        assert_eq!(codec::decode(&again), Ok(old));
        // Format 2 knew no tries base: its flag there is corruption.
        v2[2] |= 8;
        assert!(codec::decode(&v2).is_err());
    }
}
