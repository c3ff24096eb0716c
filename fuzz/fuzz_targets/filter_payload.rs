//! A filter's RDB/RESTORE payload (and IDEM.BF.LOAD): any bytes decode to
//! a filter or an error, never a panic or an allocation beyond the
//! input's size. What decodes is canonical (it encodes back to the same
//! bytes, the seed's reserved ones zeroed, which decode again), cheap to query (no more sub-filters and
//! bytes than the limits, so no more probes a query than they allow), and
//! stays decodable after the writes the commands make to it.
#![no_main]

use idem_core::bloom::{
    FixedLimits, MAX_BYTES, MAX_HASHES, MAX_SUB_FILTERS, MAX_TOTAL_SUB_FILTERS, ShardedBloom, WhenGone, codec,
};
use idem_core::decode::Reader;
use libfuzzer_sys::fuzz_target;

/// The size limit for the writes: a configured one, small enough that a
/// valid filter reserved huge (the decoder accepts it: it is only
/// parameters) does not make each run allocate and re-encode hundreds of
/// MiB.
const WRITE_LIMITS: FixedLimits = FixedLimits { max_bytes: 1 << 20, max_value: u64::MAX, memory_left: u64::MAX };

fn encode(filter: &ShardedBloom) -> Vec<u8> {
    let mut bytes = Vec::new();
    codec::encode(filter, &mut bytes);
    bytes
}

fuzz_target!(|data: &[u8]| {
    if let Ok(mut filter) = codec::decode(data) {
        // Canonical, and a round trip.
        let mut canonical = data.to_vec();
        canonical[codec::SEED_RESERVED].fill(0);
        let again = encode(&filter);
        assert_eq!(again, canonical);
        assert_eq!(encode(&codec::decode(&again).expect("decodes again")), canonical);
        // Cheap to query: a query makes at most MAX_HASHES probes in each
        // sub-filter, and there are no more sub-filters than the limit.
        let filters = filter.sub_filter_count();
        assert!(filter.shards.iter().all(|s| (1..=MAX_SUB_FILTERS).contains(&s.filters.len())));
        assert!(filter.shards.iter().flat_map(|s| &s.filters).all(|f| (1..=MAX_HASHES).contains(&f.hashes())));
        assert!(filters <= MAX_TOTAL_SUB_FILTERS && filter.bytes() <= MAX_BYTES);
        assert!(filter.shards.len() <= filter.params.window as usize + 1);
        // Writes as the commands make them keep it decodable.
        let newest = filter.shards.last().map_or(0, |shard| shard.start * 1000);
        for (step, n) in [(0, 1u64), (filter.params.period * 1000, 2), (filter.params.period * 3000 + 1, 40)] {
            let now = newest.saturating_add(step);
            let _ = filter.may_contain(&n.to_le_bytes(), now);
            let items: Vec<[u8; 8]> = (0..n).map(|i| (i + 100 * n).to_le_bytes()).collect();
            let items = items.iter().map(|item| &item[..]);
            let _ = ShardedBloom::write(Some(&mut filter), WhenGone::LEAVE, items, now, &WRITE_LIMITS);
            codec::decode(&encode(&filter)).expect("what the commands build decodes");
        }
    }
    let mut input = Reader(data);
    let _ = codec::decode_params(&mut input);
    let _ = codec::decode_effect_header(data);
});
