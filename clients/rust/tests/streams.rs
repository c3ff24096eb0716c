//! The Redis Streams consumers (feature `streams`) against a real server,
//! on the suite's edition: what brokers/scenario.py cannot see from outside
//! (DONE and XACK in one round trip, the entry put back when DONE did not
//! complete the record, Busy left pending with its delay as idle time, the
//! heartbeat keeping an entry at work from XAUTOCLAIM, dead letters), and
//! the tokio consumer, which the scenario does not run.
mod common;
mod proxy;

use common::*;
use redis_idem_client::streams::{Action, AsyncStreamConsumer, Settled, StreamConsumer, StreamEntry, StreamOptions};
use redis_idem_client::{AsyncIdem, ClaimOptions, Idem, Job, Options};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

type Work = Result<String, String>;

fn xadd(server: &Server, stream: &str, fields: &[(&str, &str)]) -> String {
    let mut cmd = redis::cmd("XADD");
    cmd.arg(stream).arg("*");
    for (name, value) in fields {
        cmd.arg(*name).arg(*value);
    }
    cmd.query(&mut server.conn()).unwrap()
}

fn group(server: &Server, stream: &str) {
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(stream)
        .arg("g")
        .arg("0")
        .arg("MKSTREAM")
        .query(&mut server.conn())
        .unwrap();
}

/// The group's pending entries: `(id, consumer, idle ms, deliveries)`.
fn pending(server: &Server, stream: &str) -> Vec<(String, String, u64, u64)> {
    redis::cmd("XPENDING").arg(stream).arg("g").arg("-").arg("+").arg(100).query(&mut server.conn()).unwrap()
}

/// The dead letters: each one's fields.
fn dead_letters(server: &Server, stream: &str) -> Vec<Vec<(String, String)>> {
    let entries: Vec<(String, Vec<(String, String)>)> =
        redis::cmd("XRANGE").arg(format!("{stream}:dlq")).arg("-").arg("+").query(&mut server.conn()).unwrap();
    entries.into_iter().map(|(_, fields)| fields).collect()
}

fn options(lease_s: u64) -> Options {
    Options::new().lease(Duration::from_secs(lease_s)).wait(Duration::ZERO)
}

/// Polls until `enough` holds of everything settled so far (30 s at most).
fn poll_until<S: redis_idem_client::ConnectionSource>(
    consumer: &StreamConsumer<'_, S>,
    mut work: impl FnMut(&StreamEntry, &Job) -> Work,
    enough: impl Fn(&[Settled]) -> bool,
) -> Vec<Settled> {
    let (mut all, deadline) = (Vec::new(), Instant::now() + Duration::from_secs(30));
    while !enough(&all) {
        assert!(Instant::now() < deadline, "not settled in time: {all:?}");
        all.extend(consumer.poll(&mut work).unwrap());
    }
    all
}

#[test]
fn each_key_runs_once_and_its_xack_rides_with_done() {
    let server = Server::start();
    let proxy = proxy::Proxy::start(server.port);
    let idem = Idem::with_options(redis::Client::open(proxy.url()).unwrap(), options(5)).unwrap();
    group(&server, "orders");
    for key in ["a", "b", "a", "c"] {
        xadd(&server, "orders", &[("idem-key", key), ("body", &format!("pay {key}"))]);
    }
    let consumer = StreamConsumer::new(&idem, "orders", "g", StreamOptions::new().consumer("w1")).unwrap();
    proxy.record();
    let ran = Mutex::new(Vec::new());
    let settled = poll_until(
        &consumer,
        |entry, job| {
            ran.lock().unwrap().push((job.key().to_string(), entry.field_str("body").unwrap().to_string()));
            Ok(format!("paid {}", job.key()))
        },
        |s| s.len() == 4,
    );
    assert_eq!(ran.into_inner().unwrap().iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), ["a", "b", "c"]);
    let replays: Vec<bool> = settled
        .iter()
        .map(|s| match s.action {
            Action::Acknowledged { replayed } => replayed,
            ref other => panic!("acknowledged, not {other:?}"),
        })
        .collect();
    assert_eq!(replays, [false, false, true, false]);
    assert!(pending(&server, "orders").is_empty());
    let stats = consumer.stats();
    assert_eq!((stats.acknowledged, stats.held_back, stats.dead_lettered), (4, 0, 0));
    assert_eq!((stats.idem.first_runs, stats.idem.replays), (3, 1));
    // Each first run's XACK went in its DONE's write; a replay's alone.
    let chunks = proxy.recorded();
    let done = |c: &String| c.contains("idem.done\r\n") || c.contains("idem_done\r\n");
    let with_done = chunks.iter().filter(|c| done(c) && c.contains("xack")).count();
    let alone = chunks.iter().filter(|c| !done(c) && c.contains("xack")).count();
    assert_eq!((with_done, alone), (3, 1), "{chunks:?}");
}

