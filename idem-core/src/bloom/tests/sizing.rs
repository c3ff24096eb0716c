//! Sizing: allocation classes, settings, sub-filter sizes and rates,
//! rotation, a new shard's capacity, steady and changing traffic, probe
//! costs.

use super::*;

#[test]
fn allocation_classes_are_jemallocs() {
    let classes = [8, 16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 4096, 5120, 131072, 163840];
    for class in classes {
        assert_eq!(allocation_class(class), class, "{class} is a class");
    }
    assert_eq!(allocation_class(129), 160);
    assert_eq!(allocation_class(131073), 163840);
    for size in 8..1 << 16 {
        let class = allocation_class(size);
        assert!(class >= size && allocation_class(class) == class, "{size}: {class}");
    }
}

#[test]
fn range_errors_name_the_bounds_the_constants_set() {
    let message = |which| CmdError::from(BloomError::Invalid(which)).message();
    assert_eq!(message(OutOfRange::ErrorRateTooLow), "ERR error_rate must be at least 1e-9");
    assert_eq!(message(OutOfRange::Window), "ERR WINDOW must be between 1 and 366");
    assert_eq!(message(OutOfRange::Expansion), "ERR EXPANSION must be between 1 and 1024");
}

#[test]
fn parameters_out_of_range_are_refused() {
    let good = params(0.01, 100, 7, DAY);
    assert_eq!(good.check(), Ok(()));
    for bad in [
        Params { error_rate: 0.0, ..good },
        Params { error_rate: 1.0, ..good },
        Params { error_rate: 1e-300, ..good },
        Params { error_rate: 9.9e-10, ..good },
        Params { error_rate: f64::NAN, ..good },
        Params { capacity: 0, ..good },
        Params { window: 0, ..good },
        Params { period: 0, ..good },
        Params { expansion: 0, ..good },
    ] {
        assert!(matches!(bad.check(), Err(BloomError::Invalid(_))), "{bad:?}");
    }
    let huge = params(0.01, u64::MAX / 2, 1, DAY);
    assert!(
        matches!(new_filter(huge, SEED, T0).err(), Some(BloomError::SizeLimit { needed, limit: MAX_BYTES }) if needed > MAX_BYTES)
    );
    for rate in [1e-300, 5e-324, 1e-15, 1e-10] {
        let tiny_rate = params(rate, 1, 1, DAY);
        assert_eq!(new_filter(tiny_rate, SEED, T0).err(), Some(BloomError::Invalid(OutOfRange::ErrorRateTooLow)));
    }
    assert!(new_filter(params(MIN_ERROR_RATE, 1, 1, DAY), SEED, T0).is_ok());
}

#[test]
fn every_sub_filter_is_stored_in_whole_classes_near_its_ideal_size_and_stays_in_budget() {
    let ln2_squared = std::f64::consts::LN_2 * std::f64::consts::LN_2;
    for capacity in [1, 10, 1_000, 12_345, 100_000, 1_000_000, 12_345_678] {
        for window in [1, 7] {
            let filter = new_filter(params(0.01, capacity, window, DAY), SEED, T0).unwrap();
            let sub = &filter.shards[0].filters[0];
            let (chunks, chunk_bytes) = bits::layout(sub.bytes());
            // Every chunk a whole allocation class: the allocator holds the
            // chunks and, for more than one, their table and its box,
            // nothing more.
            assert_eq!(allocation_class(chunk_bytes), chunk_bytes, "capacity {capacity}");
            let table = if chunks > 1 { allocation_class(16 * chunks) + 16 } else { 0 };
            assert_eq!(allocated_bytes(sub.bytes()), sub.bytes() + table);
            // The reserved share, 85% of the budget, and within 2%
            // (or a few words) of the optimum for it, however the classes
            // fall: the old class rounding was up to 25%.
            let budget = 0.01 / window as f64;
            assert!(sub.error <= 0.85 * budget * (1.0 + 1e-9), "capacity {capacity}: {}", sub.error);
            let optimum = capacity as f64 * -(0.85 * budget).ln() / ln2_squared / 8.0;
            let bounded_margin = match capacity {
                100_000.. => 1.02,
                1_000.. => 1.08,
                _ => 1.35,
            };
            assert!(sub.bytes() as f64 <= optimum * bounded_margin + 64.0, "capacity {capacity}: {}", sub.bytes());
        }
    }
}

