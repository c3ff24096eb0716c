//! The one entry point of every write.

use super::*;

const ROOMY: FixedLimits = FixedLimits { max_bytes: MAX_BYTES, max_value: u64::MAX, memory_left: u64::MAX };

fn create(params: Params) -> WhenGone<impl FnOnce() -> Result<NewFilter, CmdError>> {
    WhenGone::Create(move || Ok(NewFilter { params, seed: SEED }))
}

fn write_items(
    filter: Option<&mut ShardedBloom>,
    when_gone: WhenGone<impl FnOnce() -> Result<NewFilter, CmdError>>,
    items: &[&[u8]],
    now: Millis,
    limits: &FixedLimits,
) -> Result<Written, CmdError> {
    ShardedBloom::write(filter, when_gone, items.iter().copied(), now, limits)
}

#[test]
fn a_write_to_a_missing_key_creates_the_filter_and_replicates_its_parameters() {
    let p = params(0.01, 100, 3, 10);
    let (answers, change, effect) = write_items(None, create(p), &[b"a", b"b", b"a"], T0, &ROOMY).unwrap();
    assert_eq!(answers.iter().collect::<Vec<_>>(), [true, true, false]);
    let KeyChange::Store(filter) = change else { panic!("a new filter to store") };
    assert_eq!((filter.items(), filter.params, filter.seed), (2, p, SEED));
    let header = effect.expect("replicated").header().to_vec();
    let (now, create) = codec::decode_effect_header(&header).unwrap();
    assert_eq!(now, T0);
    let (params, seed) = codec::decode_params(&mut crate::decode::Reader(create)).unwrap();
    assert_eq!((params, seed), (p, SEED));
    // Without a filter to create, a missing key stays missing.
    let (answers, change, effect) = write_items(None, WhenGone::LEAVE, &[], T0, &ROOMY).unwrap();
    assert!(answers.is_empty() && matches!(change, KeyChange::Unchanged) && effect.is_none());
}

#[test]
fn a_write_changes_in_place_replicates_only_the_time_and_skips_what_changes_nothing() {
    let p = params(0.01, 100, 3, 10);
    let mut filter = new_filter(p, SEED, T0).unwrap();
    let (answers, change, effect) = write_items(Some(&mut filter), create(p), &[b"x"], T0, &ROOMY).unwrap();
    assert_eq!(answers.iter().collect::<Vec<_>>(), [true]);
    assert!(matches!(change, KeyChange::Updated { expire_at } if expire_at == filter.expire_at()));
    assert_eq!(effect.unwrap().header(), T0.to_le_bytes());
    // Already in the current shard: nothing to store or replicate.
    let (answers, change, effect) = write_items(Some(&mut filter), create(p), &[b"x"], T0, &ROOMY).unwrap();
    assert_eq!(answers.iter().collect::<Vec<_>>(), [false]);
    assert!(matches!(change, KeyChange::Unchanged) && effect.is_none());
    // In an older shard: answered seen, recorded in the new one.
    let later = T0 + 10_000;
    let (answers, change, _) = write_items(Some(&mut filter), create(p), &[b"x"], later, &ROOMY).unwrap();
    assert_eq!(answers.iter().collect::<Vec<_>>(), [false]);
    assert!(matches!(change, KeyChange::Updated { .. }));
    assert_eq!(filter.shards.len(), 2);
}

#[test]
fn a_gone_filter_is_replaced_by_a_write_and_deleted_by_a_drop() {
    let p = params(0.01, 100, 2, 10);
    let mut filter = new_filter(p, SEED, T0).unwrap();
    add_all(&mut filter, "old", 0..10, T0);
    let gone = T0 + 30_001;
    assert!(!filter.is_alive(gone));
    let mut dropped = filter.clone();
    let (_, change, effect) = write_items(Some(&mut dropped), WhenGone::LEAVE, &[], gone, &ROOMY).unwrap();
    assert!(matches!(change, KeyChange::Delete) && effect.is_some());
    let (answers, change, _) = write_items(Some(&mut filter), create(p), &[b"old:000000000000"], gone, &ROOMY).unwrap();
    assert_eq!(answers.iter().collect::<Vec<_>>(), [true], "a new filter has seen nothing");
    assert!(matches!(change, KeyChange::Store(new) if new.items() == 1));
}

#[test]
fn a_write_past_the_hosts_limits_changes_nothing_and_the_dump_size_is_exact_enough() {
    let p = params(0.01, 1_000, 2, 10);
    let mut filter = new_filter(p, SEED, T0).unwrap();
    add_all(&mut filter, "a", 0..1_000, T0);
    let before = encoded(&filter);
    let items: Vec<Vec<u8>> = (0..10).map(|n| item("b", n)).collect();
    let items: Vec<&[u8]> = items.iter().map(Vec::as_slice).collect();
    let plan = filter.plan(10, T0, MAX_BYTES).unwrap();
    assert_eq!(plan.sub_filters, 1);
    // The encoding after the write, in a DUMP: what the core reckons.
    let mut grown = filter.clone();
    for item in &items {
        grown.add(grown.hash(item), T0).unwrap();
    }
    let dumped = codec::dumped_len(encoded(&grown).len() as u64);
    assert_eq!(codec::dumped_len(codec::encoded_len(&filter) + codec::encoded_growth(&plan)), dumped);
    let small_value = FixedLimits { max_value: dumped - 1, ..ROOMY };
    let refused = write_items(Some(&mut filter), create(p), &items, T0, &small_value).err().unwrap();
    assert!(refused.message().contains("bytes, over"), "{}", refused.message());
    let no_memory = FixedLimits { memory_left: plan.allocate - 1, ..ROOMY };
    let refused = write_items(Some(&mut filter), create(p), &items, T0, &no_memory).err().unwrap();
    assert!(refused.message().starts_with("OOM"), "{}", refused.message());
    let small = FixedLimits { max_bytes: filter.bytes(), ..ROOMY };
    let refused = write_items(Some(&mut filter), create(p), &items, T0, &small).err().unwrap();
    assert!(refused.message().contains("idem.bf-max-bytes"), "{}", refused.message());
    assert_eq!(encoded(&filter), before, "nothing changed");
    write_items(Some(&mut filter), create(p), &items, T0, &ROOMY).unwrap();
    assert_eq!(encoded(&filter), encoded(&grown), "the write a plain add makes");
    // A write that allocates nothing is not asked about, even over a
    // limit lowered since the filter grew.
    let nothing = FixedLimits { max_bytes: 8, max_value: 0, memory_left: 0 };
    let (answers, change, _) = write_items(Some(&mut filter), create(p), &[b"c"], T0, &nothing).unwrap();
    assert_eq!(answers.iter().collect::<Vec<_>>(), [true]);
    assert!(matches!(change, KeyChange::Updated { .. }));
}

#[test]
fn answers_hold_any_number_of_items_in_order() {
    let p = params(0.01, 10, 1, DAY);
    let names: Vec<Vec<u8>> = (0..200).map(|n| item("n", n % 150)).collect();
    let items: Vec<&[u8]> = names.iter().map(Vec::as_slice).collect();
    let (answers, _, _) = write_items(None, create(p), &items, T0, &ROOMY).unwrap();
    assert_eq!(answers.len(), 200);
    let answers: Vec<bool> = answers.iter().collect();
    assert!(answers[150..].iter().all(|&new| !new), "repeats answer seen");
    assert!(answers[..150].iter().filter(|&&new| new).count() >= 148);
}