#[test]
fn an_entry_without_a_key_is_dead_lettered_never_run() {
    let server = Server::start();
    let idem = Idem::with_options(server.client(), options(5)).unwrap();
    group(&server, "s1");
    let id = xadd(&server, "s1", &[("body", "no key")]);
    let consumer = StreamConsumer::new(&idem, "s1", "g", StreamOptions::new()).unwrap();
    let settled = poll_until(&consumer, |_, _| panic!("no key: the work must not run"), |s| !s.is_empty());
    assert_eq!((settled[0].action.clone(), settled[0].key.clone()), (Action::DeadLettered, None));
    let letters = dead_letters(&server, "s1");
    let field = |name: &str| letters[0].iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
    assert_eq!(
        (field("body"), field("original-stream"), field("original-id")),
        (Some("no key".into()), Some("s1".into()), Some(id))
    );
    assert!(field("error").unwrap().contains("no key"));
    assert!(pending(&server, "s1").is_empty());
}

#[test]
fn failures_come_again_after_their_delay_and_exhausted_goes_to_the_dead_letter() {
    let server = Server::start();
    let idem = Idem::with_options(server.client(), options(1).max_tries(2)).unwrap();
    group(&server, "s2");
    let id = xadd(&server, "s2", &[("idem-key", "poison"), ("body", "x")]);
    let consumer =
        StreamConsumer::new(&idem, "s2", "g", StreamOptions::new().block(Duration::from_millis(100))).unwrap();
    let tries = AtomicU32::new(0);
    let settled = poll_until(
        &consumer,
        |_, job| {
            tries.fetch_add(1, Ordering::SeqCst);
            Err(format!("attempt {} failed", job.attempt()))
        },
        |s| s.iter().any(|s| s.action == Action::DeadLettered),
    );
    // Two tries, each held back (100 ms, then 200 ms: never acknowledged), then dead.
    assert_eq!(tries.load(Ordering::SeqCst), 2);
    let delays: Vec<_> = settled
        .iter()
        .filter_map(|s| match s.action {
            Action::HeldBack { delay } => Some(delay),
            _ => None,
        })
        .collect();
    assert_eq!(delays, [Duration::from_millis(100), Duration::from_millis(200)]);
    assert!(settled[0].error.as_deref().unwrap().contains("attempt 1 failed"));
    let letters = dead_letters(&server, "s2");
    assert_eq!(letters.len(), 1);
    assert!(letters[0].contains(&("original-id".into(), id)));
    assert!(letters[0].iter().any(|(n, v)| n == "error" && v.contains("exhausted")));
    assert!(pending(&server, "s2").is_empty());
    assert_eq!(consumer.stats().dead_lettered, 1);
}

