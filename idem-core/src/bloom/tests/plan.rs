//! Plans and their execution: a write allocates what its plan foresaw,
//! and the limits refuse growth before anything changes.

use super::*;

#[test]
fn add_planned_executes_the_plan_as_add_would() {
    // A plan spanning a new day's shard and several stacked sub-filters.
    let mut planned = new_filter(params(0.01, 10, 7, DAY), SEED, T0).unwrap();
    add_all(&mut planned, "old", 0..5, T0);
    let mut plain = planned.clone();
    let now = T0 + DAY * 1000;
    let mut plan = planned.plan(200, now, MAX_BYTES).unwrap();
    assert!(plan.sub_filters >= 3, "{plan:?}");
    let (bytes, allocate) = (planned.bytes(), plan.allocate);
    for n in 0..200 {
        let hash = planned.hash(&item("p", n));
        assert_eq!(planned.add_planned(&mut plan, hash, now), plain.add(hash, now).unwrap());
    }
    assert_eq!(planned.bytes() - bytes, allocate, "allocated exactly the plan");
    let encode = |filter: &ShardedBloom| {
        let mut bytes = Vec::new();
        codec::encode(filter, &mut bytes);
        bytes
    };
    assert_eq!(encode(&planned), encode(&plain), "the same filter, bit for bit");
    // Past its plan an add sizes its sub-filter as `add` would.
    let extra = planned.hash(b"extra");
    assert_eq!(planned.add_planned(&mut Plan::default(), extra, now), plain.add(extra, now).unwrap());
    assert_eq!(encode(&planned), encode(&plain));
}

#[test]
fn add_planned_in_batches_builds_the_filter_add_builds() {
    let encode = |filter: &ShardedBloom| {
        let mut bytes = Vec::new();
        codec::encode(filter, &mut bytes);
        bytes
    };
    let cases = [
        (Params { expansion: 1, ..params(0.01, 100, 1, DAY) }, 3000, 1000),
        (params(0.01, 1, 1, DAY), 10_000, 1000),
        (params(0.01, 10, 7, DAY), 10_000, 7),
    ];
    for (params, items, batch) in cases {
        let mut planned = new_filter(params, SEED, T0).unwrap();
        let mut plain = planned.clone();
        for start in (0..items).step_by(batch) {
            let end = (start + batch).min(items) as u64;
            let mut plan = planned.plan(end - start as u64, T0, MAX_BYTES).unwrap();
            for n in start as u64..end {
                let hash = planned.hash(&item("b", n));
                assert_eq!(planned.add_planned(&mut plan, hash, T0), plain.add(hash, T0).unwrap());
            }
        }
        assert_eq!(encode(&planned), encode(&plain), "{params:?}");
    }
}

#[test]
fn add_planned_past_the_hard_limits_stores_nothing_and_never_panics() {
    // A full stack, which only a RESTORE can bring (a stack past
    // EXPANSION_HEIGHT doubles).
    let mut filter = stacked(0.01, 1, 1, MAX_SUB_FILTERS, 1);
    let now = 0;
    // The stack is full: an item no plan allowed for is not stored, and is
    // answered as new (no shard had seen it).
    let before = filter.clone();
    let fresh = filter.hash(b"fresh");
    assert!(filter.add_planned(&mut Plan::default(), fresh, now));
    assert_eq!((filter.items(), filter.sub_filter_count()), (before.items(), before.sub_filter_count()));
    assert!(!filter.contains(fresh, now) || before.contains(fresh, now));
}

#[test]
fn plan_refuses_growth_past_the_limits_before_anything_changes() {
    // A stack doubles past EXPANSION_HEIGHT, so traffic does not fill
    // it; a RESTOREd one can be full.
    let p = Params { expansion: 1, ..params(0.01, 1, 1, DAY) };
    let fitted = new_filter(p, SEED, T0).unwrap();
    assert!(fitted.plan(100_000, T0, MAX_BYTES).is_ok());
    let almost = stacked(0.01, 1, 1, MAX_SUB_FILTERS - 1, 1);
    // Its 32nd and last sub-filter holds 2.
    assert!(almost.plan(2, 0, MAX_BYTES).is_ok());
    assert_eq!(almost.plan(3, 0, MAX_BYTES), Err(BloomError::StackFull));
    let mut full = stacked(0.01, 1, 1, MAX_SUB_FILTERS, 1);
    assert_eq!(full.plan(1, 0, MAX_BYTES), Err(BloomError::StackFull));
    assert_eq!(full.add(full.hash(b"fresh"), 0), Err(BloomError::StackFull));
    let big = new_filter(params(0.01, 100_000_000, 1, DAY), SEED, T0).unwrap();
    assert!(matches!(big.plan(10_000_000_000, T0, MAX_BYTES), Err(BloomError::SizeLimit { limit: MAX_BYTES, .. })));
}

