//! The encoding and its decoder, which accepts only what the commands
//! build.

use super::*;

#[test]
fn same_seed_and_operations_give_the_same_bits() {
    let build = || {
        let mut filter = new_filter(params(0.01, 50, 3, 10), SEED, T0).unwrap();
        add_all(&mut filter, "d", 0..300, T0);
        add_all(&mut filter, "e", 0..30, T0 + 12_000);
        let mut bytes = Vec::new();
        codec::encode(&filter, &mut bytes);
        bytes
    };
    assert_eq!(build(), build());
}

#[test]
fn encoding_round_trips_and_refuses_corruption() {
    let mut filter = new_filter(params(0.01, 20, 3, 10), SEED, T0).unwrap();
    add_all(&mut filter, "c", 0..100, T0);
    add_all(&mut filter, "c", 100..120, T0 + 10_000);
    let mut bytes = Vec::new();
    codec::encode(&filter, &mut bytes);
    let decoded = codec::decode(&bytes).unwrap();
    let mut again = Vec::new();
    codec::encode(&decoded, &mut again);
    assert_eq!(again, bytes);
    assert!((0..120).all(|n| decoded.contains(decoded.hash(&item("c", n)), T0 + 10_000)));
    for len in 0..bytes.len().min(400) {
        assert!(codec::decode(&bytes[..len]).is_err(), "truncated at {len}");
    }
    let mut trailing = bytes.clone();
    trailing.push(1);
    assert!(codec::decode(&trailing).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn decoding_mutated_payloads_never_panics(index in 0usize..2000, byte in any::<u8>(), which in 0usize..3) {
        // A stacked filter, one with two shards, one with a full window.
        let bytes = match which {
            0 => {
                let mut filter = new_filter(params(0.01, 20, 3, 10), SEED, T0).unwrap();
                add_all(&mut filter, "m", 0..30, T0);
                encoded(&filter)
            }
            1 => {
                let mut filter = new_filter(params(0.1, 4, 3, 10), SEED, T0).unwrap();
                add_all(&mut filter, "x", 0..20, T0);
                add_all(&mut filter, "y", 0..10, T0 + 10_000);
                encoded(&filter)
            }
            _ => encoded(&three_shards()),
        };
        let mut bytes = bytes;
        let index = index % bytes.len();
        bytes[index] = byte;
        // Whatever decodes is canonical and usable, and stays decodable
        // after the writes the commands make (as the fuzz target checks).
        if let Ok(mut decoded) = codec::decode(&bytes) {
            let mut canonical = bytes.clone();
            canonical[codec::SEED_RESERVED].fill(0);
            prop_assert_eq!(encoded(&decoded), canonical);
            prop_assert!(decoded.sub_filter_count() <= MAX_TOTAL_SUB_FILTERS);
            let newest = decoded.shards.last().map_or(0, |shard| shard.start * 1000);
            for (step, n) in [(0, 1), (decoded.params.period * 1000, 2), (decoded.params.period * 3000 + 1, 40)] {
                let now = newest + step;
                let _ = decoded.contains(decoded.hash(b"probe"), now);
                if decoded.plan(n, now, MAX_BYTES).is_ok() {
                    for i in 0..n {
                        decoded.add(decoded.hash(&item("w", i)), now).unwrap();
                    }
                }
                prop_assert!(codec::decode(&encoded(&decoded)).is_ok());
            }
        }
    }

    #[test]
    fn decoding_random_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = codec::decode(&bytes);
    }
}

