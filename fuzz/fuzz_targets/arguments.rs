//! Argument parsing of the commands with options: any arguments parse or
//! answer an error, never a panic. Arguments are the input split at 0xff.
#![no_main]

use libfuzzer_sys::fuzz_target;
use redis_idem::{bloom_commands, commands};

fuzz_target!(|data: &[u8]| {
    let mut args: Vec<&[u8]> = vec![b"CMD", b"key"];
    args.extend(data.split(|&byte| byte == 0xff));
    let now = 1_800_000_000_000;
    let _ = commands::parse_claim(&args[..], now);
    let _ = commands::parse_done(&args[..], now, 1 << 20);
    let _ = bloom_commands::parse_reserve(&args[..], 7);
});
