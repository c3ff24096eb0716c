//! Redis Cluster: claims and filters through a cluster client over 3
//! shards, hash-tagged record + filter pairs, CROSSSLOT, resharding under
//! load (MIGRATE keeps every record and filter; no claim is granted twice)
//! and failover under load (tokens of acknowledged writes keep working);
//! on a one-node cluster, the BLOOM option's CROSSSLOT refusals.
#[allow(dead_code)] // each test binary uses part of common/
mod common;

use common::cluster::{
    Cluster, Load, LoadReport, NodeInfo, TimedSnap, Topology, assert_same_moved_filter, assert_same_moved_record,
    key_slot, kill9, reshard, tag_where, timed_snapshot, wait_until,
};
use common::commands::{
    bf_exists, bf_madd, claim, claim_new, claim_new_opts, done, exists, extend, get_fields, get_opt, release,
};
use common::fixtures::{
    FilterSnap, Fixture, NONE, assert_same_records, check_fixture_tokens, filter_snap, populate, snapshot_all,
};
use common::reply::{
    as_int, as_token, err_text, expect_err, f_bytes, f_int, f_str, fields_from_reply, parse_claim, random_token,
};
use common::server::{Server, parse_info};
use redis::cluster::ClusterConnection;
use redis::{ConnectionLike, RedisResult, Value};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Any command through any connection (plain or cluster).
fn cq<C: ConnectionLike, A: redis::ToRedisArgs>(con: &mut C, name: &str, args: A) -> RedisResult<Value> {
    let mut c = redis::cmd(name);
    c.arg(args);
    c.query(con)
}

/// `IDEM.CLAIM key lease opts...` → (status, value, attempt); panics on an error.
fn cclaim<C: ConnectionLike>(con: &mut C, key: &str, lease: i64, opts: &[&str]) -> (String, Value, i64) {
    let v =
        cq(con, "IDEM.CLAIM", (key, lease, opts)).unwrap_or_else(|e| panic!("IDEM.CLAIM {key} {lease} {opts:?}: {e}"));
    parse_claim(v)
}

fn cclaim_new<C: ConnectionLike>(con: &mut C, key: &str, lease: i64, opts: &[&str]) -> String {
    let (s, v, a) = cclaim(con, key, lease, opts);
    assert_eq!((s.as_str(), a), ("NEW", 1), "IDEM.CLAIM {key} {opts:?}: {v:?}");
    as_token(&v)
}

fn cdone<C: ConnectionLike, A: redis::ToRedisArgs>(
    con: &mut C,
    key: &str,
    token: &str,
    args: A,
) -> Result<i64, String> {
    cq(con, "IDEM.DONE", (key, token, args)).map(|v| as_int(&v)).map_err(|e| err_text(&e))
}

fn cerr<C: ConnectionLike, A: redis::ToRedisArgs>(con: &mut C, name: &str, args: A) -> String {
    match cq(con, name, args) {
        Ok(v) => panic!("{name}: expected an error, got {v:?}"),
        Err(e) => err_text(&e),
    }
}

fn int<C: ConnectionLike, A: redis::ToRedisArgs>(con: &mut C, name: &str, args: A) -> i64 {
    as_int(&cq(con, name, args).unwrap_or_else(|e| panic!("{name}: {e}")))
}

fn dbsize(con: &mut redis::Connection) -> i64 {
    redis::cmd("DBSIZE").query(con).expect("DBSIZE")
}

/// `COMMAND GETKEYS <args...>` on one node.
fn getkeys(con: &mut redis::Connection, args: &[&str]) -> Vec<String> {
    redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg(args)
        .query(con)
        .unwrap_or_else(|e| panic!("COMMAND GETKEYS {args:?}: {e}"))
}

/// `WAIT 1 10000` on the connection that wrote: the replica acknowledged.
fn wait_replica(con: &mut redis::Connection, what: &str) {
    let n: i64 = redis::cmd("WAIT").arg(1).arg(10_000).query(con).expect("WAIT");
    assert_eq!(n, 1, "{what}: WAIT 1: the replica did not acknowledge");
}

#[test]
fn claims_and_filters_across_shards() {
    let started = Instant::now();
    let cluster = Cluster::start();
    let topo = cluster.topology();
    let primaries = topo.primaries();
    let mut cc = cluster.cluster_conn();
    let mut any = cluster.conn(primaries[0].port);
    slot_function_is_redis(&mut any);
    plain_keys_spread_over_every_shard(&cluster, &mut cc, &primaries);
    let tags = records_share_a_slot_with_their_filter(&cluster, &mut cc, &topo, &primaries);
    bucketed_namespace_covers_every_shard(&mut cc, &primaries);
    let mut xc = replicas_read_and_other_nodes_redirect(&cluster, &topo, &primaries, &tags[0]);
    record_and_filter_in_two_slots_are_crossslot(&mut cc, &mut xc);
    getkeys_gives_exact_key_positions(&mut any);
    filters_remember_records_whose_retention_ended(&mut cc, &tags);
    eprintln!("claims_and_filters_across_shards: {:?}", started.elapsed());
}

fn slot_function_is_redis(any: &mut redis::Connection) {
    // Our slot function is Redis's.
    for key in ["order:1", "{t1}:order", "{orders:7}:order:123", "a{}b", "{}{x}", "x{y"] {
        let slot: i64 = redis::cmd("CLUSTER").arg("KEYSLOT").arg(key).query(any).unwrap();
        assert_eq!(slot, key_slot(key) as i64, "CLUSTER KEYSLOT {key}");
    }
}