#[test]
fn the_decoder_refuses_every_shape_the_commands_cannot_build() {
    let good = three_shards();
    assert_eq!(refusal(&good), "accepted");
    type Mutation = (&'static str, fn(&mut ShardedBloom));
    let cases: [Mutation; 14] = [
        ("more shards than the window holds", |f| {
            let mut extra = f.shards[2].clone();
            extra.start += 10;
            f.shards.push(extra);
        }),
        ("shards further apart than the window", |f| f.shards[2].start += 10),
        ("shard starts out of order", |f| f.shards[1].start += 1),
        ("shard starts out of order", |f| {
            let last = Millis::MAX / 1000 / 10 * 10 + 10;
            for (shard, start) in f.shards.iter_mut().zip([last - 20, last - 10, last]) {
                shard.start = start;
            }
        }),
        ("shard starts out of order", |f| f.shards.swap(1, 2)),
        ("sub-filter capacities do not follow the expansion", |f| f.shards[0].filters[1].capacity += 1),
        ("a sub-filter under the top one is not full", |f| {
            f.shards[0].filters[0].items -= 1;
        }),
        ("hash count disagrees with the sub-filter's size", |f| {
            f.shards[0].filters[0].hashes += 1;
        }),
        ("error disagrees with the sub-filter's size", |f| f.shards[1].filters[0].error *= 1.001),
        ("bad sub-filter counts", |f| f.shards[1].filters[0].error = 0.0),
        ("sub-filter larger than its sizing", |f| {
            let sub = &mut f.shards[2].filters[0];
            *sub = SubFilter::new(sub.capacity, sub.bytes() * 4);
        }),
        ("sub-filter errors exceed the shard's budget", |f| {
            let sub = &mut f.shards[2].filters[0];
            *sub = SubFilter::new(sub.capacity, 8);
        }),
        ("more bits set than the items set", |f| {
            let bits = &mut f.shards[1].filters[0].bits;
            *bits = Bits::from_bytes(&vec![0xff; bits.bytes() as usize]);
        }),
        ("filter parameters out of range", |f| f.params.window = MAX_WINDOW + 1),
    ];
    for (expected, mutate) in cases {
        let mut bad = good.clone();
        mutate(&mut bad);
        assert_eq!(refusal(&bad), expected);
    }
    // The rate's lower bound.
    let mut low = good.clone();
    low.params.error_rate = MIN_ERROR_RATE / 2.0;
    assert_eq!(refusal(&low), "filter parameters out of range");
    // An unknown format.
    let mut unknown = encoded(&good);
    unknown[0] = 5;
    assert_eq!(codec::decode(&unknown).err().map(|e| e.0), Some("unknown filter format version"));
    // A shard's item count, which a filter in memory sums from its
    // sub-filters, disagreeing with them: the first shard's, after the
    // parameters, the shard count and its start.
    let mut miscounted = encoded(&good);
    let at = codec::PARAMS_LEN + 4 + 8;
    let items = u64::from_le_bytes(miscounted[at..at + 8].try_into().unwrap());
    assert_eq!(items, good.shards[0].items());
    miscounted[at..at + 8].copy_from_slice(&(items + 1).to_le_bytes());
    assert_eq!(codec::decode(&miscounted).err().map(|e| e.0), Some("shard item count disagrees with its sub-filters"));
}

#[test]
fn the_seed_s_reserved_bytes_are_written_as_zeros_and_ignored() {
    // Builds before 0.1.0 wrote 32 random bytes; only the first 8 seed
    // the hash.
    let good = three_shards();
    let mut bytes = encoded(&good);
    assert!(bytes[codec::SEED_RESERVED].iter().all(|&b| b == 0));
    bytes[codec::SEED_RESERVED].fill(0xa5);
    let read = codec::decode(&bytes).unwrap();
    assert_eq!(read.seed, good.seed);
    assert_eq!(encoded(&read), encoded(&good));
}

#[test]
fn payloads_of_the_unreleased_formats_1_to_3_are_refused_saying_so() {
    // A format 4 payload relabelled 1, 2 and 3: refused at the version
    // byte, whatever follows.
    let good = encoded(&three_shards());
    for older in 1..=3u8 {
        let mut relabelled = good.clone();
        relabelled[0] = older;
        let refused = codec::decode(&relabelled).err().map(|e| e.0);
        assert_eq!(refused, Some("filter format 1 to 3, written only by development builds before 0.1.0"));
    }
}

#[test]
fn the_decoder_bounds_the_sub_filters() {
    // 171 shards of 3, one over the limit.
    let ok = stacked(0.5, MAX_WINDOW, 170, 3, 1);
    assert_eq!(ok.sub_filter_count(), 510);
    assert_eq!(refusal(&ok), "accepted");
    let over = stacked(0.5, MAX_WINDOW, 171, 3, 1);
    assert_eq!(refusal(&over), "too many sub-filters");
}

#[test]
fn the_issues_payload_of_8784_shards_of_32_is_refused_at_once() {
    // WINDOW 8784 of 1 s shards, each a stack of 32 one-item sub-filters
    // of 8 bytes: what a development build loaded, and made MEXISTS of
    // 1,000 items take 6-7 s. Its window is past MAX_WINDOW.
    let params = Params { error_rate: 0.999, capacity: 1, window: 8_784, period: 1, expansion: 1 };
    let sub = || {
        let mut sub = SubFilter::new(1, 8);
        sub.items = 1;
        sub
    };
    let shards = (0..8_784).map(|start| Shard { start, filters: (0..32).map(|_| sub()).collect() });
    let payload = encoded(&ShardedBloom { params, seed: SEED, shards: shards.collect() });
    let start = std::time::Instant::now();
    assert_eq!(codec::decode(&payload).err().map(|e| e.0), Some("filter parameters out of range"));
    assert!(start.elapsed() < std::time::Duration::from_millis(100), "{:?}", start.elapsed());
    // The same shape within MAX_WINDOW, where 8-byte sub-filters of one
    // item fit the budget: refused by the count, after 16 shards.
    let attack = stacked(params.error_rate, MAX_WINDOW, MAX_WINDOW as i64 + 1, 32, 1);
    assert!(attack.shards.iter().flat_map(|s| &s.filters).all(|f| f.bytes() == 8));
    let payload = encoded(&attack);
    let start = std::time::Instant::now();
    assert_eq!(codec::decode(&payload).err().map(|e| e.0), Some("too many sub-filters"));
    assert!(start.elapsed() < std::time::Duration::from_millis(100), "{:?}", start.elapsed());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Whatever the commands build decodes, after every write: the
    /// decoder refuses no shape they make.
    #[test]
    fn every_filter_the_commands_grow_decodes(
        capacity in 1u64..60,
        expansion in 1u32..4,
        window in 1u32..5,
        period in 1i64..4,
        rate in prop_oneof![Just(0.5), Just(0.2), Just(0.05), Just(0.01), Just(1e-3), Just(1e-6)],
        steps in proptest::collection::vec((-1_500i64..5_000, 0u64..80), 1..12),
    ) {
        let p = Params { error_rate: rate, capacity, window, period, expansion };
        let Ok(mut filter) = new_filter(p, SEED, T0) else { return Ok(()) };
        let mut now = T0;
        let mut fresh = 0u64;
        for (step, count) in steps {
            now += step;
            if filter.plan(count, now, MAX_BYTES).is_ok() {
                filter.drop_expired(now);
                for _ in 0..count {
                    filter.add(filter.hash(&item("g", fresh)), now).unwrap();
                    fresh += 1;
                }
            }
            let bytes = encoded(&filter);
            let decoded = codec::decode(&bytes);
            prop_assert!(decoded.is_ok(), "{:?}", decoded.err());
            prop_assert_eq!(encoded(&decoded.unwrap()), bytes);
        }
    }
}

#[test]
fn fuzzed_payloads_are_refused_without_overflow() {
    // Found by fuzzing: a sub-filter claiming 2^64-ish items overflowed
    // the bound on its set bits (hashes x items).
    let mut filter = three_shards();
    filter.shards[0].filters[2].items = u64::MAX - 1;
    assert!(codec::decode(&encoded(&filter)).is_err());
}

#[test]
#[ignore = "writes a seed corpus for the fuzz target to $BLOOM_CORPUS"]
fn write_fuzz_corpus() {
    let dir = std::env::var("BLOOM_CORPUS").unwrap();
    let mut filters = vec![three_shards()];
    filters.push(stacked(0.5, 3, 4, 3, 2));
    let mut grown = new_filter(Params { expansion: 1, ..params(0.01, 3, 2, 1) }, SEED, T0).unwrap();
    add_all(&mut grown, "z", 0..40, T0);
    filters.push(grown);
    for (n, filter) in filters.iter().enumerate() {
        std::fs::write(format!("{dir}/seed{n}"), encoded(filter)).unwrap();
    }
}

/// A format 4 payload the code before issue 18 (392d591) encoded:
/// EXPANSION 1, shard 0 a stack of 6 sub-filters of 40 (grown by the
/// expansion alone), shard 1 sized for 251 and closed with 30 (folded
/// twice, to an odd 9 words), shard 2 open with 2.
const FORMAT_4_BEFORE_ISSUE_18: &[&str] = &[
    "049a9999999999a93f2800000000000000030000000a00000000000000010000000b30557a9fc4e90e33587da2c7ec11",
    "365b80a5caef14395e83a8cdf2173c6186030000008061496b00000000f0000000000000000600000028000000000000",
    "002800000000000000bdce58aa7bf4723f090000004000000000000000df9e8a3401a3db95e5edd33652bdd49ccf6e16",
    "571399500bc9e1297e1f2d98f2409e452a4fbf3e74e7a60283dd576af1459b4a14fea1225f13565894d59f6d18280000",
    "00000000002800000000000000bdce58aa7bf4723f090000004000000000000000e59e2e3cb311ba582ac6038f4b7b35",
    "7ce8ef9bf4691f3a8be96e303a02c7a25d540b517e63dbe766e9c421a94e2f272e0e1b4752da1c11c246be4cfa751ebd",
    "e1280000000000000028000000000000000de4eef775df513f0b0000005000000000000000af8898fdef6e7404429a0b",
    "bdf4eea4a2cad1983da80b0c1cdb6e286188e5fbf12854ba2fae54f708238e73594eb333a125f1de028e22e7d1af7630",
    "9ddb882f42678207d6b478799b57fdab07cd3577a7280000000000000028000000000000000de4eef775df513f0b0000",
    "005000000000000000f2dafc40617b8797b11091471d3be2cb0d910d2bb803cff9bd30d35888f5e3457210b5abff3567",
    "5019f65f91d057d3c9d6d7839f09e6612dc4b7cb8167d75ae3925829209abecd56f4145fad505ab5b228000000000000",
    "0028000000000000000de4eef775df513f0b000000500000000000000025c512376896a06a8a8b635dc670e627348a84",
    "f7e17c04a1aed83ed240cf5c4def1249b992907f6a3c1db5f88c643e3ee48783804f1971514dd46a221fe41e78ba1048",
    "ee4bcac57a55f4cc75ef39f85c280000000000000028000000000000000de4eef775df513f0b00000050000000000000",
    "00a8e7f7d4a3a7c4809127ca2327c3b483d7f133dd47abd8efe7cc1e6654e21d1fac37d5ad542df3f0f2a6dd60db82e4",
    "bdee198030840014bc3ab2b7255cf92921da96b8e57aeddbcf0241adb44da800fd8a61496b000000001e000000000000",
    "0001000000fb000000000000001e00000000000000d2d7c47e3c308f3f06000000480000000200000008420002185610",
    "a020403284110201b1900c45402031080640606832044390804e250601c2550050948818680200b484895800c3418aa0",
    "100504200c106107049d40c092a8b964109461496b000000000200000000000000010000001000000000000000020000",
    "00000000005c800ab5303c603f0b00000020000000000000000428002100100000000000080c00860000010030001000",
    "10000c004000001000",
];

#[test]
fn format_4_payloads_written_before_odd_folds_and_doubling_stacks_still_load() {
    let payload = unhex(FORMAT_4_BEFORE_ISSUE_18);
    assert_eq!(xxhash_rust::xxh3::xxh3_64(&payload), 0xcae60a0cb06bc16e);
    let old = codec::decode(&payload).unwrap();
    let shape: Vec<Vec<(u64, u32, u32, u64)>> = old
        .shards
        .iter()
        .map(|s| s.filters.iter().map(|f| (f.capacity, u32::from(f.folds), f.odd_fold, f.bytes())).collect())
        .collect();
    assert_eq!(
        shape,
        [
            vec![(40, 0, 1, 64), (40, 0, 1, 64), (40, 0, 1, 80), (40, 0, 1, 80), (40, 0, 1, 80), (40, 0, 1, 80)],
            vec![(251, 2, 1, 72)],
            vec![(16, 0, 1, 32)],
        ]
    );
    // It saves as it was, but for the seed's reserved bytes: that build
    // wrote random ones, this one zeros.
    let mut saved = encoded(&old);
    assert!(saved[codec::SEED_RESERVED].iter().all(|&b| b == 0));
    saved[codec::SEED_RESERVED].copy_from_slice(&payload[codec::SEED_RESERVED]);
    assert_eq!(saved, payload, "it saves as it was");
    // Today's code makes the same adds into a stack that doubles past
    // EXPANSION_HEIGHT, and folds the closed shard by an odd factor too:
    // its payload, as a fingerprint of the new shapes.
    let p = Params { expansion: 1, ..params(0.05, 40, 3, 10) };
    let mut new = new_filter(p, SEED, T0).unwrap();
    add_all(&mut new, "a", 0..240, T0);
    add_all(&mut new, "b", 0..30, T0 + 10_000);
    add_all(&mut new, "c", 0..2, T0 + 20_000);
    let capacities: Vec<u64> = new.shards[0].filters.iter().map(|f| f.capacity).collect();
    assert_eq!(capacities, [40, 40, 40, 40, 80]);
    let closed = &new.shards[1].filters[0];
    assert!(closed.odd_fold > 1 && closed.bytes() < 72, "{} bytes, odd fold {}", closed.bytes(), closed.odd_fold);
    let payload = encoded(&new);
    assert_eq!(payload[0], codec::FORMAT);
    assert_eq!(encoded(&codec::decode(&payload).unwrap()), payload);
    assert_eq!(xxhash_rust::xxh3::xxh3_64(&payload), 0xaead_cab8_1205_3ce7);
    // The old filter grows on by today's rule: its stack was full at 6
    // of 40 in a closed shard; its open shard stacks past EXPANSION_HEIGHT
    // by doubling, and the payload still decodes.
    let mut grown = old.clone();
    add_all(&mut grown, "d", 0..500, T0 + 20_000);
    let top: Vec<u64> = grown.shards[2].filters.iter().map(|f| f.capacity).collect();
    assert_eq!(top[..EXPANSION_HEIGHT], [16; EXPANSION_HEIGHT]);
    assert!(top.windows(2).skip(EXPANSION_HEIGHT - 1).all(|w| w[1] == 2 * w[0]), "{top:?}");
    assert_eq!(refusal(&grown), "accepted");
}

#[test]
fn the_decoder_refuses_odd_folds_the_commands_cannot_make() {
    let good = closed_after(10_000_000, 10);
    assert_eq!(refusal(&good), "accepted");
    let odd = good.shards[0].filters[0].odd_fold;
    let mut newest = good.clone();
    let top = &mut newest.shards[1].filters[0];
    if top.bits.bytes().is_multiple_of(24) {
        top.bits.fold_by(3);
    }
    top.odd_fold = 3;
    assert_ne!(refusal(&newest), "accepted");
    let mut too_far = good.clone();
    let sub = &mut too_far.shards[0].filters[0];
    let words = sub.bits.bytes() / 8;
    let factor = (2..=words).find(|f| words.is_multiple_of(*f)).unwrap();
    sub.bits.fold_by(factor);
    sub.odd_fold *= factor as u32;
    assert_ne!(refusal(&too_far), "accepted");
    let mut miscounted = good.clone();
    miscounted.shards[0].filters[0].odd_fold = odd + 2;
    assert_ne!(refusal(&miscounted), "accepted");
    let mut absurd = good.clone();
    absurd.shards[0].filters[0].odd_fold = (1 << 27) - 1;
    assert_eq!(refusal(&absurd), "bad fold count");
}