#[test]
fn a_payload_seen_with_another_content_is_dead_lettered() {
    let server = Server::start();
    let idem = Idem::with_options(server.client(), options(5)).unwrap();
    group(&server, "s3");
    xadd(&server, "s3", &[("idem-key", "k"), ("body", "one")]);
    xadd(&server, "s3", &[("idem-key", "k"), ("body", "two")]);
    let payload = StreamOptions::new().payload(|e| e.field("body").map(<[u8]>::to_vec));
    let consumer = StreamConsumer::new(&idem, "s3", "g", payload).unwrap();
    let settled = poll_until(&consumer, |_, _| Ok("done".into()), |s| s.len() == 2);
    assert_eq!(settled[0].action, Action::Acknowledged { replayed: false });
    assert_eq!(settled[1].action, Action::DeadLettered);
    assert!(dead_letters(&server, "s3")[0].iter().any(|(n, v)| n == "error" && v.contains("another payload")));
}

#[test]
fn busy_is_left_pending_and_comes_again_after_the_lease_left() {
    let server = Server::start();
    let idem = Idem::with_options(server.client(), options(3)).unwrap();
    group(&server, "s4");
    let id = xadd(&server, "s4", &[("idem-key", "held"), ("body", "x")]);
    // Another worker holds the key for 3 s.
    assert!(idem.claim("held", Duration::from_secs(3), &ClaimOptions::new()).unwrap().granted().is_some());
    let consumer = StreamConsumer::new(&idem, "s4", "g", StreamOptions::new()).unwrap();
    let settled = poll_until(&consumer, |_, _| panic!("busy: not run"), |s| !s.is_empty());
    let Action::HeldBack { delay } = settled[0].action else { panic!("held back, not {:?}", settled[0]) };
    assert!(delay > Duration::from_millis(1500) && delay <= Duration::from_secs(3), "{delay:?}");
    // Pending still, looking idle for claim_idle (3 s) less the lease left.
    let left = pending(&server, "s4");
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].0, id);
    let idle = Duration::from_millis(left[0].2);
    assert!(idle + delay >= Duration::from_millis(2900) && idle < Duration::from_millis(1500), "{idle:?}");
    // Once the holder's lease ends, XAUTOCLAIM hands it out again, and it runs.
    let settled = poll_until(
        &consumer,
        |_, job| Ok(format!("attempt {}", job.attempt())),
        |s| s.iter().any(|s| matches!(s.action, Action::Acknowledged { .. })),
    );
    assert_eq!(settled.last().unwrap().id, id);
    assert!(pending(&server, "s4").is_empty());
}

#[test]
fn an_entry_is_put_back_when_done_did_not_complete_its_record() {
    let server = Server::start();
    // No heartbeat: the lease of a slow work lapses, and another worker claims.
    let idem = Idem::with_options(server.client(), options(1).heartbeat(Duration::ZERO)).unwrap();
    let other = Idem::with_options(server.client(), options(30)).unwrap();
    group(&server, "s5");
    let id = xadd(&server, "s5", &[("idem-key", "slow"), ("body", "x")]);
    let consumer =
        StreamConsumer::new(&idem, "s5", "g", StreamOptions::new().claim_idle(Duration::from_secs(30))).unwrap();
    let settled = poll_until(
        &consumer,
        |_, _| {
            std::thread::sleep(Duration::from_millis(1300));
            let taken = other.claim("slow", Duration::from_secs(30), &ClaimOptions::new()).unwrap();
            assert!(taken.granted().is_some(), "{taken:?}");
            Ok("late".into())
        },
        |s| !s.is_empty(),
    );
    // DONE was refused (LeaseLost) though its XACK rode with it: pending again.
    assert!(matches!(settled[0].action, Action::HeldBack { .. }), "{settled:?}");
    assert!(settled[0].error.as_deref().unwrap().contains("lost"));
    assert_eq!(pending(&server, "s5").iter().map(|p| p.0.clone()).collect::<Vec<_>>(), [id]);
    assert_eq!(consumer.stats().idem.leases_lost, 1);
}

