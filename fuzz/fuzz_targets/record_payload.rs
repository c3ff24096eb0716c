//! A record's RDB/RESTORE payload and its replicated effects (IDEM.APPLY, IDEM.MAPPLY):
//! any bytes decode to a record or an error, never a panic; what decodes
//! in the current format encodes back to the same bytes, and an older
//! format's payload (format 3, before the owner; format 2, before the tries
//! base) encodes in the current one to the same record. What decodes is
//! what replies can carry: an attempt within i64, an owner of 1 to 64
//! bytes on a record a claim holds.
#![no_main]

use idem_core::record::{MAX_ATTEMPT, MAX_OWNER, Phase, Token, batch, codec};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(record) = codec::decode(data) {
        assert!(record.attempt <= MAX_ATTEMPT && record.tries() <= record.attempt);
        if let Some(owner) = &record.owner {
            assert!((1..=MAX_OWNER).contains(&owner.len()));
            assert!(record.phase != Phase::Done && record.token != Token::default());
        }
        let mut again = Vec::new();
        codec::encode(&record, &mut again);
        if data.first() == Some(&codec::FORMAT_VERSION) {
            assert_eq!(again, data);
        } else {
            assert_eq!(again.first(), Some(&codec::FORMAT_VERSION));
            assert_eq!(codec::decode(&again).as_ref(), Ok(&record));
        }
        if let Some(packed) = codec::pack(&record) {
            assert_eq!(codec::unpack(packed), record);
        }
    }
    let _ = codec::decode_effect(data);
    // A batch's effect (IDEM.MAPPLY), for any key count.
    let _ = batch::decode_effect(data, data.first().map_or(0, |&count| count as usize));
});
