//! Argument parsing of the commands with options and the batch commands: any arguments parse or
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
    // The batch commands, whose counts come first (no key at 1).
    let batch = &args[..];
    let batch = [&[b"CMD".as_slice()][..], &batch[2..]].concat();
    let _ = record::batch::parse_mclaim(&batch[..], now);
    let _ = record::batch::parse_mdone(&batch[..], now, 86_400_000);
    let _ = record::batch::parse_mrelease(&batch[..]);
    // IDEM.SCAN: keyless too, the cursor at 1.
    let _ = record::operator::parse_scan(&batch[..]);
    for command in [record::batch::Command::MClaim, record::batch::Command::MDone, record::batch::Command::MRelease] {
        let (keys, bloom) = record::batch::key_positions(&batch[..], command);
        assert!(keys.iter().chain(&bloom).all(|&at| at < batch.len()));
    }
});