fn plain_keys_spread_over_every_shard(cluster: &Cluster, cc: &mut ClusterConnection, primaries: &[&NodeInfo]) {
    // Plain keys spread over every shard, routed by the cluster client.
    let n = 300;
    let mut tokens = Vec::new();
    for i in 0..n {
        tokens.push(cclaim_new(cc, &format!("order:{i}"), 60, &[]));
    }
    for i in (0..n).step_by(2) {
        assert_eq!(cdone(cc, &format!("order:{i}"), &tokens[i], ("RESULT", format!("r{i}"))), Ok(1));
    }
    let mut total = 0;
    for p in primaries {
        let mut con = cluster.conn(p.port);
        let size = dbsize(&mut con);
        assert!(size > 0, "primary {} holds no key", p.port);
        total += size;
        // Each key is on the primary owning its slot (DBSIZEs add up to n).
        for i in 0..n {
            let key = format!("order:{i}");
            if p.owns(key_slot(&key)) {
                assert!(exists(&mut con, &key), "{key} on {}", p.port);
            }
        }
    }
    assert_eq!(total, n as i64);
    for i in 0..n {
        let key = format!("order:{i}");
        let (s, v, a) = cclaim(cc, &key, 60, &[]);
        if i % 2 == 0 {
            assert_eq!((s, v, a), ("DONE".to_string(), Value::BulkString(format!("r{i}").into_bytes()), 1), "{key}");
        } else {
            assert_eq!((s.as_str(), a), ("BUSY", 1), "{key}");
        }
    }
}

/// A record and its filter share a slot through a hash tag: one per shard.
/// Returns the tags.
fn records_share_a_slot_with_their_filter(
    cluster: &Cluster,
    cc: &mut ClusterConnection,
    topo: &Topology,
    primaries: &[&NodeInfo],
) -> Vec<String> {
    let tags: Vec<String> =
        primaries.iter().enumerate().map(|(i, p)| tag_where(&format!("t{i}-"), |s| p.owns(s))).collect();
    for tag in &tags {
        let (rec, seen) = (format!("{{{tag}}}:order"), format!("{{{tag}}}:seen"));
        let t = cclaim_new(cc, &rec, 60, &["BLOOM", &seen]);
        assert_eq!(cdone(cc, &rec, &t, ("RESULT", "ok", "RETAIN", 1, "BLOOM", &seen)), Ok(1));
        assert_eq!(int(cc, "IDEM.BF.EXISTS", (&seen, &rec)), 1, "{seen} has {rec}");
        assert_eq!(int(cc, "IDEM.BF.EXISTS", (&seen, "never")), 0);
        // The filter is a key of the record's shard.
        let owner = topo.owner(key_slot(&seen));
        let mut oc = cluster.conn(owner.port);
        let ty: String = redis::cmd("TYPE").arg(&seen).query(&mut oc).unwrap();
        assert_ne!(ty, "none", "{seen} on {}", owner.port);
        // A never-completed key with that filter is NEW.
        let t2 = cclaim_new(cc, &format!("{{{tag}}}:other"), 60, &["BLOOM", &seen]);
        assert_eq!(cdone(cc, &format!("{{{tag}}}:other"), &t2, NONE), Ok(1));
    }

    tags
}

fn bucketed_namespace_covers_every_shard(cc: &mut ClusterConnection, primaries: &[&NodeInfo]) {
    // Bucketing a hot namespace: {orders:<id mod 16>} for record and filter.
    let mut bucket_tokens = BTreeMap::new();
    for id in 0..64 {
        let bucket = id % 16;
        let rec = format!("{{orders:{bucket}}}:order:{id}");
        let seen = format!("{{orders:{bucket}}}:seen");
        let t = cclaim_new(cc, &rec, 60, &["BLOOM", &seen]);
        bucket_tokens.insert(id, t);
    }
    let buckets_per_shard: Vec<usize> =
        primaries.iter().map(|p| (0..16).filter(|b| p.owns(key_slot(&format!("{{orders:{b}}}")))).count()).collect();
    assert!(buckets_per_shard.iter().all(|&c| c > 0), "16 buckets cover every shard: {buckets_per_shard:?}");
    for (id, t) in &bucket_tokens {
        let bucket = id % 16;
        let rec = format!("{{orders:{bucket}}}:order:{id}");
        let seen = format!("{{orders:{bucket}}}:seen");
        assert_eq!(cdone(cc, &rec, t, ("BLOOM", &seen)), Ok(1), "{rec}");
    }
    for id in 0..64 {
        let bucket = id % 16;
        let seen = format!("{{orders:{bucket}}}:seen");
        let rec = format!("{{orders:{bucket}}}:order:{id}");
        assert_eq!(int(cc, "IDEM.BF.EXISTS", (&seen, &rec)), 1, "{seen} has {rec}");
        let info = cq(cc, "IDEM.BF.INFO", &seen).unwrap();
        assert_ne!(info, Value::Nil);
    }
}

/// Reads on a replica of `tag`'s shard; writes there, and on another
/// primary, redirect. Returns a connection to that other primary.
fn replicas_read_and_other_nodes_redirect(
    cluster: &Cluster,
    topo: &Topology,
    primaries: &[&NodeInfo],
    tag: &str,
) -> redis::Connection {
    // Reads on a read-only replica (after READONLY); writes there redirect.
    let owner = topo.owner(key_slot(tag));
    let replica = topo.replicas_of(&owner.id)[0].port;
    let mut rc = cluster.conn(replica);
    let _: () = redis::cmd("READONLY").query(&mut rc).unwrap();
    let rec = format!("{{{tag}}}:other");
    let seen = format!("{{{tag}}}:seen");
    wait_until(&format!("{rec} on replica {replica}"), Duration::from_secs(10), || get_opt(&mut rc, &rec).is_some());
    assert_eq!(f_str(&get_fields(&mut rc, &rec), "state"), "done");
    // {tag}:order went into the filter (DONE ... BLOOM), {tag}:other did not.
    let added = format!("{{{tag}}}:order");
    let hits: Vec<i64> =
        redis::cmd("IDEM.BF.MEXISTS").arg(&seen).arg(&added).arg(&rec).arg("never").query(&mut rc).unwrap();
    assert_eq!(hits, vec![1, 0, 0], "IDEM.BF.MEXISTS on the replica");
    assert_eq!(int(&mut rc, "IDEM.BF.EXISTS", (&seen, &added)), 1);
    assert_ne!(cq(&mut rc, "IDEM.BF.INFO", &seen).unwrap(), Value::Nil);
    let e = cerr(&mut rc, "IDEM.CLAIM", (&rec, 60));
    assert_eq!(e, format!("MOVED {} 127.0.0.1:{}", key_slot(&rec), owner.port), "a write on a replica");

    // A node that does not own the slot answers MOVED to the owner.
    let other = primaries.iter().find(|p| p.id != owner.id).unwrap();
    let mut xc = cluster.conn(other.port);
    let e = cerr(&mut xc, "IDEM.CLAIM", (&rec, 60, "BLOOM", &seen));
    assert_eq!(e, format!("MOVED {} 127.0.0.1:{}", key_slot(&rec), owner.port));

    xc
}

