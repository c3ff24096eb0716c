//! Filters under the traffic shapes of issue 18, in real time with 1 s
//! shards: a busy shard after quiet ones, and volumes that swing by turns,
//! take every add (a forecast that was wrong is corrected by growth, never
//! answered with an error), and a closed shard shrinks to what its items
//! need. Each test passes a few shards, so it takes a few seconds.
#[allow(dead_code)] // each test binary uses part of common/
mod common;

use common::clock::align_to_boundary;
use common::commands::{
    bf_add, bf_info, claim_new, digest_value, done, idem_counters, items, madd_all, mexists_all, ones, reserve,
};
use common::server::Server;

/// Waits for the start of the next 1 s shard (and 30 ms into it).
fn next_shard(con: &mut redis::Connection) {
    align_to_boundary(con, 1000, 30);
}

#[test]
fn a_busy_shard_after_quiet_ones_takes_every_add() {
    // The forecast after two quiet shards of one item is about 2 items:
    // with EXPANSION 1, 32 sub-filters of 2 held 64 and item 65 was
    // refused ("filter full"), and every DONE ... BLOOM dropped its add.
    let mut s = Server::start();
    let mut con = s.conn();
    next_shard(&mut con);
    reserve(&mut con, "k", "0.01", 100_000, &["WINDOW", "7", "SHARD", "1", "EXPANSION", "1"]);
    bf_add(&mut con, "k", "quiet-0");
    next_shard(&mut con);
    bf_add(&mut con, "k", "quiet-1");
    next_shard(&mut con);
    let busy = items("busy-", 0..4_000);
    let answers = madd_all(&mut con, "k", &busy);
    assert_eq!(answers.len(), busy.len());
    for n in 0..100 {
        let key = format!("order:{n}");
        let token = claim_new(&mut con, &key, 60);
        assert_eq!(done(&mut con, &key, &token, ("BLOOM", "k")), Ok(1), "DONE {key} BLOOM k");
    }
    assert_eq!(idem_counters(&mut con)["done_bloom_dropped"], 0);
    assert_eq!(ones(&mexists_all(&mut con, "k", &busy)), busy.len(), "no false negatives");
    let orders: Vec<String> = (0..100).map(|n| format!("order:{n}")).collect();
    assert_eq!(ones(&mexists_all(&mut con, "k", &orders)), orders.len());
    let info = bf_info(&mut con, "k");
    let newest = info.shards.last().unwrap();
    assert!(newest.items >= 4_000, "{info:?}");
    // Four sub-filters at EXPANSION 1, then doubling: about a dozen.
    assert!(newest.filters <= 16, "{} sub-filters for {} items: {info:?}", newest.filters, newest.items);
    let fresh = items("fresh-", 0..20_000);
    let false_positives = ones(&mexists_all(&mut con, "k", &fresh));
    assert!(false_positives <= 200 + 60, "{false_positives} of 20,000 fresh items seen");
    s.assert_alive();
}

#[test]
fn volumes_that_swing_by_turns_never_fill_the_filter() {
    // Volume 1 and then thousands, by turns: each busy shard was sized
    // after a quiet one and stacked a dozen sub-filters, so that a window
    // of 300 reached 512 sub-filters at shard 63 and refused every add. A
    // new shard is now sized at least for a shard in the window that
    // outgrew its forecast.
    let mut s = Server::start();
    let mut con = s.conn();
    next_shard(&mut con);
    reserve(&mut con, "tot", "0.01", 20_000, &["WINDOW", "300", "SHARD", "1"]);
    let shards = 7;
    for shard in 0..shards {
        if shard > 0 {
            next_shard(&mut con);
        }
        let volume = if shard % 2 == 0 { 1 } else { 3_000 };
        madd_all(&mut con, "tot", &items(&format!("s{shard}-"), 0..volume));
    }
    let info = bf_info(&mut con, "tot");
    let heights: Vec<i64> = info.shards.iter().map(|shard| shard.filters).collect();
    assert!(info.shards.len() >= shards - 1, "{info:?}");
    // The first busy shard followed a quiet first one and stacked; every
    // later one is sized for the busy volume, in one sub-filter.
    assert!(heights[2..].iter().all(|&height| height == 1), "sub-filters a shard: {heights:?}");
    // A quiet shard, once closed, keeps only what its one item needs.
    let quiet_closed = &info.shards[info.shards.len() - 3];
    assert!(quiet_closed.items <= 1 && quiet_closed.bytes <= 64, "{quiet_closed:?} in {info:?}");
    for shard in (1..shards).step_by(2) {
        let seen = mexists_all(&mut con, "tot", &items(&format!("s{shard}-"), 0..3_000));
        assert_eq!(ones(&seen), 3_000, "shard {shard}: no false negatives");
    }
    s.assert_alive();
}

#[test]
fn a_closed_shard_shrinks_to_what_its_items_need() {
    // 10 items in a 10M reservation: the closed shard folded only to
    // 7,480 bytes (an odd word count stopped the halving).
    let mut s = Server::start();
    let mut con = s.conn();
    next_shard(&mut con);
    reserve(&mut con, "big", "0.01", 10_000_000, &["WINDOW", "2", "SHARD", "1"]);
    let ten = items("ten-", 0..10);
    madd_all(&mut con, "big", &ten);
    let open = bf_info(&mut con, "big");
    assert!(open.bytes > 10_000_000, "{open:?}");
    next_shard(&mut con);
    bf_add(&mut con, "big", "next");
    let info = bf_info(&mut con, "big");
    let closed = &info.shards[0];
    assert_eq!(closed.items, 10, "{info:?}");
    assert!(closed.bytes <= 64, "a closed shard of 10 items keeps {} bytes", closed.bytes);
    assert_eq!(ones(&mexists_all(&mut con, "big", &ten)), 10);
    // It saves and loads as it is.
    let digest = digest_value(&mut con, "big");
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut con).unwrap();
    assert_eq!(digest_value(&mut con, "big"), digest);
    assert_eq!(bf_info(&mut con, "big").shards[0].bytes, closed.bytes);
    s.assert_alive();
}
