//! The sharded filter without a server: sizing, error rates, rotation,
//! adaptive capacity, determinism and the encoding.

use proptest::prelude::*;

use super::codec;
use super::*;

const T0: Millis = 1_800_000_000_000 - 1_800_000_000_000 % (DAY * 1000);
/// Any fixed seed: the tests must be repeatable.
const SEED: [u8; 32] = {
    let mut seed = [0u8; 32];
    let mut i = 0;
    while i < 32 {
        seed[i] = (i as u8).wrapping_mul(37).wrapping_add(11);
        i += 1;
    }
    seed
};

fn params(error_rate: f64, capacity: u64, window: u32, period: Seconds) -> Params {
    Params { error_rate, capacity, window, period, expansion: 2 }
}

fn item(prefix: &str, n: u64) -> Vec<u8> {
    format!("{prefix}:{n:012}").into_bytes()
}

fn add_all(filter: &mut ShardedBloom, prefix: &str, range: std::ops::Range<u64>, now: Millis) -> u64 {
    let mut new = 0;
    for n in range {
        let hash = filter.hash(&item(prefix, n));
        new += filter.add(hash, now).unwrap() as u64;
    }
    new
}

fn false_positives(filter: &ShardedBloom, queries: u64, now: Millis) -> f64 {
    let hits = (0..queries).filter(|&n| filter.contains(filter.hash(&item("fresh", n)), now)).count();
    hits as f64 / queries as f64
}

/// Allowed sampling excess over the target rate: four standard deviations.
fn slack(rate: f64, queries: u64) -> f64 {
    4.0 * (rate * (1.0 - rate) / queries as f64).sqrt()
}

#[test]
fn allocation_classes_are_jemallocs() {
    let classes = [8, 16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 4096, 5120, 131072, 163840];
    for class in classes {
        assert_eq!(allocation_class(class), class, "{class} is a class");
    }
    assert_eq!(allocation_class(129), 160);
    assert_eq!(allocation_class(131073), 163840);
    assert_eq!(allocation_class_below(163839), 131072);
    assert_eq!(allocation_class_below(163840), 163840);
}

#[test]
fn parameters_out_of_range_are_refused() {
    let good = params(0.01, 100, 7, DAY);
    assert_eq!(good.check(), Ok(()));
    for bad in [
        Params { error_rate: 0.0, ..good },
        Params { error_rate: 1.0, ..good },
        Params { error_rate: f64::NAN, ..good },
        Params { capacity: 0, ..good },
        Params { window: 0, ..good },
        Params { period: 0, ..good },
        Params { expansion: 0, ..good },
    ] {
        assert!(matches!(bad.check(), Err(BloomError::Invalid(_))), "{bad:?}");
    }
    let huge = params(0.01, u64::MAX / 2, 1, DAY);
    assert_eq!(ShardedBloom::new(huge, SEED, T0).err(), Some(BloomError::TooLarge));
    let tiny_rate = params(1e-300, 1 << 40, 1, DAY);
    assert_eq!(ShardedBloom::new(tiny_rate, SEED, T0).err(), Some(BloomError::TooLarge));
}

#[test]
fn every_sub_filter_fills_its_allocation_class_and_stays_in_budget() {
    for capacity in [1, 10, 1_000, 12_345, 100_000, 1_000_000] {
        for window in [1, 7] {
            let filter = ShardedBloom::new(params(0.01, capacity, window, DAY), SEED, T0).unwrap();
            let sub = &filter.shards[0].filters[0];
            assert_eq!(allocation_class(sub.bytes()), sub.bytes(), "capacity {capacity}");
            assert!(sub.error <= 0.9 * 0.01 / window as f64, "capacity {capacity}: {}", sub.error);
        }
    }
}

#[test]
fn one_shard_at_capacity_costs_at_most_11_bits_per_item_for_round_capacities() {
    for capacity in [100_000, 1_000_000] {
        let filter = ShardedBloom::new(params(0.01, capacity, 1, DAY), SEED, T0).unwrap();
        let bits = filter.bytes() as f64 * 8.0 / capacity as f64;
        assert!(bits <= 11.0, "capacity {capacity}: {bits:.2} bits per item");
    }
}

#[test]
fn false_positive_rate_holds_at_capacity_and_at_ten_times_capacity() {
    let mut filter = ShardedBloom::new(params(0.01, 10_000, 1, DAY), SEED, T0).unwrap();
    add_all(&mut filter, "a", 0..10_000, T0);
    let at_capacity = false_positives(&filter, 100_000, T0);
    assert!(at_capacity <= 0.01 + slack(0.01, 100_000), "{at_capacity}");
    add_all(&mut filter, "a", 10_000..100_000, T0);
    assert!(filter.shards[0].filters.len() > 1, "it grew");
    let grown = false_positives(&filter, 100_000, T0);
    assert!(grown <= 0.01 + slack(0.01, 100_000), "{grown}");
}

