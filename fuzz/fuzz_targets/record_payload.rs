//! A record's RDB/RESTORE payload and its replicated effects (IDEM.APPLY, IDEM.MAPPLY):
//! any bytes decode to a record or an error, never a panic; what decodes
//! in the current format encodes back to the same bytes, and an older
//! format's payload (format 2, before the tries base) encodes in the
//! current one to the same record.
#![no_main]

use idem_core::record::{batch, codec};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(record) = codec::decode(data) {
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