#[test]
fn a_done_whose_replies_are_lost_leaves_the_entry_pending() {
    let server = Server::start();
    let proxy = proxy::Proxy::start(server.port);
    let idem = Idem::with_options(redis::Client::open(proxy.url()).unwrap(), options(5).done_retries(1)).unwrap();
    group(&server, "s6");
    let id = xadd(&server, "s6", &[("idem-key", "k6"), ("body", "x")]);
    let consumer =
        StreamConsumer::new(&idem, "s6", "g", StreamOptions::new().claim_idle(Duration::from_secs(30))).unwrap();
    // Every DONE reaches the server (with its XACK), no reply comes back.
    proxy.arm("done", server.functions, true, None);
    let settled = poll_until(&consumer, |_, _| Ok("v".into()), |s| !s.is_empty());
    assert!(matches!(settled[0].action, Action::HeldBack { .. }), "{settled:?}");
    assert!(settled[0].error.as_deref().unwrap().contains("could not be confirmed"));
    assert_eq!(pending(&server, "s6").iter().map(|p| p.0.clone()).collect::<Vec<_>>(), std::slice::from_ref(&id));
    // Its redelivery replays, and acknowledges it.
    proxy.arm("done", server.functions, true, Some(0));
    let _: i64 = redis::cmd("XCLAIM")
        .arg("s6")
        .arg("g")
        .arg("w")
        .arg(0)
        .arg(&id)
        .arg("IDLE")
        .arg(60_000)
        .arg("JUSTID")
        .query(&mut server.conn())
        .map(|ids: Vec<String>| ids.len() as i64)
        .unwrap();
    let consumer = StreamConsumer::new(&idem, "s6", "g", StreamOptions::new()).unwrap();
    let settled = poll_until(&consumer, |_, _| panic!("done already"), |s| !s.is_empty());
    assert_eq!(settled[0].action, Action::Acknowledged { replayed: true });
    assert!(pending(&server, "s6").is_empty());
}

#[test]
fn the_heartbeat_keeps_an_entry_at_work_from_being_taken_over() {
    let server = Server::start();
    let idem = Idem::with_options(server.client(), options(1)).unwrap();
    group(&server, "s7");
    xadd(&server, "s7", &[("idem-key", "long"), ("body", "x")]);
    let worker = StreamConsumer::new(&idem, "s7", "g", StreamOptions::new().consumer("worker")).unwrap();
    let watcher_idem = Idem::with_options(server.client(), options(1)).unwrap();
    let watcher = StreamConsumer::new(
        &watcher_idem,
        "s7",
        "g",
        StreamOptions::new().consumer("watcher").block(Duration::from_millis(100)),
    )
    .unwrap();
    let watched = std::thread::scope(|scope| {
        let at_work = Arc::new(AtomicU32::new(0));
        let flag = at_work.clone();
        let watching = scope.spawn(move || {
            // Only once the worker has the entry: XREADGROUP must not hand
            // it to the watcher first (only XAUTOCLAIM could take it then).
            let (mut seen, deadline) = (Vec::new(), Instant::now() + Duration::from_secs(30));
            while flag.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            while flag.load(Ordering::SeqCst) == 1 && Instant::now() < deadline {
                seen.extend(watcher.poll(&mut |_: &StreamEntry, _: &Job| -> Work { Ok("taken".into()) }).unwrap());
            }
            seen
        });
        let settled = poll_until(
            &worker,
            |_, _| {
                at_work.store(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(3000));
                Ok("long work".into())
            },
            |s| !s.is_empty(),
        );
        at_work.store(2, Ordering::SeqCst);
        assert_eq!(settled[0].action, Action::Acknowledged { replayed: false });
        watching.join().unwrap()
    });
    assert!(watched.is_empty(), "the watcher took the entry in work: {watched:?}");
    assert!(pending(&server, "s7").is_empty());
}