fn record_and_filter_in_two_slots_are_crossslot(cc: &mut ClusterConnection, xc: &mut redis::Connection) {
    // CROSSSLOT: record and filter in two slots; nothing is written.
    assert_ne!(key_slot("{a}"), key_slot("{b}"));
    for con_e in [
        cerr(cc, "IDEM.CLAIM", ("{a}:order", 60, "BLOOM", "{b}:seen")),
        cerr(cc, "IDEM.CLAIM", ("{a}:order", 60, "MAXTRIES", 3, "PAYLOAD", "x", "BLOOM", "{b}:seen")),
        cerr(cc, "IDEM.CLAIM", ("{a}:order", 60, "PAYLOAD", "BLOOM", "BLOOM", "{b}:seen")),
        cerr(cc, "IDEM.CLAIM", ("{a}:order", 60, "OWNER", "BLOOM", "BLOOM", "{b}:seen")),
        cerr(cc, "IDEM.CLAIM", ("{a}:order", 60, "PAYLOAD", "OWNER", "BLOOM", "{b}:seen")),
        cerr(cc, "IDEM.DONE", ("{a}:order", random_token(), "BLOOM", "{b}:seen")),
        cerr(cc, "IDEM.DONE", ("{a}:order", random_token(), "RESULT", "BLOOM", "BLOOM", "{b}:seen")),
        cerr(xc, "IDEM.CLAIM", ("{a}:order", 60, "BLOOM", "{b}:seen")),
    ] {
        assert!(con_e.starts_with("CROSSSLOT"), "expected CROSSSLOT, got {con_e}");
    }
    assert_eq!(int(cc, "EXISTS", "{a}:order"), 0, "CROSSSLOT wrote the record");
    assert_eq!(int(cc, "EXISTS", "{b}:seen"), 0, "CROSSSLOT wrote the filter");
    // Option values are not keys: no CROSSSLOT for them.
    let t = cclaim_new(cc, "{a}:p1", 60, &["PAYLOAD", "{b}:seen"]);
    assert_eq!(cdone(cc, "{a}:p1", &t, ("RESULT", "{b}:x")), Ok(1));
    let t = cclaim_new(cc, "{a}:p2", 60, &["PAYLOAD", "BLOOM", "BLOOM", "{a}:seen"]);
    assert_eq!(cdone(cc, "{a}:p2", &t, ("RESULT", "BLOOM", "BLOOM", "{a}:seen")), Ok(1));
    assert_eq!(int(cc, "IDEM.BF.EXISTS", ("{a}:seen", "{a}:p2")), 1);
    let t = cclaim_new(cc, "{a}:p3", 60, &["PAYLOAD", "BLOOM"]);
    assert_eq!(cdone(cc, "{a}:p3", &t, ("RESULT", "BLOOM")), Ok(1));
    // An owner spelling an option, or naming a key of another slot.
    let t = cclaim_new(cc, "{a}:p4", 60, &["OWNER", "BLOOM", "BLOOM", "{a}:seen"]);
    assert_eq!(
        f_bytes(&fields_from_reply(cq(cc, "IDEM.GET", "{a}:p4").unwrap()).unwrap(), "owner"),
        Some(b"BLOOM".to_vec())
    );
    assert_eq!(cdone(cc, "{a}:p4", &t, NONE), Ok(1));
    let t = cclaim_new(cc, "{a}:p5", 60, &["PAYLOAD", "OWNER", "OWNER", "{b}:seen"]);
    assert_eq!(cdone(cc, "{a}:p5", &t, NONE), Ok(1));
    assert_eq!(int(cc, "EXISTS", "{b}:seen"), 0);
}

fn getkeys_gives_exact_key_positions(any: &mut redis::Connection) {
    // COMMAND GETKEYS: exact key positions.
    let cases: &[(&[&str], &[&str])] = &[
        (&["IDEM.CLAIM", "{t1}:order", "60", "BLOOM", "{t1}:seen"], &["{t1}:order", "{t1}:seen"]),
        (&["IDEM.CLAIM", "k", "60"], &["k"]),
        (&["IDEM.CLAIM", "k", "60", "PAYLOAD", "BLOOM"], &["k"]),
        (&["IDEM.CLAIM", "k", "60", "PAYLOAD", "BLOOM", "BLOOM", "f"], &["k", "f"]),
        (&["IDEM.CLAIM", "k", "60", "MAXTRIES", "2", "bloom", "f", "PAYLOAD", "p"], &["k", "f"]),
        (&["IDEM.CLAIM", "k", "60", "OWNER", "BLOOM"], &["k"]),
        (&["IDEM.CLAIM", "k", "60", "OWNER", "BLOOM", "BLOOM", "f"], &["k", "f"]),
        (&["IDEM.CLAIM", "k", "60", "PAYLOAD", "OWNER", "BLOOM", "f"], &["k", "f"]),
        (&["IDEM.CLAIM", "k", "60", "OWNER", "PAYLOAD", "PAYLOAD", "OWNER"], &["k"]),
        (&["IDEM.MCLAIM", "60", "2", "k", "l", "OWNER", "BLOOM", "BLOOM", "f"], &["k", "l", "f"]),
        (&["IDEM.MCLAIM", "60", "1", "k", "PAYLOADS", "OWNER", "BLOOM", "f"], &["k", "f"]),
        (&["IDEM.DONE", "k", "tok", "BLOOM", "f"], &["k", "f"]),
        (&["IDEM.DONE", "k", "tok", "RESULT", "BLOOM", "RETAIN", "5"], &["k"]),
        (&["IDEM.DONE", "k", "tok", "RESULT", "BLOOM", "BLOOM", "f"], &["k", "f"]),
        (&["IDEM.RELEASE", "k", "tok"], &["k"]),
        (&["IDEM.EXTEND", "k", "tok", "5"], &["k"]),
        (&["IDEM.GET", "k"], &["k"]),
        (&["IDEM.ONCE", "k", "5"], &["k"]),
        (&["IDEM.BF.RESERVE", "f", "0.01", "100"], &["f"]),
        (&["IDEM.BF.ADD", "f", "i"], &["f"]),
        (&["IDEM.BF.MADD", "f", "i", "j"], &["f"]),
        (&["IDEM.BF.EXISTS", "f", "i"], &["f"]),
        (&["IDEM.BF.MEXISTS", "f", "i", "j"], &["f"]),
        (&["IDEM.BF.INFO", "f"], &["f"]),
    ];
    for (args, want) in cases {
        assert_eq!(getkeys(any, args), *want, "COMMAND GETKEYS {args:?}");
    }
}

