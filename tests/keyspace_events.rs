//! Keyspace notifications (docs/commands.md, "Keyspace notifications"):
//! every write fires exactly one event of the module class on the key it
//! changed, filters' included; a command that changes nothing fires none.
//!
//! Each step runs its commands and then a `SET` on a marker key; the
//! events received before the marker's are exactly the step's, in order.
#[allow(dead_code)] // each test binary uses part of common/
mod common;

use common::clock::{align_to_boundary, sleep_until};
use common::commands::{bf_add, bf_info, claim, claim_new, claim_opts, done, extend, once, release, reserve};
use common::reply::{as_token, q};
use common::server::Server;
use redis::Value;
use std::time::Duration;

/// A subscriber to every keyspace event of db 0 (`KEA`: all classes, the
/// module class `d` included).
struct Events {
    ps: redis::PubSub<'static>,
    marks: usize,
}

impl Events {
    fn new(s: &Server, con: &mut redis::Connection) -> Events {
        let _: () = redis::cmd("CONFIG").arg("SET").arg("notify-keyspace-events").arg("KEA").query(con).unwrap();
        // Leaked: the subscription borrows its connection, and lives for
        // the test (dropping it would unsubscribe).
        let sub = Box::leak(Box::new(s.conn()));
        sub.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut ps = sub.as_pubsub();
        ps.psubscribe("__keyspace@0__:*").unwrap();
        Events { ps, marks: 0 }
    }

    /// The next event: (key, event).
    fn next(&mut self) -> (String, String) {
        let msg = self.ps.get_message().unwrap_or_else(|e| panic!("no keyspace event within 10 s: {e}"));
        let key = msg.get_channel_name().strip_prefix("__keyspace@0__:").unwrap().to_string();
        (key, msg.get_payload().unwrap())
    }

    /// Runs `step` on `con`, then returns the events fired up to the
    /// marker's.
    fn of(&mut self, con: &mut redis::Connection, step: impl FnOnce(&mut redis::Connection)) -> Vec<(String, String)> {
        step(con);
        self.marks += 1;
        let marker = format!("marker:{}", self.marks);
        let _: () = redis::cmd("SET").arg(&marker).arg(1).query(con).unwrap();
        let mut events = Vec::new();
        loop {
            let event = self.next();
            if event.0 == marker {
                assert_eq!(event.1, "set");
                return events;
            }
            events.push(event);
        }
    }
}

fn ev(key: &str, event: &str) -> (String, String) {
    (key.to_string(), event.to_string())
}