#[test]
fn a_dead_consumers_entry_is_taken_over_after_claim_idle() {
    let server = Server::start();
    let idem = Idem::with_options(server.client(), options(1)).unwrap();
    group(&server, "s8");
    let id = xadd(&server, "s8", &[("idem-key", "orphan"), ("body", "x")]);
    // A consumer claimed its key, read it and died. (Claimed before the
    // read, so the entry's idle time starts after the lease: read first, a
    // loaded machine left the claim 100 ms behind, and the takeover found
    // it Busy for those 100 ms, held back as the Busy test shows.)
    idem.claim("orphan", Duration::from_secs(1), &ClaimOptions::new()).unwrap();
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("g")
        .arg("dead")
        .arg("STREAMS")
        .arg("s8")
        .arg(">")
        .query(&mut server.conn())
        .unwrap();
    let consumer =
        StreamConsumer::new(&idem, "s8", "g", StreamOptions::new().block(Duration::from_millis(200))).unwrap();
    let settled = poll_until(&consumer, |_, job| Ok(format!("{}", job.attempt())), |s| !s.is_empty());
    assert_eq!((settled[0].id.clone(), settled[0].action.clone()), (id, Action::Acknowledged { replayed: false }));
    assert_eq!(idem.get("orphan").unwrap().unwrap().attempt, 2);
}

#[test]
fn run_stops_on_its_flag_and_makes_the_group() {
    let server = Server::start();
    let idem = Idem::with_options(server.client(), options(5)).unwrap();
    let consumer =
        StreamConsumer::new(&idem, "s9", "g", StreamOptions::new().block(Duration::from_millis(100))).unwrap();
    let stop = consumer.stop_flag();
    std::thread::scope(|scope| {
        let running = scope.spawn(|| {
            consumer.run(|_, job: &Job| -> Work {
                if job.key() == "last" {
                    stop.store(true, Ordering::SeqCst);
                }
                Ok("ok".into())
            })
        });
        // The group appears (XGROUP CREATE ... MKSTREAM), then entries come.
        eventually(Duration::from_secs(10), "the group", || {
            redis::cmd("XINFO")
                .arg("GROUPS")
                .arg("s9")
                .query::<redis::Value>(&mut server.conn())
                .is_ok_and(|v| v != redis::Value::Array(vec![]))
        });
        for key in ["one", "two", "last"] {
            xadd(&server, "s9", &[("idem-key", key)]);
        }
        running.join().unwrap().unwrap();
    });
    assert_eq!(consumer.stats().acknowledged, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tokio_consumer_works_concurrently_and_settles_like_the_sync_one() {
    let server = Server::start();
    let idem = AsyncIdem::with_options(server.client(), options(2).max_tries(1)).await.unwrap();
    group(&server, "t1");
    for i in 0..20 {
        xadd(&server, "t1", &[("idem-key", &format!("k{}", i % 10)), ("body", if i == 7 { "fail" } else { "ok" })]);
    }
    xadd(&server, "t1", &[("body", "no key")]);
    let consumer = Arc::new(
        AsyncStreamConsumer::new(
            idem,
            "t1",
            "g",
            StreamOptions::new().concurrency(4).block(Duration::from_millis(100)),
        )
        .unwrap(),
    );
    let (at_once, most) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let (a, m) = (at_once.clone(), most.clone());
    let running = tokio::spawn({
        let consumer = consumer.clone();
        async move {
            consumer
                .run(move |entry: StreamEntry, _job: Job| {
                    let (a, m) = (a.clone(), m.clone());
                    async move {
                        m.fetch_max(a.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        a.fetch_sub(1, Ordering::SeqCst);
                        match entry.field_str("body") {
                            Some("fail") => Err("refused".to_string()),
                            _ => Ok(entry.id().to_string()),
                        }
                    }
                })
                .await
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    // 19 acknowledged (k7's copy replays k7's... no: k7 failed with max_tries 1, so both of its entries die).
    while consumer.stats().acknowledged + consumer.stats().dead_lettered < 21 {
        assert!(Instant::now() < deadline, "{:?}", consumer.stats());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    consumer.stop();
    running.await.unwrap().unwrap();
    let stats = consumer.stats();
    assert_eq!((stats.acknowledged, stats.dead_lettered), (18, 3), "{stats:?}");
    assert!(most.load(Ordering::SeqCst) > 1, "the work ran one at a time");
    assert!(most.load(Ordering::SeqCst) <= 4);
    assert!(pending(&server, "t1").is_empty());
    assert_eq!(dead_letters(&server, "t1").len(), 3);
}