fn filters_remember_records_whose_retention_ended(cc: &mut ClusterConnection, tags: &[String]) {
    // RETAIN 1: the record goes, the filter remembers: the next claim is SEEN.
    for tag in tags {
        let (rec, seen) = (format!("{{{tag}}}:order"), format!("{{{tag}}}:seen"));
        wait_until(&format!("{rec} expired (RETAIN 1)"), Duration::from_secs(10), || {
            cq(cc, "IDEM.GET", &rec).unwrap() == Value::Nil
        });
        let (s, v, a) = cclaim(cc, &rec, 60, &["BLOOM", &seen]);
        assert_eq!((s.as_str(), a), ("SEEN", 1), "{rec} after its record expired: {v:?}");
        let t = as_token(&v);
        assert_eq!(f_str(&fields_from_reply(cq(cc, "IDEM.GET", &rec).unwrap()).unwrap(), "state"), "processing");
        assert_eq!(cdone(cc, &rec, &t, ("BLOOM", &seen)), Ok(1));
        // Without BLOOM the filter is not consulted.
        let (s, _, _) = cclaim(cc, &rec, 60, &[]);
        assert_eq!(s, "DONE");
    }
}

/// Records in every state in `tag`'s slot, plus filters: a reserved one
/// with items, one created by `DONE ... BLOOM`, and a small one grown into
/// stacked sub-filters. Returns (record keys, filter keys, probe items).
fn populate_tag(con: &mut redis::Connection, tag: &str) -> (Fixture, Vec<String>, Vec<String>) {
    let fx = populate(con, &format!("{{{tag}}}:"));
    let reserved = format!("{{{tag}}}:seen");
    let auto = format!("{{{tag}}}:auto");
    let grown = format!("{{{tag}}}:grown");
    let _: () =
        redis::cmd("IDEM.BF.RESERVE").arg(&reserved).arg(0.001).arg(1000).arg("WINDOW").arg(3).query(con).unwrap();
    let items: Vec<String> = (0..200).map(|i| format!("item-{i}")).collect();
    let _: Vec<i64> = redis::cmd("IDEM.BF.MADD").arg(&reserved).arg(&items).query(con).unwrap();
    let _: () = redis::cmd("IDEM.BF.RESERVE")
        .arg(&grown)
        .arg(0.01)
        .arg(10)
        .arg("WINDOW")
        .arg(2)
        .arg("SHARD")
        .arg("HOUR")
        .arg("EXPANSION")
        .arg(4)
        .query(con)
        .unwrap();
    let _: Vec<i64> = redis::cmd("IDEM.BF.MADD").arg(&grown).arg(&items).query(con).unwrap();
    let rec = format!("{{{tag}}}:bf-order");
    let t = claim_new_opts(con, &rec, 600, &["BLOOM", &auto]);
    assert_eq!(done(con, &rec, &t, ("RESULT", "via-bloom", "BLOOM", &auto)), Ok(1));
    let mut probe = items.clone();
    probe.extend((0..50).map(|i| format!("absent-{i}")));
    probe.push(rec.clone());
    (fx, vec![reserved, auto, grown], probe)
}

/// `errorstat_<CODE>` counts (ASK, MOVED, TRYAGAIN, CLUSTERDOWN), summed
/// over the running nodes.
fn error_stats(cluster: &Cluster) -> BTreeMap<String, i64> {
    let mut out: BTreeMap<String, i64> =
        ["ASK", "MOVED", "TRYAGAIN", "CLUSTERDOWN"].iter().map(|c| (c.to_string(), 0)).collect();
    for s in cluster.running() {
        let mut con = s.conn();
        let text: String = redis::cmd("INFO").arg("errorstats").query(&mut con).unwrap();
        for (k, v) in parse_info(&text) {
            let Some(code) = k.strip_prefix("errorstat_") else { continue };
            let n: i64 =
                v.strip_prefix("count=").and_then(|v| v.split(',').next()).and_then(|v| v.parse().ok()).unwrap_or(0);
            if let Some(c) = out.get_mut(code) {
                *c += n;
            }
        }
    }
    out
}

