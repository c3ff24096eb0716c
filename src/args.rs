//! Argument parsing shared by the commands: time arguments and
//! `NAME value` options, with Redis's own wording for their errors.

use crate::config;
use crate::record::Millis;
use crate::server::{Args, CmdError, CmdResult};

/// A time argument: whole seconds >= 1, in ms. Refused, as `SET EX` refuses
/// it, when it could not be an absolute Unix-ms expiry after adding the
/// longest configurable history or retention.
pub fn seconds_arg(args: &Args, index: usize, now: Millis) -> Result<Millis, CmdError> {
    let seconds = args.int(index)?;
    let limit = (i64::MAX - now) / 1000 - config::MAX_SECONDS;
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
pub fn parse_options(
    args: &Args,
    first: usize,
    names: &[&str],
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
        if index + 1 >= args.len() {
            return Err(CmdError::new(format!("ERR syntax error, option {} needs a value", names[known])));
        }
        take(known, index + 1)?;
        index += 2;
    }
    Ok(())
}