#[test]
fn fitted_sizes_waste_a_few_percent_from_16_kib_and_less_above() {
    // A single allocation wastes up to 25% (the classes' spacing).
    let sizes = (16_384..400_000_000u64).step_by(99_991).chain((16_384..300_000).step_by(1_009));
    for bytes in sizes.chain([16_392, 65_544, 1 << 20, (1 << 20) + 8]) {
        let fitted = fitted_bytes(bytes);
        assert!(fitted >= bytes);
        let cost = allocated_bytes(fitted);
        let most = match bytes {
            1_000_000.. => 1.006,
            256_000.. => 1.015,
            64_000.. => 1.025,
            _ => 1.05,
        };
        assert!(cost as f64 <= bytes as f64 * most, "{bytes}: {fitted}, costs {cost}");
        assert!(bits::layout(fitted).0 <= bits::MAX_CHUNKS);
    }
}

#[test]
fn one_shard_at_capacity_costs_at_most_11_bits_per_item_for_round_capacities() {
    for capacity in [100_000, 1_000_000] {
        let filter = new_filter(params(0.01, capacity, 1, DAY), SEED, T0).unwrap();
        let bits = filter.bytes() as f64 * 8.0 / capacity as f64;
        assert!(bits <= 11.0, "capacity {capacity}: {bits:.2} bits per item");
    }
}

#[test]
fn false_positive_rate_holds_at_capacity_and_at_ten_times_capacity() {
    let mut filter = new_filter(params(0.01, 10_000, 1, DAY), SEED, T0).unwrap();
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
    let mut filter = new_filter(params(0.001, 1_000, 1, DAY), SEED, T0).unwrap();
    let new = add_all(&mut filter, "x", 0..50_000, T0);
    assert!(new > 49_000, "few false positives among new items: {new}");
    assert!((0..50_000).all(|n| filter.contains(filter.hash(&item("x", n)), T0)));
    assert_eq!(filter.items(), new);
}

#[test]
fn whole_window_rate_holds_over_seven_full_daily_shards() {
    let mut filter = new_filter(params(0.01, 5_000, 7, DAY), SEED, T0).unwrap();
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
    let mut filter = new_filter(params(0.01, 100, 3, period), SEED, T0).unwrap();
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
    let mut filter = new_filter(params(0.01, 100, 2, 10), SEED, T0).unwrap();
    let hash = filter.hash(b"item");
    assert!(filter.add(hash, T0).unwrap());
    assert!(!filter.add(hash, T0 + 15_000).unwrap(), "seen in the previous shard");
    assert_eq!(filter.shards.len(), 2, "and recorded again in the current one");
    assert_eq!(filter.shards[1].items(), 1);
    // Its new shard (10 s..20 s) keeps it until 10 s + 2 periods.
    assert!(filter.contains(hash, T0 + 30_000));
    assert!(!filter.contains(hash, T0 + 30_001));
    assert!(!filter.add(hash, T0 + 15_001).unwrap());
    assert_eq!(filter.shards[1].items(), 1, "not inserted twice into one shard");
}

#[test]
fn new_shards_adapt_to_the_previous_shards_volume() {
    // Created far too small: the first shard stacks, the later ones don't.
    let mut filter = new_filter(params(0.01, 10, 4, 10), SEED, T0).unwrap();
    for shard in 0..4 {
        add_all(&mut filter, &format!("s{shard}"), 0..2_000 + shard as u64 * 50, T0 + shard * 10_000);
    }
    let heights: Vec<usize> = filter.shards.iter().map(|s| s.filters.len()).collect();
    assert!(heights[0] > 5, "{heights:?}");
    assert_eq!(&heights[1..], &[1, 1, 1], "steady volume needs one sub-filter per shard");
    // One shard of history: its count, with up to 5% of headroom.
    let first_count = filter.shards[0].items();
    let capacity = filter.shards[1].filters[0].capacity;
    assert!((first_count..=(first_count as f64 * HEADROOM).ceil() as u64).contains(&capacity), "{capacity}");
}