#[test]
fn resharding_under_load_keeps_records_and_grants_each_claim_once() {
    let started = Instant::now();
    let cluster = Cluster::start();
    let topo = cluster.topology();
    let primaries = topo.primaries();
    let (src, dst) = (primaries[0].clone(), primaries[1].clone());
    // redis-cli takes a source's lowest slots first. 500 slots: the load
    // meets moved slots (MOVED) for the first half, then the hot slot's
    // migration (its ballast makes that long: ASK, TRYAGAIN), then more
    // moves. More slots add no case, only time (Valkey 8+ waits for the
    // replicas at each slot's SETSLOT: 1500 slots took 31 s there).
    let n_move = 500;
    let moving: Vec<u16> = src.slot_list()[..n_move].to_vec();
    let moving_set: HashSet<u16> = moving.iter().copied().collect();
    let tag_a = tag_where("mvA-", |s| moving_set.contains(&s));
    let tag_b = tag_where("mvB-", |s| moving_set.contains(&s) && s != key_slot(&tag_a));
    let hot = tag_where("hot-", |s| moving[n_move / 2..].contains(&s));
    let mut sc = cluster.conn(src.port);
    let mut sc2 = cluster.conn(src.port);
    let m = seed_moving_slots(&mut sc, &mut sc2, [tag_a, tag_b], hot.clone());

    // The load: a fixed key set over every slot, one key in 10 in the hot
    // slot (which moves while the load runs).
    let n_keys = 3000;
    let keys: Arc<Vec<String>> = Arc::new(
        (0..n_keys).map(|i| if i % 10 == 0 { format!("{{{hot}}}:load:{i}") } else { format!("load:{i}") }).collect(),
    );
    let load = Load::start(cluster.client(), keys.clone(), 3, 600.0);
    load.wait_progress(300, "before the reshard");

    let errors_before = error_stats(&cluster);
    let t = Instant::now();
    let out = reshard(src.port, &src.id, &dst.id, n_move, Duration::from_secs(60));
    eprintln!("reshard of {n_move} slots in {:?} ({} output lines)", t.elapsed(), out.lines().count());
    cluster.wait_stable("after the reshard");
    load.wait_progress(300, "after the reshard");
    let report = load.finish();
    let mut redirects = error_stats(&cluster);
    for (k, v) in &errors_before {
        *redirects.get_mut(k).unwrap() -= v;
    }
    eprintln!("redirects and errors the nodes answered during the reshard: {redirects:?}");
    eprintln!(
        "load: {} claims answered, {} granted, {} busy, transient errors {:?}, unknown outcome {}",
        report.ops,
        report.granted_count(),
        report.busy,
        report.transient,
        report.unknown.len()
    );

    // The slots moved.
    let after = cluster.topology();
    for &slot in &moving {
        assert_eq!(after.owner(slot).id, dst.id, "slot {slot} did not move");
    }
    let mut dc = cluster.conn(dst.port);
    moved_records_and_filters_are_intact(&mut sc, &mut dc, &m);
    each_claim_was_granted_once(&cluster, &mut dc, &m, &keys, &report, &redirects);
    eprintln!("resharding test: {:?}", started.elapsed());
}

/// What the reshard moves besides the load: ballast and a filter in the
/// hot slot, records in every state and filters in two more slots, with
/// snapshots of each taken before.
struct Moving {
    hot: String,
    hot_seen: String,
    ballast: i64,
    tags: [String; 2],
    fixtures: [Fixture; 2],
    records: Vec<String>,
    /// Each filter with the items to probe it with (added ones first).
    filters: Vec<(String, Vec<String>)>,
    rec_before: Vec<TimedSnap>,
    filt_before: Vec<FilterSnap>,
    count_before: Vec<i64>,
}

fn seed_moving_slots(
    sc: &mut redis::Connection,
    sc2: &mut redis::Connection,
    [tag_a, tag_b]: [String; 2],
    hot: String,
) -> Moving {
    // Ballast in the hot slot: its migration takes many MIGRATE batches,
    // while the load claims keys of that slot (ASK / TRYAGAIN for them).
    let ballast = 5000;
    let mut pipe = redis::pipe();
    for i in 0..ballast {
        pipe.cmd("IDEM.ONCE").arg(format!("{{{hot}}}:ballast:{i}")).arg(3600);
    }
    let ones: Vec<i64> = pipe.query(sc).expect("ballast");
    assert!(ones.iter().all(|&x| x == 1));
    // The load claims hot keys with BLOOM {hot}:seen; the filter moves too.
    let hot_seen = format!("{{{hot}}}:seen");
    let _: () = redis::cmd("IDEM.BF.RESERVE").arg(&hot_seen).arg(0.0001).arg(1000).query(sc).unwrap();
    let hot_items: Vec<String> = (0..100).map(|i| format!("{{{hot}}}:done:{i}")).collect();
    let _: Vec<i64> = redis::cmd("IDEM.BF.MADD").arg(&hot_seen).arg(&hot_items).query(sc).unwrap();

    // Records in every state and filters, in two slots that will move.
    let ((fx_a, filters_a, probe_a), (fx_b, filters_b, probe_b)) = std::thread::scope(|s| {
        let a = s.spawn(|| populate_tag(sc, &tag_a));
        let b = populate_tag(sc2, &tag_b);
        (a.join().unwrap(), b)
    });
    let mut records: Vec<String> = fx_a.keys.clone();
    records.extend(fx_b.keys.iter().cloned());
    records.push(format!("{{{tag_a}}}:bf-order"));
    records.push(format!("{{{tag_b}}}:bf-order"));
    // Each filter with the items to probe it with (added ones first).
    let filters: Vec<(String, Vec<String>)> = filters_a
        .iter()
        .map(|f| (f.clone(), probe_a.clone()))
        .chain(filters_b.iter().map(|f| (f.clone(), probe_b.clone())))
        .chain([(hot_seen.clone(), hot_items.iter().cloned().chain(["absent".to_string()]).collect())])
        .collect();
    let rec_before: Vec<TimedSnap> = records.iter().map(|k| timed_snapshot(sc, k)).collect();
    let filt_before: Vec<FilterSnap> = filters.iter().map(|(k, probe)| filter_snap(sc, k, probe)).collect();
    let count_before: Vec<i64> = [&tag_a, &tag_b]
        .iter()
        .map(|t| redis::cmd("CLUSTER").arg("COUNTKEYSINSLOT").arg(key_slot(t)).query(sc).unwrap())
        .collect();
    Moving {
        hot,
        hot_seen,
        ballast,
        tags: [tag_a, tag_b],
        fixtures: [fx_a, fx_b],
        records,
        filters,
        rec_before,
        filt_before,
        count_before,
    }
}

