//! A filter's RDB/RESTORE payload (and IDEM.BF.LOAD): any bytes decode to
//! a usable filter or an error, never a panic or an allocation beyond the
//! input's size.
#![no_main]

use libfuzzer_sys::fuzz_target;
use redis_idem::bloom::codec;

fuzz_target!(|data: &[u8]| {
    if let Ok(mut filter) = codec::decode(data) {
        let mut again = Vec::new();
        codec::encode(&filter, &mut again);
        assert_eq!(again, data);
        let now = filter.shards.last().map_or(0, |shard| shard.start * 1000);
        let item = filter.hash(b"probe");
        let _ = filter.contains(item, now);
        filter.drop_expired(now);
        if filter.check_room(1, now).is_ok() {
            let _ = filter.add(item, now);
        }
    }
    let mut input = redis_idem::record::codec::Reader(data);
    let _ = codec::decode_params(&mut input);
});