#[test]
fn no_false_negatives_across_growth() {
    let mut filter = ShardedBloom::new(params(0.001, 1_000, 1, DAY), SEED, T0).unwrap();
    let new = add_all(&mut filter, "x", 0..50_000, T0);
    assert!(new > 49_000, "few false positives among new items: {new}");
    assert!((0..50_000).all(|n| filter.contains(filter.hash(&item("x", n)), T0)));
    assert_eq!(filter.items(), new);
}

#[test]
fn whole_window_rate_holds_over_seven_full_daily_shards() {
    let mut filter = ShardedBloom::new(params(0.01, 5_000, 7, DAY), SEED, T0).unwrap();
    for day in 0..7 {
        add_all(&mut filter, &format!("day{day}"), 0..5_000, T0 + day * DAY * 1000);
    }
    let now = T0 + 6 * DAY * 1000;
    assert_eq!(filter.shards.len(), 7);
    let rate = false_positives(&filter, 100_000, now);
    assert!(rate <= 0.01 + slack(0.01, 100_000), "{rate}");
}

#[test]
fn shards_rotate_and_items_are_forgotten_when_their_shard_leaves_the_window() {
    let period = 10;
    let mut filter = ShardedBloom::new(params(0.01, 100, 3, period), SEED, T0).unwrap();
    let old = filter.hash(b"old");
    assert!(filter.add(old, T0).unwrap());
    assert_eq!(filter.expire_at(), Some(T0 + 30_000));
    let later = T0 + 20_000;
    let recent = filter.hash(b"recent");
    assert!(filter.add(recent, later).unwrap());
    assert_eq!(filter.shards.len(), 2);
    assert_eq!(filter.expire_at(), Some(later + 30_000));
    // Live through the very millisecond of its end, as Redis keeps a key
    // through its expiry's.
    assert!(filter.contains(old, T0 + 30_000), "still in the window");
    assert!(!filter.contains(old, T0 + 30_001), "forgotten exactly when its shard leaves");
    assert!(!filter.drop_expired(T0 + 30_000));
    assert!(filter.drop_expired(T0 + 30_001));
    assert_eq!(filter.shards.len(), 1);
    assert!(filter.contains(recent, T0 + 30_001));
}

#[test]
fn a_repeat_add_keeps_an_item_for_a_full_window_from_its_latest_add() {
    let mut filter = ShardedBloom::new(params(0.01, 100, 2, 10), SEED, T0).unwrap();
    let hash = filter.hash(b"item");
    assert!(filter.add(hash, T0).unwrap());
    assert!(!filter.add(hash, T0 + 15_000).unwrap(), "seen in the previous shard");
    assert_eq!(filter.shards.len(), 2, "and recorded again in the current one");
    assert_eq!(filter.shards[1].items, 1);
    // Its new shard (10 s..20 s) keeps it until 10 s + 2 periods.
    assert!(filter.contains(hash, T0 + 30_000));
    assert!(!filter.contains(hash, T0 + 30_001));
    assert!(!filter.add(hash, T0 + 15_001).unwrap());
    assert_eq!(filter.shards[1].items, 1, "not inserted twice into one shard");
}

#[test]
fn new_shards_adapt_to_the_previous_shards_volume() {
    // Created far too small: the first shard stacks, the later ones don't.
    let mut filter = ShardedBloom::new(params(0.01, 10, 4, 10), SEED, T0).unwrap();
    for shard in 0..4 {
        add_all(&mut filter, &format!("s{shard}"), 0..2_000 + shard as u64 * 50, T0 + shard * 10_000);
    }
    let heights: Vec<usize> = filter.shards.iter().map(|s| s.filters.len()).collect();
    assert!(heights[0] > 5, "{heights:?}");
    assert_eq!(&heights[1..], &[1, 1, 1], "steady volume needs one sub-filter per shard");
    let first_count = filter.shards[0].items as f64;
    assert_eq!(filter.shards[1].filters[0].capacity, (first_count * HEADROOM).ceil() as u64);
}

#[test]
fn a_clock_that_steps_back_writes_into_the_newest_shard() {
    let mut filter = ShardedBloom::new(params(0.01, 100, 3, 10), SEED, T0 + 20_000).unwrap();
    let hash = filter.hash(b"late");
    assert!(filter.add(hash, T0).unwrap());
    assert_eq!(filter.shards.len(), 1);
    assert_eq!(filter.shards[0].items, 1);
}

