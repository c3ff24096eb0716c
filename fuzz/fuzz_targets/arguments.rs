//! Argument parsing of the commands with options and the batch commands: any arguments parse or
//! answer an error, never a panic. Arguments are the input split at 0xff.
#![no_main]

use idem_core::record::{ClaimArgs, MAX_OWNER};
use idem_core::{bloom, record};
use libfuzzer_sys::fuzz_target;

/// A parsed claim's owner is one of the arguments, 1 to 64 bytes.
fn check_owner(args: &[&[u8]], claim: &ClaimArgs) {
    if let Some(owner) = claim.owner {
        let name = owner.as_bytes();
        assert!((1..=MAX_OWNER).contains(&name.len()));
        assert!(args.windows(2).any(|pair| pair[0].eq_ignore_ascii_case(b"OWNER") && pair[1] == name));
    }
}

fuzz_target!(|data: &[u8]| {
    let mut args: Vec<&[u8]> = vec![b"CMD", b"key"];
    args.extend(data.split(|&byte| byte == 0xff));
    let now = 1_800_000_000_000;
    if let Ok((claim, _)) = record::parse_claim(&args[..], now) {
        check_owner(&args, &claim);
    }
    let _ = record::parse_done(&args[..], now, 86_400_000, 1 << 20);
    let _ = bloom::parse_reserve(&args[..], 7);
    // An OWNER first, whatever follows: its value, and the options after
    // it, reached without the fuzzer having to spell the name.
    let owned = [&[b"CMD".as_slice(), b"key", b"10", b"OWNER"][..], &args[2..]].concat();
    if let Ok((claim, bloom)) = record::parse_claim(&owned[..], now) {
        check_owner(&owned, &claim);
        assert_eq!(bloom, record::bloom_key_position(&owned[..], record::CLAIM_OPTIONS));
    }
    // The batch commands, whose counts come first (no key at 1).
    let batch = &args[..];
    let batch = [&[b"CMD".as_slice()][..], &batch[2..]].concat();
    if let Ok(parsed) = record::batch::parse_mclaim(&batch[..], now) {
        check_owner(&batch, &parsed.claim);
    }
    let _ = record::batch::parse_mdone(&batch[..], now, 86_400_000);
    let _ = record::batch::parse_mrelease(&batch[..]);
    // IDEM.SCAN: keyless too, the cursor at 1.
    let _ = record::operator::parse_scan(&batch[..]);
    for command in [record::batch::Command::MClaim, record::batch::Command::MDone, record::batch::Command::MRelease] {
        let (keys, bloom) = record::batch::key_positions(&batch[..], command);
        assert!(keys.iter().chain(&bloom).all(|&at| at < batch.len()));
    }
});
