//! Hostile input and limits: corrupt DUMP payloads restored with the
//! checksum check off, a full maxmemory, and the warning about eviction
//! policies that can drop records.
mod common;

use common::*;
use redis::{RedisResult, Value};

/// A small deterministic generator: the same flips on every run.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn dump(con: &mut redis::Connection, key: &str) -> Vec<u8> {
    redis::cmd("DUMP").arg(key).query(con).expect("DUMP")
}

fn digest(con: &mut redis::Connection, key: &str) -> String {
    redis::cmd("DEBUG").arg("DIGEST-VALUE").arg(key).query::<Vec<String>>(con).unwrap().remove(0)
}

/// Uses a key that a corrupt payload produced, in every way a client
/// could; errors are fine, a crash is not.
fn exercise(con: &mut redis::Connection, key: &str) {
    for args in [
        vec!["IDEM.GET", key],
        vec!["IDEM.CLAIM", key, "10"],
        vec!["IDEM.DONE", key, "00000000000000000000000000000000"],
        vec!["IDEM.BF.INFO", key],
        vec!["IDEM.BF.MEXISTS", key, "a", "b"],
        vec!["IDEM.BF.MADD", key, "a", "b"],
        vec!["MEMORY", "USAGE", key],
        vec!["DEBUG", "DIGEST-VALUE", key],
        vec!["DUMP", key],
        vec!["COPY", key, "copy-of-corrupt", "REPLACE"],
    ] {
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        let _: RedisResult<Value> = cmd.query(con);
    }
}

#[test]
fn thousands_of_corrupt_payloads_are_refused_or_load_as_usable_values() {
    let mut server = Server::start();
    let mut con = server.conn();
    let token = claim_new_opts(&mut con, "processing", 600, &["PAYLOAD", "body"]);
    let done_token = claim_new(&mut con, "done", 600);
    assert_eq!(done(&mut con, "done", &done_token, ("RESULT", "the result")), Ok(1));
    let _: () =
        redis::cmd("IDEM.BF.RESERVE").arg("filter").arg(0.01).arg(200).arg("WINDOW").arg(3).query(&mut con).unwrap();
    let items: Vec<String> = (0..300).map(|n| format!("item:{n}")).collect();
    let _: Vec<i64> = redis::cmd("IDEM.BF.MADD").arg("filter").arg(&items).query(&mut con).unwrap();
    let originals: Vec<(&str, Vec<u8>, String)> = ["processing", "done", "filter"]
        .into_iter()
        .map(|key| (key, dump(&mut con, key), digest(&mut con, key)))
        .collect();
    let _: () = redis::cmd("DEBUG").arg("SET-SKIP-CHECKSUM-VALIDATION").arg(1).query(&mut con).unwrap();

    let mut rng = Lcg(0x1de4);
    let (mut refused, mut accepted) = (0, 0);
    for round in 0..3000 {
        let (_, payload, _) = &originals[round % originals.len()];
        let mut corrupt = payload.clone();
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(corrupt.len());
            corrupt[at] = rng.next() as u8;
        }
        if rng.below(10) == 0 {
            corrupt.truncate(rng.below(corrupt.len()));
        }
        let restored: RedisResult<()> =
            redis::cmd("RESTORE").arg("corrupt").arg(0).arg(corrupt).arg("REPLACE").query(&mut con);
        match restored {
            Ok(()) => {
                accepted += 1;
                exercise(&mut con, "corrupt");
            }
            Err(_) => refused += 1,
        }
        if round % 500 == 0 {
            server.assert_alive();
        }
    }
    server.assert_alive();
    assert!(refused > 1000, "most corrupt payloads are refused: {refused} refused, {accepted} accepted");
    // The originals are untouched by all this.
    for (key, payload, original_digest) in &originals {
        assert_eq!(&digest(&mut con, key), original_digest, "{key}");
        assert_eq!(&dump(&mut con, key), payload, "{key}");
    }
    assert_eq!(done(&mut con, "processing", &token, ("RETAIN", 60)), Ok(1));
}