#[test]
fn plan_names_each_limit_and_add_keeps_the_hard_ones() {
    // The configured size limit, and what was needed.
    let p = params(0.01, 1_000, 1, DAY);
    let needed = ShardedBloom::plan_new(&p, T0, MAX_BYTES).unwrap().allocate;
    assert_eq!(new_filter(p, SEED, T0).unwrap().bytes(), needed);
    assert_eq!(
        ShardedBloom::new(p, SEED, T0, needed - 1).err(),
        Some(BloomError::SizeLimit { needed, limit: needed - 1 })
    );
    let plan = ShardedBloom::plan_new(&p, T0, u64::MAX).unwrap();
    assert_eq!((plan.allocate, plan.sub_filters), (needed, 1));
    let filter = new_filter(p, SEED, T0).unwrap();
    assert_eq!(filter.plan(1_000, T0, needed), Ok(Plan::default()), "fits the top sub-filter");
    let grow = filter.plan(1_001, T0, MAX_BYTES).unwrap();
    assert_eq!(grow.sub_filters, 1);
    assert_eq!(
        filter.plan(1_001, T0, needed + grow.allocate - 1),
        Err(BloomError::SizeLimit { needed: needed + grow.allocate, limit: needed + grow.allocate - 1 })
    );
    // A limit above the hard ceiling is the ceiling.
    let huge = params(0.01, 1 << 40, 1, DAY);
    assert!(matches!(ShardedBloom::plan_new(&huge, T0, u64::MAX), Err(BloomError::SizeLimit { limit: MAX_BYTES, .. })));
    // Invalid settings.
    assert!(matches!(
        ShardedBloom::plan_new(&params(0.01, 1, MAX_WINDOW + 1, DAY), T0, MAX_BYTES),
        Err(BloomError::Invalid(_))
    ));

    // Too many sub-filters in all: 16 shards of 1 s, each a full stack,
    // and a 17th to open. (Traffic does not build this: a shard is sized
    // at least for one that outgrew its forecast, see
    // `swinging_traffic_never_fills_the_filter`.)
    let mut filter = stacked(0.5, 16, 16, MAX_SUB_FILTERS, 1);
    assert_eq!(filter.sub_filter_count(), MAX_TOTAL_SUB_FILTERS);
    let now = 16_000;
    assert_eq!(filter.plan(1, now, MAX_BYTES), Err(BloomError::TooManySubFilters));
    // add refuses the same, and changes nothing.
    let before = encoded(&filter);
    assert_eq!(filter.add(filter.hash(b"fresh"), now), Err(BloomError::TooManySubFilters));
    assert_eq!(encoded(&filter), before);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// plan foresees add: when it answers a plan, `n` adds at `now`
    /// all succeed and allocate at most the plan (exactly it when all `n`
    /// items were new), within the limit; when it refuses, `n` new items
    /// cannot all be added within the limit.
    #[test]
    fn plan_foresees_add(
        capacity in 1u64..40,
        expansion in 1u32..4,
        window in 1u32..4,
        period in 1i64..3,
        rate in prop_oneof![Just(0.3), Just(0.01), Just(1e-6)],
        history in proptest::collection::vec((-2_000i64..6_000, 0u64..50), 0..8),
        n in 0u64..150,
        at in -2_000i64..8_000,
        limit in prop_oneof![Just(MAX_BYTES), 8u64..2_000],
    ) {
        let p = Params { error_rate: rate, capacity, window, period, expansion };
        let mut filter = new_filter(p, SEED, T0).unwrap();
        let mut fresh = 0u64;
        let mut now = T0;
        for (step, count) in history {
            now += step;
            if filter.plan(count, now, MAX_BYTES).is_ok() {
                for _ in 0..count {
                    filter.add(filter.hash(&item("h", fresh)), now).unwrap();
                    fresh += 1;
                }
            }
        }
        let now = now + at;
        let live = |f: &ShardedBloom| f.shards.iter().filter(|s| f.is_live(s, now)).map(|s| (s.bytes(), s.filters.len(), s.items())).fold((0, 0, 0), |a, b| (a.0 + b.0, a.1 + b.1, a.2 + b.2));
        let plan = filter.plan(n, now, limit);
        let (bytes_before, _, items_before) = live(&filter);
        let mut after = filter.clone();
        let mut refused = None;
        for i in 0..n {
            if let Err(error) = after.add(after.hash(&item("n", i)), now) {
                refused = Some(error);
                break;
            }
        }
        let (bytes_after, _, items_after) = live(&after);
        // What the write allocated: the sub-filters it stacked, a new
        // shard's included (the arrays of the shard it closed may fold,
        // which frees bytes and allocates none the plan counts).
        let (allocated, stacked) = after.shards.iter().fold((0, 0), |(bytes, count), shard| {
            let had = filter.shards.iter().find(|s| s.start == shard.start).map_or(0, |s| s.filters.len());
            let new = &shard.filters[had.min(shard.filters.len())..];
            (bytes + new.iter().map(SubFilter::bytes).sum::<u64>(), count + new.len())
        });
        prop_assert!(bytes_after <= bytes_before + allocated);
        let all_new = items_after - items_before == n;
        match plan {
            Ok(room) => {
                prop_assert_eq!(refused, None);
                // A write that allocates nothing fits even a filter over
                // a limit lowered since it grew.
                prop_assert!(room.allocate == 0 || bytes_after <= limit.min(MAX_BYTES));
                prop_assert!(allocated <= room.allocate);
                prop_assert!(stacked <= room.sub_filters as usize);
                if all_new {
                    prop_assert_eq!(allocated, room.allocate);
                    prop_assert_eq!(stacked, room.sub_filters as usize);
                }
            }
            Err(BloomError::SizeLimit { needed, limit: applied }) => {
                prop_assert_eq!(applied, limit.min(MAX_BYTES));
                prop_assert!(needed > applied);
                // Counted before any fold frees bytes.
                if refused.is_none() && all_new {
                    prop_assert!(bytes_before + allocated >= needed, "{} < {}", bytes_before + allocated, needed);
                }
            }
            Err(error) => {
                prop_assert!(refused == Some(error) || !all_new, "{:?} then {:?}", error, refused);
            }
        }
    }
}
