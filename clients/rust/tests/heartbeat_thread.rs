//! One heartbeat thread per `Idem`, not one per job (issue 37): alone in
//! its test binary, so that no other test's instances count.
mod common;

use common::*;
use redis_idem_client::*;
use std::time::Duration;

/// The heartbeat threads of this process (named redis-idem-heartbeat,
/// which /proc cuts to 15 bytes).
fn heartbeat_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim() == "redis-idem-hear")
        .count()
}

#[test]
fn one_heartbeat_thread_per_instance_whatever_the_jobs() {
    let server = Server::start();
    let options = Options::new().lease(Duration::from_secs(3)).heartbeat(Duration::from_millis(200));
    let idem = Idem::with_options(server.client(), options.clone()).unwrap();
    assert_eq!(heartbeat_threads(), 0, "none before a job");
    for n in 0..100 {
        idem.process(&format!("short:{n}"), |_: &Job| Ok::<_, String>(n)).unwrap();
    }
    // A new thread names itself once it runs: a moment after spawn returns.
    eventually(Duration::from_secs(5), "one for 100 jobs", || heartbeat_threads() == 1);
    // It extends a job that outlives `heartbeat`.
    idem.process("long", |_: &Job| {
        std::thread::sleep(Duration::from_millis(700));
        Ok::<_, String>(0)
    })
    .unwrap();
    assert!(idem.stats().extends >= 1, "{:?}", idem.stats());
    // Jobs running at once share it too.
    std::thread::scope(|scope| {
        for n in 0..8 {
            let idem = &idem;
            scope.spawn(move || idem.process(&format!("side:{n}"), |_: &Job| Ok::<_, String>(n)).unwrap());
        }
    });
    let other = Idem::with_options(server.client(), options).unwrap();
    other.process("other", |_: &Job| Ok::<_, String>(0)).unwrap();
    eventually(Duration::from_secs(5), "one per instance", || heartbeat_threads() == 2);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(heartbeat_threads(), 2, "one per instance, and no more");
    drop((idem, other));
    eventually(Duration::from_secs(5), "the threads end with their instances", || heartbeat_threads() == 0);
}