fn run(con: &mut redis::Connection, args: &[&str]) -> Value {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(con).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

#[test]
fn every_filter_write_fires_its_event() {
    let s = Server::start();
    let mut con = s.conn();
    let mut events = Events::new(&s, &mut con);
    let mut step = |con: &mut redis::Connection, args: &[&str]| events.of(con, |con| drop(run(con, args)));

    assert_eq!(step(&mut con, &["IDEM.BF.RESERVE", "f", "0.01", "100"]), [ev("f", "idem.bf.reserve")]);
    assert_eq!(step(&mut con, &["IDEM.BF.ADD", "f", "a"]), [ev("f", "idem.bf.add")]);
    // Already in the current shard: nothing changed, nothing fired.
    assert_eq!(step(&mut con, &["IDEM.BF.ADD", "f", "a"]), []);
    // One event for the call, however many items.
    assert_eq!(step(&mut con, &["IDEM.BF.MADD", "f", "b", "c", "a", "d"]), [ev("f", "idem.bf.add")]);
    assert_eq!(step(&mut con, &["IDEM.BF.MADD", "f", "a", "b"]), []);
    // An add that creates its filter fires the add, not a reserve.
    assert_eq!(step(&mut con, &["IDEM.BF.ADD", "g", "x"]), [ev("g", "idem.bf.add")]);
    assert_eq!(step(&mut con, &["IDEM.BF.MADD", "h", "x", "y"]), [ev("h", "idem.bf.add")]);
    // Reads and refused writes fire nothing.
    for read in [
        &["IDEM.BF.EXISTS", "f", "a"][..],
        &["IDEM.BF.MEXISTS", "f", "a", "z"],
        &["IDEM.BF.INFO", "f"],
        &["IDEM.BF.EXISTS", "missing", "a"],
    ] {
        assert_eq!(step(&mut con, read), [], "{read:?}");
    }
    let refused = events.of(&mut con, |con| {
        assert!(q(con, "IDEM.BF.RESERVE", ("f", "0.01", 100)).is_err());
        assert!(q(con, "IDEM.BF.RESERVE", ("new", "2", 100)).is_err());
        assert!(q(con, "IDEM.BF.ADD", ("marker:1", "x")).is_err(), "WRONGTYPE");
    });
    assert_eq!(refused, []);
}

#[test]
fn every_record_write_fires_its_event_and_done_bloom_fires_the_filters() {
    let s = Server::start();
    let mut con = s.conn();
    let mut events = Events::new(&s, &mut con);

    let mut token = String::new();
    assert_eq!(events.of(&mut con, |con| token = claim_new(con, "r", 30)), [ev("r", "idem.claim")]);
    assert_eq!(events.of(&mut con, |con| assert_eq!(claim(con, "r", 30).0, "BUSY")), []);
    assert_eq!(events.of(&mut con, |con| assert_eq!(extend(con, "r", &token, 60), Ok(1))), [ev("r", "idem.extend")]);
    assert_eq!(events.of(&mut con, |con| assert_eq!(release(con, "r", &token), 1)), [ev("r", "idem.release")]);
    assert_eq!(events.of(&mut con, |con| assert_eq!(release(con, "r", &token), 0)), []);
    let mut retry = String::new();
    let fired = events.of(&mut con, |con| {
        let (status, value, _) = claim(con, "r", 30);
        assert_eq!(status, "RETRY");
        retry = as_token(&value);
    });
    assert_eq!(fired, [ev("r", "idem.claim")]);

    // The record's event, then the filter's (created by the add).
    let fired = events.of(&mut con, |con| assert_eq!(done(con, "r", &retry, ("BLOOM", "seen")), Ok(1)));
    assert_eq!(fired, [ev("r", "idem.done"), ev("seen", "idem.bf.add")]);
    assert_eq!(events.of(&mut con, |con| assert_eq!(done(con, "r", &retry, ("BLOOM", "seen")), Ok(0))), []);
    // A second record into the same, existing filter.
    let mut t2 = String::new();
    assert_eq!(events.of(&mut con, |con| t2 = claim_new(con, "r2", 30)), [ev("r2", "idem.claim")]);
    let fired = events.of(&mut con, |con| assert_eq!(done(con, "r2", &t2, ("BLOOM", "seen")), Ok(1)));
    assert_eq!(fired, [ev("r2", "idem.done"), ev("seen", "idem.bf.add")]);
    // CLAIM ... BLOOM only reads the filter.
    let fired = events.of(&mut con, |con| assert_eq!(claim_opts(con, "r", 30, &["BLOOM", "seen"]).0, "DONE"));
    assert_eq!(fired, []);

    assert_eq!(events.of(&mut con, |con| assert_eq!(once(con, "o", 60), 1)), [ev("o", "idem.done")]);
    assert_eq!(events.of(&mut con, |con| assert_eq!(once(con, "o", 60), 0)), []);

    // IDEM.REQUEUE: an event when it gave the work back, none otherwise.
    let requeue = |con: &mut redis::Connection, key: &str| q(con, "IDEM.REQUEUE", key).map_err(|e| e.to_string());
    assert_eq!(events.of(&mut con, |con| assert_eq!(requeue(con, "o"), Ok(Value::Int(1)))), [ev("o", "idem.requeue")]);
    assert_eq!(events.of(&mut con, |con| assert_eq!(requeue(con, "absent"), Ok(Value::Int(0)))), []);
    assert_eq!(events.of(&mut con, |con| drop(claim_new(con, "live", 30))), [ev("live", "idem.claim")]);
    assert_eq!(events.of(&mut con, |con| assert!(requeue(con, "live").is_err())), []);
}

/// The background sweeper's drop of an idle filter's old shard is a write:
/// it fires `idem.bf.drop`, before the key expires.
#[test]
fn the_sweepers_drop_fires_idem_bf_drop() {
    let s = Server::start();
    let mut con = s.conn();
    let mut events = Events::new(&s, &mut con);
    let start = align_to_boundary(&mut con, 1000, 20) / 1000;
    let fired = events.of(&mut con, |con| {
        reserve(con, "sweep", "0.01", 100, &["WINDOW", "4", "SHARD", "1"]);
        assert_eq!(bf_add(con, "sweep", "old"), 1);
    });
    assert_eq!(fired, [ev("sweep", "idem.bf.reserve"), ev("sweep", "idem.bf.add")]);
    sleep_until(&mut con, (start + 2) * 1000 + 20);
    assert_eq!(events.of(&mut con, |con| assert_eq!(bf_add(con, "sweep", "new"), 1)), [ev("sweep", "idem.bf.add")]);
    assert_eq!(bf_info(&mut con, "sweep").shards.len(), 2);
    // "old"'s shard leaves at start + 4; the key expires at start + 6. Nobody
    // touches the key: only the sweeper can drop the shard.
    assert_eq!(events.next(), ev("sweep", "idem.bf.drop"), "the first event after the adds");
    assert_eq!(bf_info(&mut con, "sweep").shards.len(), 1);
    // Then the key's own expiry, as for any key.
    assert_eq!(events.next(), ev("sweep", "expired"));
}