#[test]
fn check_room_refuses_growth_past_the_limits_before_anything_changes() {
    let mut filter = ShardedBloom::new(Params { expansion: 1, ..params(0.01, 1, 1, DAY) }, SEED, T0).unwrap();
    assert_eq!(filter.check_room(MAX_SUB_FILTERS as u64, T0), Ok(()));
    assert_eq!(filter.check_room(MAX_SUB_FILTERS as u64 + 1, T0), Err(BloomError::TooLarge));
    let mut n = 0;
    while filter.items() < MAX_SUB_FILTERS as u64 {
        filter.add(filter.hash(&item("f", n)), T0).unwrap();
        n += 1;
    }
    assert_eq!(filter.check_room(1, T0), Err(BloomError::TooLarge));
    let big = ShardedBloom::new(params(0.01, 100_000_000, 1, DAY), SEED, T0).unwrap();
    assert_eq!(big.check_room(10_000_000_000, T0), Err(BloomError::TooLarge));
}

#[test]
fn same_seed_and_operations_give_the_same_bits() {
    let build = || {
        let mut filter = ShardedBloom::new(params(0.01, 50, 3, 10), SEED, T0).unwrap();
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
    let mut filter = ShardedBloom::new(params(0.01, 20, 3, 10), SEED, T0).unwrap();
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
    fn decoding_mutated_payloads_never_panics(index in 0usize..2000, byte in any::<u8>()) {
        let mut filter = ShardedBloom::new(params(0.01, 20, 3, 10), SEED, T0).unwrap();
        add_all(&mut filter, "m", 0..30, T0);
        let mut bytes = Vec::new();
        codec::encode(&filter, &mut bytes);
        let index = index % bytes.len();
        bytes[index] = byte;
        if let Ok(decoded) = codec::decode(&bytes) {
            // Whatever decodes must be usable.
            let hash = decoded.hash(b"probe");
            let _ = decoded.contains(hash, T0);
        }
    }

    #[test]
    fn decoding_random_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = codec::decode(&bytes);
    }
}

#[test]
fn tiny_reservations_keep_the_rate_for_any_seed() {
    // Small arrays are where double hashing degenerates; each seed draws
    // other degenerate items.
    for _ in 0..10 {
        let mut filter = ShardedBloom::new(params(0.01, 1, 1, DAY), rand::random(), T0).unwrap();
        add_all(&mut filter, "t", 0..5_000, T0);
        let rate = false_positives(&filter, 20_000, T0);
        assert!(rate <= 0.01 + slack(0.01, 20_000), "{rate}");
        let hashes = filter.shards[0].filters.iter().map(|f| f.bits.hashes());
        assert!(hashes.max().unwrap() <= MAX_HASHES);
    }
}

#[test]
fn the_headroom_follows_growth_between_the_two_newest_shards() {
    // Shards of 10 s: items in the one before the newest, in the newest,
    // and the next shard's capacity over the newest's count. A decline
    // counts as steady; a doubling earns the most.
    let cases = [(1_000, 1_000, 1.03), (1_000, 1_100, 1.13), (1_000, 500, 1.03), (500, 1_000, 1.25)];
    for (before, newest, headroom) in cases {
        let mut filter = ShardedBloom::new(params(0.01, 10, 3, 10), SEED, T0).unwrap();
        add_all(&mut filter, "b", 0..before, T0);
        add_all(&mut filter, "n", 0..newest, T0 + 10_000);
        add_all(&mut filter, "c", 0..1, T0 + 20_000);
        let (newest, next) = (&filter.shards[1], &filter.shards[2]);
        let ratio = next.filters[0].capacity as f64 / newest.items as f64;
        assert!((ratio - headroom).abs() < 0.005, "{before} then {newest}: {ratio}", newest = newest.items);
    }
}

#[test]
fn sizing_counts_only_live_shards_so_check_room_foresees_add() {
    // `check_room` runs before `drop_expired`, `add` after it.
    let mut filter = ShardedBloom::new(params(0.01, 10, 3, DAY), SEED, T0).unwrap();
    add_all(&mut filter, "a", 0..100, T0);
    add_all(&mut filter, "b", 0..300, T0 + DAY * 1000);
    for (day, expected) in [(3, (filter.shards[1].items as f64 * HEADROOM).ceil() as u64), (5, 10)] {
        // Just past the end of day 0's shard (day 1's on day 5).
        let now = T0 + day * DAY * 1000 + 1;
        let mut later = filter.clone();
        let (capacity, _) = later.new_shard_sizing(now);
        assert_eq!(capacity, expected, "day {day}");
        later.drop_expired(now);
        later.add(later.hash(b"x"), now).unwrap();
        assert_eq!(later.shards.last().unwrap().filters[0].capacity, capacity, "day {day}");
    }
}

/// Bits per item of a window split evenly over its shards, each exactly
/// at capacity: what allocation classes and headroom add to.
fn ideal_bits(error_rate: f64, window: u32) -> f64 {
    -(error_rate / window as f64).ln() / (std::f64::consts::LN_2 * std::f64::consts::LN_2)
}