/// On the target: every key of the moved slots, every record and filter
/// as it was, the records' tokens still working.
fn moved_records_and_filters_are_intact(sc: &mut redis::Connection, dc: &mut redis::Connection, m: &Moving) {
    let Moving {
        hot_seen,
        tags: [tag_a, tag_b],
        fixtures: [fx_a, fx_b],
        records,
        filters,
        rec_before,
        filt_before,
        count_before,
        ..
    } = m;
    for (t, n) in [&tag_a, &tag_b].iter().zip(count_before.iter()) {
        let slot = key_slot(t);
        let on_src: i64 = redis::cmd("CLUSTER").arg("COUNTKEYSINSLOT").arg(slot).query(sc).unwrap();
        let on_dst: i64 = redis::cmd("CLUSTER").arg("COUNTKEYSINSLOT").arg(slot).query(dc).unwrap();
        assert_eq!((on_src, on_dst), (0, *n), "keys of slot {slot} on source / target");
    }

    // Every record and filter is intact on the target.
    let tol_ms = 300;
    let expiry_slack_ms = 2000;
    let mut expiry_shift = Vec::new();
    for (b, key) in rec_before.iter().zip(records.iter()) {
        let a = timed_snapshot(dc, key);
        assert_same_moved_record(b, &a, tol_ms, expiry_slack_ms, "after the reshard");
        expiry_shift.push(a.snap.pexpiretime - b.snap.pexpiretime);
    }
    for (b, (key, probe)) in filt_before.iter().zip(filters.iter()) {
        let a = filter_snap(dc, key, probe);
        assert_same_moved_filter(b, &a, expiry_slack_ms, "after the reshard");
        expiry_shift.push(a.pexpiretime - b.pexpiretime);
    }
    eprintln!(
        "PEXPIRETIME shift by MIGRATE: {} to {} ms",
        expiry_shift.iter().min().unwrap(),
        expiry_shift.iter().max().unwrap()
    );
    for (i, b) in filt_before.iter().enumerate() {
        // Every added item is there (no false negatives), before and after.
        let n = filters[i].1.len();
        let added = if filters[i].0.ends_with(":auto") {
            n - 1..n
        } else if filters[i].0 == *hot_seen {
            0..n - 1
        } else {
            0..200
        };
        assert!(b.answers[added].iter().all(|&x| x == 1), "{}: an added item is missing", b.key);
    }
    // The tokens still work on the target.
    check_fixture_tokens(dc, fx_a, |k| k.to_string());
    check_fixture_tokens(dc, fx_b, |k| k.to_string());
}

/// No claim of the load was granted twice, every record of the load is its
/// one grant, and the load met moved and migrating slots.
fn each_claim_was_granted_once(
    cluster: &Cluster,
    dc: &mut redis::Connection,
    m: &Moving,
    keys: &[String],
    report: &LoadReport,
    redirects: &BTreeMap<String, i64>,
) {
    let (hot, ballast) = (&m.hot, m.ballast);
    // No claim was granted twice, and every record of the load is its one grant.
    assert!(report.unexpected.is_empty(), "unexpected replies: {:?}", report.unexpected);
    let twice = report.granted_twice();
    assert!(twice.is_empty(), "{} keys granted more than once, e.g. {:?}", twice.len(), &twice[..twice.len().min(5)]);
    for (idx, grants) in &report.grants {
        let g = &grants[0];
        // SEEN: a false positive of {hot}:seen (rate 0.0001), still a grant.
        assert!(g.status == "NEW" || (g.status == "SEEN" && keys[*idx].starts_with('{')), "{}: {g:?}", keys[*idx]);
        assert_eq!(g.attempt, 1, "{}: {g:?}", keys[*idx]);
    }
    let mut cc = cluster.cluster_conn();
    let mut hot_granted = 0;
    for (idx, key) in keys.iter().enumerate() {
        let f = fields_from_reply(cq(&mut cc, "IDEM.GET", key).unwrap());
        let granted = report.grants.get(&idx);
        match (&f, granted) {
            (Some(f), _) => {
                assert!(
                    granted.is_some() || report.unknown.contains(&idx),
                    "{key} has a record nobody was granted: {f:?}"
                );
                assert_eq!((f_str(f, "state").as_str(), f_int(f, "attempt")), ("processing", 1), "{key}");
                if key.starts_with('{') {
                    hot_granted += 1;
                }
            }
            (None, Some(g)) => panic!("{key} was granted ({g:?}) but has no record"),
            (None, None) => {}
        }
    }
    assert!(hot_granted > 50, "only {hot_granted} keys of the moving hot slot were claimed");
    let hot_on_dst: i64 = redis::cmd("CLUSTER").arg("COUNTKEYSINSLOT").arg(key_slot(hot)).query(dc).unwrap();
    assert_eq!(hot_on_dst, ballast + 1 + hot_granted, "keys of the hot slot on the target (ballast, filter, load)");
    for i in (0..ballast).step_by(97) {
        let key = format!("{{{hot}}}:ballast:{i}");
        let (s, v, a) = claim(dc, &key, 60);
        assert_eq!((s.as_str(), v, a), ("DONE", Value::Nil, 0), "{key}");
    }
    assert!(redirects["MOVED"] > 0, "the load never met a moved slot");
    assert!(redirects["ASK"] + redirects["TRYAGAIN"] > 0, "the load never met a slot being migrated");
}

/// What one shard holds before the failovers: records in every state and
/// acknowledged claims, each with its token.
struct ShardFixture {
    tag: String,
    fx: Fixture,
    /// `{tag}:ack:<j>` → token; j % 4: 0 done (with RESULT and BLOOM),
    /// 1 left processing (DONE after), 2 (EXTEND after), 3 (RELEASE after).
    acks: Vec<(String, String)>,
    before: Vec<TimedSnap>,
}