#[test]
fn a_clock_that_steps_back_writes_into_the_newest_shard() {
    let mut filter = new_filter(params(0.01, 100, 3, 10), SEED, T0 + 20_000).unwrap();
    let hash = filter.hash(b"late");
    assert!(filter.add(hash, T0).unwrap());
    assert_eq!(filter.shards.len(), 1);
    assert_eq!(filter.shards[0].items(), 1);
}

/// The measured rate of one filter, over `queries` items it never saw.
fn measured(filter: &ShardedBloom, queries: u64, now: Millis) -> f64 {
    let hits = (0..queries).filter(|&n| filter.contains(filter.hash(&item("never", n)), now)).count();
    hits as f64 / queries as f64
}

#[test]
fn every_filter_keeps_its_rate_not_only_the_average_one() {
    // Small stacked sub-filters, where one filter's fill, and so its rate,
    // varies most from the average (sizing for the average let one in five of the
    // first case go over, by up to 25%). Every filter, whatever its seed,
    // stays within the rate, give or take the sampling error.
    let decade = 10 * 365 * DAY;
    let cases =
        [(Params { expansion: 1, ..params(0.01, 100, 1, decade) }, 3_000), (params(0.01, 1, 1, decade), 10_000)];
    const QUERIES: u64 = 100_000;
    let bound = 0.01 + 4.0 * (0.01f64 * 0.99 / QUERIES as f64).sqrt();
    for (params, items) in cases {
        for seed in 0..20u8 {
            let mut filter = new_filter(params, u64::from_le_bytes([seed; 8]), T0).unwrap();
            add_all(&mut filter, "in", 0..items, T0);
            let rate = measured(&filter, QUERIES, T0);
            assert!(rate <= bound, "{params:?} seed {seed}: rate {rate} over {bound}");
        }
    }
}

#[test]
fn tiny_reservations_keep_the_rate_for_any_seed() {
    // Small arrays are where double hashing degenerates; each seed draws
    // other degenerate items.
    for _ in 0..10 {
        let mut filter = new_filter(params(0.01, 1, 1, DAY), rand::random(), T0).unwrap();
        add_all(&mut filter, "t", 0..5_000, T0);
        let rate = false_positives(&filter, 20_000, T0);
        assert!(rate <= 0.01 + slack(0.01, 20_000), "{rate}");
        let hashes = filter.shards[0].filters.iter().map(|f| f.hashes());
        assert!(hashes.max().unwrap() <= MAX_HASHES);
    }
}

#[test]
fn the_headroom_follows_the_trend_between_the_two_newest_shards() {
    // Shards of 10 s: items in the one before the newest, in the newest,
    // and the next shard's capacity over the newest's count. The trend,
    // up to fourfold up and half down, and a margin of up to 3% (less where
    // an allocation size would cost more than the room it buys).
    let cases = [
        (1_000, 1_000, 1.03),
        (1_000, 1_100, 1.133),
        (1_000, 500, 0.515),
        (500, 1_000, 2.06),
        (2_000, 200, 0.515),
        (100, 1_000, 4.12),
    ];
    for (before, newest, headroom) in cases {
        // Reserved for its first shard's count: a first shard that
        // outgrew its capacity would floor the forecast (see
        // `a_shard_that_outgrew_its_forecast_floors_the_next_ones`).
        let mut filter = new_filter(params(0.01, before, 3, 10), SEED, T0).unwrap();
        add_all(&mut filter, "b", 0..before, T0);
        add_all(&mut filter, "n", 0..newest, T0 + 10_000);
        add_all(&mut filter, "c", 0..1, T0 + 20_000);
        let (newest, next) = (&filter.shards[1], &filter.shards[2]);
        let ratio = next.filters[0].capacity as f64 / newest.items() as f64;
        let trend = headroom / 1.03;
        assert!(
            ratio >= trend - 0.005 && ratio <= headroom + 0.005,
            "{before} then {newest}: {ratio}",
            newest = newest.items()
        );
    }
}