#[test]
fn a_full_maxmemory_refuses_writes_but_never_a_completion() {
    let mut server = Server::with_args(&[], &["--maxmemory-policy", "noeviction"]);
    let mut con = server.conn();
    let processing = claim_new(&mut con, "processing", 600);
    let finishing = claim_new(&mut con, "finishing", 600);
    let finishing_too = claim_new(&mut con, "finishing-too", 600);
    let _: i64 = redis::cmd("IDEM.BF.ADD").arg("filter").arg("old").query(&mut con).unwrap();
    let before_record = snapshot(&mut con, "processing");
    let before_filter = digest(&mut con, "filter");

    // Memory reached: data beyond a limit that noeviction cannot free.
    let filler = "x".repeat(10_000);
    for n in 0..300 {
        let _: () = redis::cmd("SET").arg(format!("fill:{n}")).arg(&filler).query(&mut con).unwrap();
    }
    let used: i64 = parse_info(&redis::cmd("INFO").arg("memory").query::<String>(&mut con).unwrap())["used_memory"]
        .parse()
        .unwrap();
    let _: () = redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg(used / 2).query(&mut con).unwrap();
    let e = redis::cmd("SET").arg("one-more").arg("x").query::<()>(&mut con).unwrap_err();
    assert!(err_text(&e).starts_with("OOM"), "{e}");

    let oom = |con: &mut redis::Connection, args: &[&str]| {
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        let e = cmd.query::<Value>(con).expect_err(&format!("{args:?} must be refused when memory is full"));
        assert!(err_text(&e).starts_with("OOM"), "{args:?}: {e}");
    };
    oom(&mut con, &["IDEM.CLAIM", "new", "60"]);
    oom(&mut con, &["IDEM.ONCE", "new", "60"]);
    oom(&mut con, &["IDEM.BF.ADD", "filter", "new"]);
    oom(&mut con, &["IDEM.BF.MADD", "filter", "a", "b"]);
    oom(&mut con, &["IDEM.BF.RESERVE", "other", "0.01", "1000"]);
    assert!(!exists(&mut con, "new"));
    assert!(!exists(&mut con, "other"));
    // Seconds pass while memory fills: the lease's time left may differ,
    // nothing else may.
    assert_same_record(&before_record, &snapshot(&mut con, "processing"), 60_000, "after OOM refusals");
    assert_eq!(digest(&mut con, "filter"), before_filter);

    // Finished work is still marked done: the RESULT is dropped (reply
    // 1 + 2); the filter add needs no memory, so it is made.
    assert_eq!(done(&mut con, "finishing", &finishing, ("RESULT", "r", "BLOOM", "filter")), Ok(3));
    let fields = get_fields(&mut con, "finishing");
    assert_eq!(f_str(&fields, "state"), "done");
    assert_eq!(f_bytes(&fields, "result"), None);
    let seen: i64 = redis::cmd("IDEM.BF.EXISTS").arg("filter").arg("finishing").query(&mut con).unwrap();
    assert_eq!(seen, 1);
    // A filter to create needs memory: its add is dropped (1 + 4).
    assert_eq!(done(&mut con, "finishing-too", &finishing_too, ("BLOOM", "new-filter")), Ok(5));
    assert_eq!(f_str(&get_fields(&mut con, "finishing-too"), "state"), "done");
    assert!(!exists(&mut con, "new-filter"));
    let counters = idem_counters(&mut con);
    assert_eq!((counters["done_result_dropped"], counters["done_bloom_dropped"]), (1, 1));
    assert!(server.log().contains("dropped the RESULT of a completed IDEM.DONE"), "{}", server.log_tail(20));

    // Reads, and writes that free memory, still work.
    let seen: i64 = redis::cmd("IDEM.BF.EXISTS").arg("filter").arg("old").query(&mut con).unwrap();
    assert_eq!(seen, 1);
    assert_eq!(f_str(&get_fields(&mut con, "processing"), "state"), "processing");
    assert_eq!(release(&mut con, "processing", &processing), 1);
    server.assert_alive();
}

#[test]
fn load_time_warning_when_the_eviction_policy_can_drop_records() {
    let risky = Server::with_args(&[], &["--maxmemory-policy", "volatile-lru"]);
    assert!(
        risky.log().contains("maxmemory-policy is volatile-lru"),
        "expected a warning in the log:\n{}",
        risky.log()
    );
    let safe = Server::with_args(&[], &["--maxmemory-policy", "noeviction"]);
    assert!(!safe.log().contains("maxmemory-policy is"), "no warning for noeviction:\n{}", safe.log());
}