const ACKS: usize = 24;

fn populate_shard(con: &mut redis::Connection, tag: String) -> ShardFixture {
    let fx = populate(con, &format!("{{{tag}}}:"));
    let seen = format!("{{{tag}}}:seen");
    let mut acks = Vec::new();
    for j in 0..ACKS {
        let key = format!("{{{tag}}}:ack:{j}");
        let t = claim_new(con, &key, 600);
        if j % 4 == 0 {
            assert_eq!(done(con, &key, &t, ("RESULT", format!("result-{j}"), "BLOOM", &seen)), Ok(1));
        }
        acks.push((key, t));
    }
    wait_replica(con, &format!("shard {tag}"));
    let mut keys = fx.keys.clone();
    keys.extend(acks.iter().map(|(k, _)| k.clone()));
    let before = keys.iter().map(|k| timed_snapshot(con, k)).collect();
    ShardFixture { tag, fx, acks, before }
}

/// On the shard's (new) primary: the records are the acknowledged ones, and
/// every token issued before works.
fn check_shard(con: &mut redis::Connection, sf: &ShardFixture, what: &str) {
    // Replication carries absolute times: PEXPIRETIME exact.
    for b in &sf.before {
        let a = timed_snapshot(con, &b.snap.key);
        assert_same_moved_record(b, &a, 300, 0, what);
        assert_eq!(b.snap.pexpiretime, a.snap.pexpiretime, "{what}: PEXPIRETIME of {}", b.snap.key);
    }
    check_fixture_tokens(con, &sf.fx, |k| k.to_string());
    let seen = format!("{{{}}}:seen", sf.tag);
    for (j, (key, t)) in sf.acks.iter().enumerate() {
        match j % 4 {
            0 => {
                let (s, v, a) = claim(con, key, 60);
                assert_eq!(
                    (s, v, a),
                    ("DONE".into(), Value::BulkString(format!("result-{j}").into_bytes()), 1),
                    "{what}: {key}"
                );
                let hit: i64 = redis::cmd("IDEM.BF.EXISTS").arg(&seen).arg(key).query(con).unwrap();
                assert_eq!(hit, 1, "{what}: {seen} has {key}");
                assert_eq!(done(con, key, t, NONE), Ok(0), "{what}: {key} already done");
            }
            1 => assert_eq!(done(con, key, t, ("RESULT", "after-failover")), Ok(1), "{what}: DONE {key}"),
            2 => {
                assert_eq!(extend(con, key, t, 900), Ok(1), "{what}: EXTEND {key}");
                let f = get_fields(con, key);
                assert!(f_int(&f, "lease_ms") > 890_000, "{what}: {key} extended: {f:?}");
                assert_eq!(done(con, key, t, NONE), Ok(1), "{what}: DONE {key} after EXTEND");
            }
            _ => {
                assert_eq!(release(con, key, t), 1, "{what}: RELEASE {key}");
                let (s, v, a) = claim(con, key, 60);
                assert_eq!((s.as_str(), a), ("RETRY", 2), "{what}: {key}");
                assert_ne!(&as_token(&v), t);
                assert!(done(con, key, t, NONE).unwrap_err().starts_with("STALE"), "{what}: {key} old token");
            }
        }
    }
}

/// Waits until the node on `port` is a primary in every node's view.
fn wait_primary(cluster: &Cluster, port: u16, what: &str) {
    wait_until(what, Duration::from_secs(60), || {
        cluster.running().all(|s| {
            let mut con = s.conn();
            let text: String = redis::cmd("CLUSTER").arg("NODES").query(&mut con).unwrap_or_default();
            Topology::parse(&text).nodes.iter().any(|n| n.port == port && n.primary && !n.slots.is_empty())
        })
    });
    cluster.wait_stable(what);
}

