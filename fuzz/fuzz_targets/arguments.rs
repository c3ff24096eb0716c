//! Argument parsing of the commands with options: any arguments parse or
//! answer an error, never a panic. Arguments are the input split at 0xff.
#![no_main]

use idem_core::{bloom, record};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut args: Vec<&[u8]> = vec![b"CMD", b"key"];
    args.extend(data.split(|&byte| byte == 0xff));
    let now = 1_800_000_000_000;
    let _ = record::parse_claim(&args[..], now);
    let _ = record::parse_done(&args[..], now, 86_400_000, 1 << 20);
    let _ = bloom::parse_reserve(&args[..], 7);
});
