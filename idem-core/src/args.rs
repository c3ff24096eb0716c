//! Argument parsing shared by the commands: numbers, time arguments and
//! `NAME value` options, with Redis's own wording for their errors.
//!
//! Parsing is pure Rust over [`ArgList`], so every command's parser runs
//! (and is fuzzed) without a server.

use crate::Millis;
use crate::error::{CmdError, CmdResult, NOT_AN_INTEGER};
use crate::record::MAX_SECONDS;

/// A command's arguments as bytes, `0` being the command name.
pub trait ArgList {
    fn len(&self) -> usize;
    fn bytes(&self, index: usize) -> &[u8];

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// An integer as Redis reads one: optional `-`, digits, no leading
    /// zeros or spaces, within i64.
    fn int(&self, index: usize) -> Result<i64, CmdError> {
        parse_i64(self.bytes(index)).ok_or(NOT_AN_INTEGER)
    }

    fn double(&self, index: usize) -> Result<f64, CmdError> {
        std::str::from_utf8(self.bytes(index))
            .ok()
            .and_then(|text| text.parse::<f64>().ok())
            .filter(|value| !value.is_nan())
            .ok_or(CmdError::Static(c"ERR value is not a valid float"))
    }
}

impl ArgList for [&[u8]] {
    fn len(&self) -> usize {
        <[&[u8]]>::len(self)
    }

    fn bytes(&self, index: usize) -> &[u8] {
        self[index]
    }
}

/// At least `count` arguments. Redis checks each command's arity before
/// running it; the parsers check again so that they stand on their own.
pub fn require<A: ArgList + ?Sized>(args: &A, count: usize) -> CmdResult {
    if args.len() < count {
        return Err(CmdError::Static(c"ERR wrong number of arguments"));
    }
    Ok(())
}

/// Redis's `string2ll`: the exact decimal spelling of an i64, nothing else.
pub fn parse_i64(text: &[u8]) -> Option<i64> {
    let (negative, digits) = match text {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, text),
    };
    match digits {
        [] => return None,
        [b'0'] if !negative => return Some(0),
        [b'1'..=b'9', ..] => {}
        _ => return None,
    }
    let mut value: i64 = 0;
    for &digit in digits {
        if !digit.is_ascii_digit() {
            return None;
        }
        let digit = (digit - b'0') as i64;
        value = value.checked_mul(10)?;
        value = if negative { value.checked_sub(digit)? } else { value.checked_add(digit)? };
    }
    Some(value)
}

/// A time argument: whole seconds >= 1, in ms. Refused, as `SET EX` refuses
/// it, when it could not be an absolute Unix-ms expiry after adding the
/// longest configurable history or retention.
pub fn seconds_arg<A: ArgList + ?Sized>(args: &A, index: usize, now: Millis) -> Result<Millis, CmdError> {
    let seconds = args.int(index)?;
    let limit = (i64::MAX - now) / 1000 - MAX_SECONDS;
    if seconds < 1 || seconds > limit {
        // Named as registered, as Redis names it in its own errors.
        let command = String::from_utf8_lossy(args.bytes(0)).to_uppercase();
        return Err(CmdError::new(format!("ERR invalid expire time in '{command}' command")));
    }
    Ok(seconds * 1000)
}

/// Options after the fixed arguments: `NAME value` pairs, names
/// case-insensitive, each at most once. Calls `take(option, value_index)`
/// for each, `option` being the name's position in `names`.
pub fn parse_options<A: ArgList + ?Sized>(
    args: &A,
    first: usize,
    names: &[&str],
    take: impl FnMut(usize, usize) -> Result<(), CmdError>,
) -> CmdResult {
    parse_counted_options(args, first, names, |_| 1, take)
}

/// [`parse_options`] where an option may take several values:
/// `values(option)` of them (the batch commands' `PAYLOADS`, one per key).
/// `take(option, first_value_index)` gets the index of the first.
pub fn parse_counted_options<A: ArgList + ?Sized>(
    args: &A,
    first: usize,
    names: &[&str],
    values: impl Fn(usize) -> usize,
    mut take: impl FnMut(usize, usize) -> Result<(), CmdError>,
) -> CmdResult {
    let mut seen = 0u32;
    let mut index = first;
    while index < args.len() {
        let name = args.bytes(index);
        let Some(known) = names.iter().position(|known| known.as_bytes().eq_ignore_ascii_case(name)) else {
            let name = String::from_utf8_lossy(name);
            return Err(CmdError::new(format!("ERR syntax error, unknown option '{name}'")));
        };
        if seen & 1 << known != 0 {
            return Err(CmdError::new(format!("ERR syntax error, option {} given twice", names[known])));
        }
        seen |= 1 << known;
        let count = values(known);
        if args.len() - (index + 1) < count {
            return Err(match count {
                1 => CmdError::new(format!("ERR syntax error, option {} needs a value", names[known])),
                _ => CmdError::new(format!(
                    "ERR syntax error, option {} needs {count} values (one per key)",
                    names[known]
                )),
            });
        }
        take(known, index + 1)?;
        index += 1 + count;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_parse_as_redis_parses_them() {
        for (text, want) in [
            ("0", Some(0)),
            ("7", Some(7)),
            ("-12", Some(-12)),
            ("9223372036854775807", Some(i64::MAX)),
            ("-9223372036854775808", Some(i64::MIN)),
            ("9223372036854775808", None),
            ("", None),
            ("-", None),
            ("-0", None),
            ("007", None),
            ("+7", None),
            (" 7", None),
            ("7 ", None),
            ("1.5", None),
            ("1e3", None),
        ] {
            assert_eq!(parse_i64(text.as_bytes()), want, "{text:?}");
        }
    }

    #[test]
    fn options_are_case_insensitive_once_each_and_need_values() {
        let parse = |words: &[&str]| {
            let args: Vec<&[u8]> = words.iter().map(|w| w.as_bytes()).collect();
            let mut seen = Vec::new();
            parse_options(&args[..], 1, &["ONE", "TWO"], |option, value| {
                seen.push((option, value));
                Ok(())
            })
            .map(|()| seen)
            .map_err(|e| e.message())
        };
        assert_eq!(parse(&["cmd", "two", "x", "One", "y"]), Ok(vec![(1, 2), (0, 4)]));
        assert!(parse(&["cmd", "ONE", "x", "one", "y"]).unwrap_err().contains("given twice"));
        assert!(parse(&["cmd", "ONE"]).unwrap_err().contains("needs a value"));
        assert!(parse(&["cmd", "THREE", "x"]).unwrap_err().contains("unknown option"));
    }

    #[test]
    fn time_arguments_must_fit_an_absolute_expiry() {
        let now = 1_800_000_000_000;
        let seconds = |text: &str| {
            let args: [&[u8]; 2] = [b"IDEM.ONCE", text.as_bytes()];
            seconds_arg(&args[..], 1, now).map_err(|e| e.message())
        };
        assert_eq!(seconds("1"), Ok(1000));
        assert!(seconds("0").unwrap_err().contains("invalid expire time in 'IDEM.ONCE'"));
        assert!(seconds("-1").is_err());
        assert!(seconds("9223372036854775").is_err());
        assert!(seconds("abc").unwrap_err().contains("not an integer"));
    }
}