/// `RESERVE volume WINDOW 7` at 1%, then seven daily shards of `volume`
/// distinct items each: the window's bits per item and its measured
/// false-positive rate.
fn steady_week(volume: u64, queries: u64) -> (f64, f64) {
    let mut filter = ShardedBloom::new(params(0.01, volume, 7, DAY), SEED, T0).unwrap();
    for day in 0..7 {
        add_all(&mut filter, &format!("day{day}"), 0..volume, T0 + day * DAY * 1000);
    }
    assert_eq!(filter.shards.len(), 7);
    assert_eq!(filter.sub_filter_count(), 7, "steady traffic never stacks");
    let bits = filter.bytes() as f64 * 8.0 / filter.items() as f64;
    let rate = false_positives(&filter, queries, T0 + 6 * DAY * 1000);
    let bytes: Vec<u64> = filter.shards.iter().map(Shard::bytes).collect();
    eprintln!("{volume} a day: {bits:.2} bits per item, rate {rate:.5}; shard bytes {bytes:?}");
    (bits, rate)
}

/// The benchmark's target for `RESERVE 1000000 WINDOW 7` at 1%.
#[test]
fn a_steady_week_of_a_million_a_day_costs_at_most_15_bits_per_item() {
    let (bits, rate) = steady_week(1_000_000, 200_000);
    assert!(bits <= 15.0, "{bits:.2} bits per item");
    assert!(rate <= 0.01 + slack(0.01, 200_000), "{rate}");
}

#[test]
fn steady_weeks_of_other_volumes_keep_the_rate_within_a_class_step_of_the_ideal_cost() {
    // Allocation classes are up to 25% apart: 300k and 1.5M a day round
    // their steady shards up a class (about 16.98 and 16.38 bits per item
    // over the window, against 14.98 for 1M). 3M, an exact doubling of
    // 1.5M onto the same classes, costs the same 16.38 in three times the
    // test time.
    for (volume, queries) in [(300_000, 100_000), (1_500_000, 50_000)] {
        let (bits, rate) = steady_week(volume, queries);
        assert!(rate <= 0.01 + slack(0.01, queries), "{volume}: {rate}");
        assert!(bits <= 1.25 * ideal_bits(0.01, 7), "{volume}: {bits:.2} bits per item");
    }
}

/// Each shard's item count, first sub-filter capacity and sub-filter bytes.
fn shard_sizes(filter: &ShardedBloom) -> Vec<(u64, u64, Vec<u64>)> {
    let bytes = |shard: &Shard| shard.filters.iter().map(SubFilter::bytes).collect();
    filter.shards.iter().map(|s| (s.items, s.filters[0].capacity, bytes(s))).collect()
}

#[test]
fn traffic_growing_20_percent_a_day_keeps_the_rate_and_stops_stacking() {
    let mut filter = ShardedBloom::new(params(0.01, 100_000, 7, DAY), SEED, T0).unwrap();
    let mut volume = 100_000.0f64;
    for day in 0..10 {
        let now = T0 + day * DAY * 1000;
        filter.drop_expired(now);
        add_all(&mut filter, &format!("day{day}"), 0..volume as u64, now);
        volume *= 1.2;
        let rate = false_positives(&filter, 50_000, now);
        assert!(rate <= 0.01 + slack(0.01, 50_000), "day {day}: {rate}; {:?}", shard_sizes(&filter));
        // Day 1 outgrows the fixed headroom; from day 2 on the headroom
        // follows the growth.
        let height = filter.shards.last().unwrap().filters.len();
        assert_eq!(height, if day == 1 { 2 } else { 1 }, "day {day}: {:?}", shard_sizes(&filter));
    }
}

#[test]
fn a_drop_then_a_recovery_keeps_the_rate() {
    let mut filter = ShardedBloom::new(params(0.01, 1_000_000, 7, DAY), SEED, T0).unwrap();
    for (day, volume) in [1_000_000, 1_000_000, 300_000, 1_000_000, 1_000_000].into_iter().enumerate() {
        let now = T0 + day as Millis * DAY * 1000;
        add_all(&mut filter, &format!("day{day}"), 0..volume, now);
        let rate = false_positives(&filter, 100_000, now);
        assert!(rate <= 0.01 + slack(0.01, 100_000), "day {day}: {rate}; {:?}", shard_sizes(&filter));
    }
    // The recovery day outgrew a shard sized after the drop and stacked;
    // the day after it, sized at the most headroom growth earns, did not.
    let heights: Vec<usize> = filter.shards.iter().map(|s| s.filters.len()).collect();
    assert_eq!(heights, [1, 1, 1, 3, 1], "{:?}", shard_sizes(&filter));
}