#[test]
fn sizing_counts_only_live_shards_so_plan_foresees_add() {
    // `plan` runs before `drop_expired`, `add` after it.
    let mut filter = new_filter(params(0.01, 10, 3, DAY), SEED, T0).unwrap();
    add_all(&mut filter, "a", 0..100, T0);
    add_all(&mut filter, "b", 0..300, T0 + DAY * 1000);
    let newest = filter.shards[1].items();
    let one_shard_of_history = newest..=(newest as f64 * HEADROOM).ceil() as u64;
    for (day, expected) in [(3, one_shard_of_history), (5, 10..=10)] {
        // Just past the end of day 0's shard (day 1's on day 5).
        let now = T0 + day * DAY * 1000 + 1;
        let mut later = filter.clone();
        let (capacity, _) = later.new_shard_sizing(now);
        assert!(expected.contains(&capacity), "day {day}: {capacity}");
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
    let mut filter = new_filter(params(0.01, volume, 7, DAY), SEED, T0).unwrap();
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
    filter.shards.iter().map(|s| (s.items(), s.filters[0].capacity, bytes(s))).collect()
}

#[test]
fn traffic_growing_20_percent_a_day_keeps_the_rate_and_stops_stacking() {
    let mut filter = new_filter(params(0.01, 100_000, 7, DAY), SEED, T0).unwrap();
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
    let mut filter = new_filter(params(0.01, 1_000_000, 7, DAY), SEED, T0).unwrap();
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

/// Nanoseconds per probe on an array of `bytes` bytes: every query is an
/// inserted item, so each makes all its probes (7, as at 1%).
fn probe_cost(bytes: u64, runs: usize) -> f64 {
    let queries = hashes(7, 1 << 20);
    let mut bits = Bits::new(bytes);
    queries.iter().for_each(|&q| bits.set(q, 7));
    let time = median_time(runs, || assert!(queries.iter().all(|&q| bits.check(q, 7))));
    time.as_nanos() as f64 / (queries.len() as f64 * 7.0)
}

#[test]
#[ignore = "a benchmark: cargo test --release --lib -- --ignored bench_ --nocapture"]
fn bench_probe_cost() {
    for bytes in [4 << 10, 512 << 10, 8 << 20, 256 << 20] {
        eprintln!("{:>7} KiB array: {:.2} ns a probe", bytes >> 10, probe_cost(bytes, 9));
    }
}

/// Measured false-positive rate of many `bytes`-byte arrays holding `items` items each (fresh items and queries per array), over
/// `arrays * queries` queries.
fn measured_rate(bytes: u64, items: u64, arrays: u64, queries: usize) -> f64 {
    let k = hash_count(bytes * 8, items);
    let mut hits = 0;
    for array in 0..arrays {
        let mut bits = Bits::new(bytes);
        hashes(array * 2 + 1, items as usize).into_iter().for_each(|item| bits.set(item, k));
        hits += hashes(array * 2 + 2, queries).into_iter().filter(|&q| bits.check(q, k)).count();
    }
    hits as f64 / (arrays as f64 * queries as f64)
}

/// The costliest filter to query that the decoder accepts with `shards`
/// shards of `height` sub-filters each, all of `capacity` items (period
/// 1 s, expansion 1, the lowest error rate, so every sub-filter probes
/// 20 times), and the 1,000 queries it was built against: each query's
/// first 19 probes set in every sub-filter, so that a query makes all 20
/// in each (unless another query's bits answer its 20th) and a plain
/// `MEXISTS` of them reads every sub-filter of every shard. With
/// `adversarial` false, the sub-filters hold random items instead.
fn costliest_filter(shards: u32, height: usize, capacity: u64, adversarial: bool) -> (ShardedBloom, Vec<ItemHash>) {
    let params = Params { error_rate: MIN_ERROR_RATE, capacity, window: shards - 1, period: 1, expansion: 1 };
    let queries = hashes(99, 1_000);
    let mut filter = ShardedBloom { params, seed: SEED, shards: Shards::new() };
    for start in 0..shards as i64 {
        let mut filters = SubFilters::new();
        let mut spent = 0.0;
        for level in 0..height {
            let bytes = sub_filter_bytes(capacity, params.shard_error() - spent, Share::Half).unwrap();
            let mut sub = SubFilter::new(capacity, bytes);
            spent += sub.error;
            sub.items = capacity;
            if adversarial {
                queries.iter().for_each(|&q| sub.bits.set_first(q, sub.hashes(), sub.hashes() - 1));
            } else {
                hashes(start as u64 * 1000 + level as u64, capacity as usize)
                    .into_iter()
                    .for_each(|item| sub.bits.set(item, sub.hashes()));
            }
            filters.push(sub);
        }
        filter.shards.push(Shard { start, filters });
    }
    (filter, queries)
}

/// Bytes of [`costliest_filter`]'s bit arrays, without building it.
fn costliest_bytes(shards: u32, height: usize, capacity: u64) -> u64 {
    let shard_error = MIN_ERROR_RATE / (shards - 1).max(1) as f64;
    let mut spent = 0.0;
    let mut bytes = 0;
    for _ in 0..height {
        let sub = sub_filter_bytes(capacity, shard_error - spent, Share::Half).unwrap_or(u64::MAX / 2);
        spent += false_positive_rate(sub * 8, capacity);
        bytes += sub;
    }
    bytes.saturating_mul(shards as u64)
}

/// The largest capacity at which [`costliest_filter`] fits `MAX_BYTES`.
fn largest_capacity(shards: u32, height: usize) -> u64 {
    let (mut fits, mut too_big) = (1_000u64, 1u64 << 40);
    while too_big - fits > 1 {
        let mid = fits + (too_big - fits) / 2;
        if costliest_bytes(shards, height, mid) <= MAX_BYTES { fits = mid } else { too_big = mid }
    }
    fits
}

#[test]
#[ignore = "a benchmark: cargo test --release --lib -- --ignored bench_ --nocapture"]
fn bench_worst_mexists() {
    // As many sub-filters as allowed, each as large as the bytes allow, so
    // that every probe misses the caches: a full stack per shard, one
    // sub-filter per shard, and between.
    for (shards, height) in [(16, 32), (256, 2), (128, 4)] {
        let capacity = largest_capacity(shards, height);
        for adversarial in [true, false] {
            let (filter, queries) = costliest_filter(shards, height, capacity, adversarial);
            let mut bytes = Vec::new();
            codec::encode(&filter, &mut bytes);
            let decoded = codec::decode(&bytes).map(|_| "decodes").unwrap_or_else(|e| e.0);
            drop(bytes);
            let now = (shards as i64 - 1) * 1000;
            let hits = queries.iter().filter(|&&q| filter.contains(q, now)).count();
            let time = median_time(5, || {
                std::hint::black_box(queries.iter().filter(|&&q| filter.contains(q, now)).count());
            });
            eprintln!(
                "{shards} shards x {height} of {capacity} ({} sub-filters, {} MiB, {}): 1000 contains {time:?}, {hits} hits; {decoded}",
                filter.sub_filter_count(),
                filter.bytes() >> 20,
                if adversarial { "crafted bits" } else { "random items" },
            );
        }
    }
}

/// Bytes the first shard of a new filter takes.
fn first_shard_bytes(params: Params) -> Result<u64, BloomError> {
    ShardedBloom::plan_new(&params, T0, MAX_BYTES).map(|plan| plan.allocate)
}

/// Bits per item of the sub-filter `level` (0 first) of a full stack of
/// `capacity` with EXPANSION 1, at `error_rate` over `window`.
fn stack_bits_per_item(error_rate: f64, window: u32, capacity: u64, level: usize) -> f64 {
    let shard_error = error_rate / window as f64;
    let mut spent = 0.0;
    let mut bytes = 0;
    for _ in 0..=level {
        bytes = sub_filter_bytes(capacity, shard_error - spent, Share::Half).unwrap();
        spent += false_positive_rate(bytes * 8, capacity);
    }
    bytes as f64 * 8.0 / capacity as f64
}

#[test]
fn sizes_at_the_rate_bound_stay_in_proportion() {
    // The figures behind MIN_ERROR_RATE's comment (bits an item, first
    // sub-filter of a 7-day window and the 32nd of a full stack).
    let expected = [(1e-6, 34.6, 115.6), (1e-9, 53.9, 169.7), (1e-12, 80.6, 243.3), (1e-15, 118.4, 343.9)];
    for (rate, first, deepest) in expected {
        let got = (stack_bits_per_item(rate, 7, 1_000_000, 0), stack_bits_per_item(rate, 7, 1_000_000, 31));
        assert!((got.0 - first).abs() < 1.0 && (got.1 - deepest).abs() < 1.0, "{rate:e}: {got:?}");
    }
    // At the bound, whatever the window and capacity, no sub-filter of a
    // stack takes more than 210 bits an item (or one 16-byte class).
    for window in [1, 7, MAX_WINDOW] {
        for capacity in [1, 10, 1_000, 100_000] {
            for level in [0, 1, 15, 31] {
                let bits = stack_bits_per_item(MIN_ERROR_RATE, window, capacity, level);
                assert!(
                    bits <= 210.0 || bits * capacity as f64 <= 128.0,
                    "window {window} capacity {capacity} level {level}: {bits:.1}"
                );
            }
        }
    }
}

#[test]
fn sizes_follow_capacity_with_no_floor() {
    // A sub-filter costs what its capacity and target need (with the
    // capped hash count), fitted to the allocator's classes, or 16 bytes
    // at most for tiny capacities.
    for rate in [0.5, 0.1, 0.01, 1e-4, 1e-6, MIN_ERROR_RATE] {
        for window in [1, 7, MAX_WINDOW] {
            for capacity in [1u64, 2, 10, 100, 1_000, 100_000, 10_000_000] {
                let params = Params { error_rate: rate, capacity, window, period: DAY, expansion: 2 };
                let bytes = first_shard_bytes(params).unwrap();
                // What the target needs at the optimum or with 20 hashes.
                let target = rate / window as f64 * 0.5;
                let optimum = -target.ln() / (std::f64::consts::LN_2 * std::f64::consts::LN_2);
                let capped = -20.0 / (1.0 - target.powf(1.0 / 20.0)).ln();
                let needed = capacity as f64 * optimum.max(capped) / 8.0;
                let bound = allocation_class((1.3 * needed).ceil() as u64).max(16);
                assert!(
                    bytes <= bound,
                    "{rate:e} window {window} capacity {capacity}: {bytes} bytes, {needed:.0} needed"
                );
            }
        }
    }
}

#[test]
fn the_issues_reproductions_now_take_bytes_in_proportion() {
    // IDEM.BF.RESERVE k 5e-9 1 (WINDOW 7 by default): 448 MiB in the
    // first development format.
    let reserve = Params { error_rate: 5e-9, capacity: 1, window: 7, period: DAY, expansion: 2 };
    assert_eq!(first_shard_bytes(reserve), Ok(16));
    // Capacity 1, EXPANSION 1, 32 items at 1% over 7 days: 19 MB then.
    let tiny = Params { error_rate: 0.01, capacity: 1, window: 7, period: DAY, expansion: 1 };
    let mut filter = new_filter(tiny, SEED, T0).unwrap();
    add_all(&mut filter, "r", 0..32, T0);
    assert!(filter.bytes() <= 32 * 16, "{} bytes", filter.bytes());
}

/// Mean false-positive rate of `filters` filters of `params` (each its own
/// seed) holding `items` items each, over `queries` fresh queries each.
fn mean_rate(params: Params, items: u64, filters: u64, queries: u64) -> f64 {
    let mut hits = 0;
    for n in 0..filters {
        let mut filter = new_filter(params, n, T0).unwrap();
        add_all(&mut filter, "in", 0..items, T0);
        hits += (0..queries).filter(|&q| filter.contains(filter.hash(&item("out", q)), T0)).count();
    }
    hits as f64 / (filters * queries) as f64
}

#[test]
fn mixed_probes_keep_the_rate_in_tiny_and_large_arrays() {
    // At capacity: (capacity, filters of it, queries each).
    for rate in [0.1, 0.01, 0.001] {
        for (capacity, filters, queries) in
            [(1, 2_000, 500), (10, 2_000, 500), (1_000, 50, 20_000), (100_000, 1, 1_000_000)]
        {
            let measured = mean_rate(params(rate, capacity, 1, DAY), capacity, filters, queries);
            let total = filters * queries;
            eprintln!("rate {rate}, capacity {capacity}: {measured:.6}");
            assert!(measured <= rate + slack(rate, total), "rate {rate}, capacity {capacity}: {measured}");
        }
    }
}

#[test]
fn mixed_probes_keep_the_rate_in_stacked_sub_filters() {
    // (capacity, expansion, items, filters, queries each): stacks of 32
    // sub-filters of one item, of 10, and deep stacks that doubled. The
    // rate is a mean over fills: one filter's varies by a few percent
    // around it (each query's probes meet its particular set bits), so
    // several filters are averaged.
    for (capacity, expansion, items, filters, queries) in [
        (1, 1, 32, 2_000, 500),
        (10, 1, 320, 500, 2_000),
        (1, 2, 100_000, 16, 100_000),
        (1_000, 2, 200_000, 16, 100_000),
    ] {
        let params = Params { expansion, ..params(0.01, capacity, 1, DAY) };
        let measured = mean_rate(params, items, filters, queries);
        eprintln!("capacity {capacity}, expansion {expansion}, {items} items: {measured:.6}");
        assert!(
            measured <= 0.01 + slack(0.01, filters * queries),
            "capacity {capacity} expansion {expansion}: {measured}"
        );
    }
}

#[test]
fn the_mixed_rate_model_bounds_what_small_arrays_measure() {
    for bytes in [8u64, 16, 32, 64, 128, 512] {
        let m = bytes * 8;
        for fill in [0.5, 1.0, 2.0] {
            let items = ((m as f64 * std::f64::consts::LN_2 / 7.0 * fill).round() as u64).max(1);
            let model = false_positive_rate(m, items);
            let queries = 1_000 * 1_000;
            let measured = measured_rate(bytes, items, 1_000, 1_000);
            assert!(
                measured <= model + slack(model, queries),
                "{m} bits, {items} items: measured {measured}, model {model}"
            );
        }
    }
}

#[test]
fn mixed_probes_fill_arrays_as_independent_probes_would() {
    // 1,000 items in 10,240 bits with 7 probes each: the set bits and the
    // rate, averaged over 400 arrays, are what independent uniform probes
    // give; the rate is also what the array's own fill predicts.
    let (bytes, k, n) = (1280u64, 7u32, 1000usize);
    let m = (bytes * 8) as f64;
    let expected_ones = m * (1.0 - (1.0 - 1.0 / m).powf((k as usize * n) as f64));
    let (filters, queries) = (400u64, 50_000usize);
    let (mut ones, mut measured, mut predicted) = (0.0, 0.0, 0.0);
    for f in 0..filters {
        let mut bits = Bits::new(bytes);
        hashes(f * 2 + 1000, n).into_iter().for_each(|item| bits.set(item, k));
        let set = bits.count_ones() as f64;
        ones += set / filters as f64;
        predicted += (set / m).powi(k as i32) / filters as f64;
        let hits = hashes(f * 2 + 1001, queries).into_iter().filter(|&q| bits.check(q, k)).count();
        measured += hits as f64 / queries as f64 / filters as f64;
    }
    // The average filter's rate, without the sizing's margin for one
    // filter's fill (see `false_positive_rate`).
    let clear = (k as f64 * n as f64 * (-1.0 / m).ln_1p()).exp();
    let model = (1.0 - clear).powi(k as i32) * (1.0 + k as f64 * (k as f64 - 1.0) / m);
    assert!((ones - expected_ones).abs() < 2.0, "{ones} bits set, {expected_ones} expected");
    assert!((measured / predicted - 1.0).abs() < 0.02, "{measured} measured, {predicted} from the fill");
    assert!((measured / model - 1.0).abs() < 0.02, "{measured} measured, model {model}");
    assert!(false_positive_rate(m as u64, n as u64) >= model, "the sizing's rate bounds the average one");
}