#[test]
fn failover_under_load_keeps_acknowledged_tokens() {
    let started = Instant::now();
    let mut cluster = Cluster::start();
    let topo = cluster.topology();
    let primaries: Vec<NodeInfo> = topo.primaries().into_iter().cloned().collect();
    let replicas: Vec<u16> = primaries.iter().map(|p| topo.replicas_of(&p.id)[0].port).collect();

    // Every shard: records in every state, acknowledged by its replica.
    let shards: Vec<ShardFixture> = std::thread::scope(|s| {
        let handles: Vec<_> = primaries
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let tag = tag_where(&format!("fo{i}-"), |slot| p.owns(slot));
                let mut con = cluster.conn(p.port);
                s.spawn(move || populate_shard(&mut con, tag))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });

    let n_keys = 2000;
    let keys: Arc<Vec<String>> = Arc::new((0..n_keys).map(|i| format!("load:{i}")).collect());
    let load = Load::start(cluster.client(), keys.clone(), 3, 400.0);
    load.wait_progress(300, "before the failovers");

    // 1. A manual failover: shard 0's replica takes over.
    let t = Instant::now();
    let mut rc = cluster.conn(replicas[0]);
    let _: () = redis::cmd("CLUSTER").arg("FAILOVER").query(&mut rc).expect("CLUSTER FAILOVER");
    wait_primary(&cluster, replicas[0], "shard 0's replica promoted by CLUSTER FAILOVER");
    eprintln!("manual failover in {:?}", t.elapsed());
    load.wait_progress(300, "after the manual failover");

    // 2. Shard 1's primary dies (SIGKILL): its replica is elected.
    let t = Instant::now();
    kill9(cluster.server_mut(primaries[1].port));
    wait_primary(&cluster, replicas[1], "shard 1's replica promoted after its primary was killed");
    eprintln!("failover after kill -9 in {:?}", t.elapsed());
    load.wait_progress(300, "after the kill");
    let report = load.finish();
    eprintln!(
        "load: {} claims answered, {} granted, {} busy, transient errors {:?}, unknown outcome {}",
        report.ops,
        report.granted_count(),
        report.busy,
        report.transient,
        report.unknown.len()
    );

    // The new primaries hold the acknowledged records; the old tokens work.
    let new_primaries = [replicas[0], replicas[1], primaries[2].port];
    let now = cluster.topology();
    for (sf, port) in shards.iter().zip(new_primaries) {
        assert_eq!(now.owner(key_slot(&sf.tag)).port, port, "owner of {{{}}}", sf.tag);
        let mut con = cluster.conn(port);
        check_shard(&mut con, sf, &format!("shard {{{}}} on {port}", sf.tag));
        wait_replica_if_any(&cluster, &mut con, port);
    }

    // No claim granted twice, except where a primary died before its
    // replica had the claim (asynchronous replication: shard 1's slots).
    assert!(report.unexpected.is_empty(), "unexpected replies: {:?}", report.unexpected);
    let killed = &primaries[1];
    let (lost, twice): (Vec<_>, Vec<_>) =
        report.granted_twice().into_iter().partition(|(idx, _)| killed.owns(key_slot(&keys[*idx])));
    assert!(twice.is_empty(), "{} keys granted more than once, e.g. {:?}", twice.len(), &twice[..twice.len().min(5)]);
    eprintln!("keys granted again after the kill -9 (unacknowledged claims lost with the primary): {}", lost.len());
    let mut cc = cluster.cluster_conn();
    let mut lost_records = 0;
    for (idx, grants) in &report.grants {
        let key = &keys[*idx];
        assert!(grants.iter().all(|g| g.status == "NEW" && g.attempt == 1), "{key}: {grants:?}");
        match fields_from_reply(cq(&mut cc, "IDEM.GET", key).unwrap()) {
            Some(f) => assert_eq!((f_str(&f, "state").as_str(), f_int(&f, "attempt")), ("processing", 1), "{key}"),
            None if killed.owns(key_slot(key)) => lost_records += 1,
            None => panic!("{key} was granted ({grants:?}) but has no record"),
        }
    }
    eprintln!("granted claims whose record died with the killed primary (never claimed again): {lost_records}");
    // The cluster takes writes on every shard.
    for i in 0..30 {
        cclaim_new(&mut cc, &format!("after:{i}"), 60, &[]);
    }

    // 3. The killed node comes back (from its AOF) and rejoins as a replica
    // of the node that replaced it, which syncs it.
    let t = Instant::now();
    cluster.server_mut(primaries[1].port).start_again();
    cluster.wait_stable("the killed node rejoined");
    let back = cluster.topology();
    let node = back.by_port(primaries[1].port);
    assert!(!node.primary, "the old primary came back as a replica: {node:?}");
    assert_eq!(back.by_port(replicas[1]).id, node.master_id.clone().unwrap());
    eprintln!("rejoined in {:?}", t.elapsed());
    let mut pc = cluster.conn(replicas[1]);
    let mut oc = cluster.conn(primaries[1].port);
    let _: () = redis::cmd("READONLY").query(&mut oc).unwrap();
    let sf = &shards[1];
    let keys1: Vec<&str> = sf.before.iter().map(|s| s.snap.key.as_str()).collect();
    assert_same_records(&snapshot_all(&mut pc, &keys1), &snapshot_all(&mut oc, &keys1), 2000, "rejoined replica");
    eprintln!("failover test: {:?}", started.elapsed());
}

/// `WAIT 1` on a primary's connection when it has a running replica (so
/// later comparisons see the check's writes there too).
fn wait_replica_if_any(cluster: &Cluster, con: &mut redis::Connection, port: u16) {
    let topo = cluster.topology();
    let id = topo.by_port(port).id.clone();
    if topo.replicas_of(&id).iter().any(|r| !r.down) {
        wait_replica(con, &format!("primary {port}"));
    }
}

#[test]
fn bloom_option_is_crossslot_in_cluster_mode() {
    let mut s = Server::start_cluster_node();
    let mut con = s.conn();
    let cross = |con: &mut redis::Connection, name: &str, args: &[&str]| {
        let e = expect_err(con, name, args);
        assert!(e.starts_with("CROSSSLOT"), "{name} {args:?}: {e}");
    };
    cross(&mut con, "IDEM.CLAIM", &["{a}k", "10", "BLOOM", "{b}f"]);
    cross(&mut con, "IDEM.CLAIM", &["{a}k", "10", "PAYLOAD", "BLOOM", "BLOOM", "{b}f"]);
    cross(&mut con, "IDEM.CLAIM", &["{a}k", "10", "MAXTRIES", "3", "bloom", "{b}f"]);
    assert!(!exists(&mut con, "{a}k"), "a CROSSSLOT claim created the record");
    let tok = claim_new_opts(&mut con, "{a}k", 10, &["BLOOM", "{a}f"]);
    cross(&mut con, "IDEM.DONE", &["{a}k", tok.as_str(), "BLOOM", "{b}f"]);
    cross(&mut con, "IDEM.DONE", &["{a}k", tok.as_str(), "RESULT", "BLOOM", "BLOOM", "{b}f"]);
    assert_eq!(f_str(&get_fields(&mut con, "{a}k"), "state"), "processing");
    assert!(!exists(&mut con, "{b}f"));
    // The word BLOOM as a value is no option: no second key, no CROSSSLOT.
    claim_new_opts(&mut con, "{a}k2", 10, &["PAYLOAD", "BLOOM"]);
    claim_new_opts(&mut con, "{a}k3", 10, &["PAYLOAD", "BLOOM", "BLOOM", "{a}f"]);
    assert_eq!(done(&mut con, "{a}k", &tok, ("RESULT", "BLOOM", "BLOOM", "{a}f")), Ok(1));
    assert_eq!(bf_exists(&mut con, "{a}f", "{a}k"), 1);
    // The filter commands themselves work in cluster mode.
    assert_eq!(bf_madd(&mut con, "{b}f", &["x", "y"]), vec![1, 1]);
    s.assert_alive();
}
