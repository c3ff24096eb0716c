//! clients/conformance/cases.json, read at test time: every case that
//! applies to this library (its edition, its topology, its needs) run with
//! the sync `Idem` (and the cases that take no time with `AsyncIdem` too)
//! against real servers: the suite's edition (`REDIS_IDEM_EDITION`,
//! `REDIS_SERVER`) on one server, a 3-node cluster, a primary with a
//! replica, and a primary and replica under one Sentinel. Cases needing an
//! HTTP middleware are skipped (this library has none) and named in the
//! output.
#[path = "conformance/calls.rs"]
mod calls;
mod common;
mod proxy;
#[path = "conformance/topology.rs"]
mod topology;

use calls::{Call, Loop, Out};
use common::*;
use redis::ConnectionLike;
use redis_idem_client::*;
use serde_json::{Value as Json, json};
use std::collections::{HashMap, HashSet};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use topology::Servers;

/// What a call's work did.
#[derive(Default)]
struct Ran {
    started: AtomicBool,
    attempt: AtomicU64,
    lost_seen: AtomicBool,
    job_key: Mutex<Option<String>>,
}

#[derive(Default)]
struct Gates {
    open: Mutex<HashSet<String>>,
    changed: Condvar,
}

impl Gates {
    fn wait(&self, gate: &str) {
        let mut open = self.open.lock().unwrap();
        while !open.contains(gate) && !open.contains("*") {
            open = self.changed.wait_timeout(open, Duration::from_secs(30)).unwrap().0;
        }
    }
    fn open(&self, gate: &str) {
        self.open.lock().unwrap().insert(gate.to_string());
        self.changed.notify_all();
    }
}

/// The work a step describes.
fn work(spec: &Json, gates: &Gates, ran: &Ran, job: &Job) -> Result<Out, String> {
    ran.attempt.store(job.attempt(), Ordering::SeqCst);
    *ran.job_key.lock().unwrap() = Some(job.key().to_string());
    ran.started.store(true, Ordering::SeqCst);
    if let Some(gate) = spec["gate"].as_str() {
        gates.wait(gate);
        ran.lost_seen.store(job.lost(), Ordering::SeqCst);
    }
    if let Some(ms) = spec["sleep_ms"].as_u64() {
        std::thread::sleep(Duration::from_millis(ms));
    }
    if let Some(message) = spec["raise"].as_str() {
        return Err(message.to_string());
    }
    if spec["return_unserializable"].as_bool() == Some(true) {
        return Ok(Out::Unserializable([((1, 2), 3)].into()));
    }
    if let Some(n) = spec["return_bytes"].as_u64() {
        return Ok(Out::Json(Json::String("x".repeat(n as usize))));
    }
    Ok(Out::Json(spec["return"].clone()))
}

/// A value's Debug, cut short (a result may be a megabyte).
fn short(value: &impl std::fmt::Debug) -> String {
    let text = format!("{value:?}");
    if text.len() > 300 { format!("{}...", &text[..300]) } else { text }
}

fn error_name(e: &Error) -> &'static str {
    match e {
        Error::Busy { .. } => "Busy",
        Error::Mismatch { .. } => "Mismatch",
        Error::Exhausted { .. } => "Exhausted",
        Error::LeaseLost { .. } => "LeaseLost",
        Error::ResultNotStored { .. } => "ResultNotStored",
        Error::Hook { .. } => "Hook",
        Error::DoneUnconfirmed { .. } => "DoneUnconfirmed",
        Error::Stale(_) => "Stale",
        Error::WrongType(_) => "WrongType",
        Error::ResultTooLarge(_) => "ResultTooLarge",
        Error::ModuleRequired(_) => "ModuleRequired",
        Error::NotInstalled => "NotInstalled",
        Error::NotDurable { .. } => "NotDurable",
        Error::LiveLease(_) => "LiveLease",
        _ => "Other",
    }
}

/// Each hook's calls over a case.
type HookCalls = Arc<Mutex<HashMap<&'static str, u64>>>;

fn options(o: &Json, hooks_called: &HookCalls) -> Options {
    let ms = |name: &str| o[name].as_u64().map(Duration::from_millis);
    let mut options = Options::new();
    if let Some(owner) = o["owner"].as_str() {
        options = options.owner(owner);
    }
    if let Some(durable) = o.get("durable") {
        let replicas = durable["replicas"].as_u64().unwrap() as u32;
        let timeout = Duration::from_millis(durable["timeout_ms"].as_u64().unwrap_or(1000));
        options = options.durable(Durable::replicas(replicas).timeout(timeout).fsync(durable["fsync"] == true));
    }
    if let Some(lease) = ms("lease_ms") {
        options = options.lease(lease);
    }
    if let Some(wait) = ms("wait_ms") {
        options = options.wait(wait);
    }
    if let Some(every) = ms("heartbeat_ms") {
        options = options.heartbeat(every);
    }
    if let Some(n) = o["max_tries"].as_u64() {
        options = options.max_tries(n as u32);
    }
    if o["oversize"] == "error" {
        options = options.oversize(Oversize::Error);
    }
    let (on_run, on_done) = (o["hooks"]["on_run"] == "raise", o["hooks"]["on_done"] == "raise");
    let calls = hooks_called.clone();
    quiet_hook_panics();
    options.on_event(move |event| {
        let name = match event {
            Event::Run { .. } => "on_run",
            Event::Replay { .. } => "on_replay",
            Event::Busy { .. } => "on_busy",
            Event::Done { .. } => "on_done",
            Event::Release { .. } => "on_release",
            Event::LeaseLost { .. } => "on_lease_lost",
            Event::ResultDropped { .. } => "on_result_dropped",
            _ => "other",
        };
        *calls.lock().unwrap().entry(name).or_default() += 1;
        match event {
            Event::Run { .. } if on_run => panic!("hook failed"),
            Event::Done { .. } if on_done => panic!("hook failed"),
            _ => {}
        }
    })
}

/// The cases' hooks "raise" by panicking, which the library catches. The
/// default panic hook prints (with RUST_BACKTRACE, symbolizes) a backtrace
/// for each, inside the claim's lease: under load that once outlasted a 1 s
/// lease, and the release came after the record had expired. These expected
/// panics stay quiet; any other panic is printed as before.
fn quiet_hook_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<&str>() != Some(&"hook failed") {
                default(info);
            }
        }));
    });
}

/// Clients blocked in idem.claim, on every primary: (server, client id).
fn blocked<'a>(servers: &[&'a Server]) -> Vec<(&'a Server, i64)> {
    let mut found = Vec::new();
    for server in servers {
        let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut server.conn()).unwrap();
        for line in list.lines() {
            let field = |name: &str| line.split(' ').find_map(|f| f.strip_prefix(name)).unwrap_or_default();
            if field("flags=").contains('b') && field("cmd=").eq_ignore_ascii_case("idem.claim") {
                found.push((*server, field("id=").parse().unwrap()));
            }
        }
    }
    found
}

fn check_call(what: &str, expect: &Json, call: &Call, ran: &Ran) {
    let e = |field: &str| expect.get(field);
    if let Some(want) = e("ran") {
        assert_eq!(&json!(ran.started.load(Ordering::SeqCst)), want, "{what}: ran ({})", short(&call));
    }
    if let Some(want) = e("lost_seen") {
        assert_eq!(&json!(ran.lost_seen.load(Ordering::SeqCst)), want, "{what}: lost_seen");
    }
    if let Some(want) = e("job_key") {
        assert_eq!(&json!(ran.job_key.lock().unwrap().clone()), want, "{what}: job_key");
    }
    match call {
        Ok(outcome) => {
            assert!(e("error").is_none(), "{what}: expected {expect}, got {}", short(&outcome));
            if let Some(want) = e("value") {
                assert_eq!(&outcome.value().map_or(Json::Null, Out::json), want, "{what}: value");
            }
            if let Some(want) = e("replayed") {
                assert_eq!(&json!(outcome.is_replay()), want, "{what}: replayed");
            }
            if let Some(want) = e("attempt") {
                assert_eq!(&json!(outcome.attempt()), want, "{what}: attempt");
            }
            let (status, stored) = match outcome {
                Outcome::Completed { status, result_stored, .. } => (Some(*status), *result_stored),
                Outcome::Replayed { value, .. } => (None, value.is_some()),
            };
            if let Some(want) = e("status") {
                assert_eq!(
                    status.map(|s| json!(format!("{s:?}").to_uppercase())).as_ref(),
                    Some(want),
                    "{what}: status"
                );
            }
            if let Some(want) = e("result_stored") {
                assert_eq!(&json!(stored), want, "{what}: result_stored");
            }
        }
        Err(error) => {
            let (name, message) = match error {
                ProcessError::Work(message) => ("Work", Some(message.as_str())),
                other => (error_name(other.idem().unwrap()), None),
            };
            assert_eq!(e("error").and_then(Json::as_str), Some(name), "{what}: error ({})", short(&error));
            if let Some(want) = e("message") {
                assert_eq!(message, want.as_str(), "{what}: message");
            }
            if let Some(want) = e("error_result") {
                let value = match error {
                    ProcessError::Completed { value, .. } | ProcessError::Unsettled { value, .. } => value.json(),
                    // A replay not acknowledged: the stored result (none when it would not decode).
                    ProcessError::Replayed { value: Some(value), .. } => value.json(),
                    _ => panic!("{what}: no result in {}", short(&error)),
                };
                assert_eq!(&value, want, "{what}: error_result");
            }
            if let Some(want) = e("owner") {
                let Some(Error::Busy { owner, .. }) = error.idem() else { panic!("{what}: {}", short(&error)) };
                assert_eq!(&json!(owner), want, "{what}: owner");
            }
            if let Some(want) = e("stage") {
                let Some(Error::NotDurable { stage, .. }) = error.idem() else { panic!("{what}: {}", short(&error)) };
                assert_eq!(&json!(format!("{stage:?}").to_lowercase()), want, "{what}: stage");
            }
            if let Some(want) = e("attempt") {
                assert_eq!(&json!(ran.attempt.load(Ordering::SeqCst)), want, "{what}: attempt");
            }
            if let Some(min) = e("lease_left_ms_min").and_then(Json::as_u64) {
                let Some(Error::Busy { lease_left, .. }) = error.idem() else { panic!("{what}: {}", short(&error)) };
                assert!(lease_left.as_millis() as u64 >= min, "{what}: lease_left {lease_left:?}");
            }
        }
    }
}

fn check_claim(what: &str, expect: &Json, claim: &Result<Claim, Error>) {
    match claim {
        Ok(claim) => {
            assert!(expect.get("error").is_none(), "{what}: expected {expect}, got {claim:?}");
            if let Some(want) = expect.get("status") {
                assert_eq!(&json!(claim.status()), want, "{what}: status");
            }
            if let Some(want) = expect.get("attempt") {
                assert_eq!(&json!(claim.attempt()), want, "{what}: attempt");
            }
        }
        Err(error) => {
            assert_eq!(expect.get("error").and_then(Json::as_str), Some(error_name(error)), "{what}: {}", short(&error))
        }
    }
}

fn check_done(what: &str, expect: &Json, done: &Result<Done, Error>) {
    match done {
        Ok(done) => {
            assert!(expect.get("error").is_none(), "{what}: expected {expect}, got {done:?}");
            if let Some(want) = expect.get("completed") {
                assert_eq!(&json!(done.completed()), want, "{what}: completed");
            }
        }
        Err(error) => {
            assert_eq!(expect.get("error").and_then(Json::as_str), Some(error_name(error)), "{what}: {}", short(&error))
        }
    }
}

fn status_name(status: BatchStatus) -> &'static str {
    match status {
        BatchStatus::Processed => "processed",
        BatchStatus::Replayed => "replayed",
        BatchStatus::Busy => "busy",
        BatchStatus::Failed => "failed",
        BatchStatus::Lost => "lost",
        BatchStatus::Mismatch => "mismatch",
        BatchStatus::Exhausted => "exhausted",
        BatchStatus::NotDurable => "not_durable",
        BatchStatus::Error => "error",
    }
}

fn check_many(what: &str, expect: &Json, items: &[BatchItem<Out, String>]) {
    let expect = expect.as_array().unwrap();
    assert_eq!(items.len(), expect.len(), "{what}");
    for (item, want) in items.iter().zip(expect) {
        let what = format!("{what} {}", item.key);
        let w = |field: &str| want.get(field);
        assert_eq!(w("key").and_then(Json::as_str), Some(item.key.as_str()), "{what}");
        assert_eq!(w("status"), Some(&json!(status_name(item.status))), "{what}: {:?}", item.error);
        if let Some(v) = w("value") {
            assert_eq!(&item.value.as_ref().map_or(Json::Null, Out::json), v, "{what}: value");
        }
        if let Some(v) = w("attempt") {
            assert_eq!(&json!(item.attempt), v, "{what}: attempt");
        }
        if let Some(v) = w("result_stored") {
            assert_eq!(&json!(item.result_stored), v, "{what}: result_stored");
        }
        let (name, message) = match &item.error {
            None => (None, None),
            Some(KeyError::Work(m)) => (Some("Work"), Some(m.as_str())),
            Some(KeyError::Idem(e)) => (Some(error_name(e)), None),
        };
        let want_name = w("error").and_then(Json::as_str);
        // A busy key carries its Busy error; a case need not name it.
        if want_name.is_some() || item.status != BatchStatus::Busy {
            assert_eq!(name, want_name, "{what}: error {:?}", item.error);
        }
        if let Some(v) = w("message") {
            assert_eq!(message, v.as_str(), "{what}: message");
        }
    }
}

fn run_case(case: &Json, servers: &dyn Servers, proxy: Option<&proxy::Proxy>, asynchronous: bool) {
    let id = case["id"].as_str().unwrap();
    servers.reset();
    for server in servers.primaries() {
        let _: () = redis::cmd("FLUSHALL").query(&mut server.conn()).unwrap();
    }
    let mut raw = servers.raw();
    let hooks_called = HookCalls::default();
    let idem = servers.idem(options(&case["options"], &hooks_called), asynchronous, proxy);
    run_steps(id, case, &*idem, servers, &mut *raw, proxy);
    if let Some(want) = case.get("hooks_called").and_then(Json::as_object) {
        let called = hooks_called.lock().unwrap();
        for (hook, n) in want {
            assert_eq!(Some(&json!(called.get(hook.as_str()).copied().unwrap_or(0))), Some(n), "{id}: {hook} calls");
        }
    }
}

/// `INFO commandstats`' calls of every command, summed over `servers`.
fn all_calls(servers: &[&Server]) -> HashMap<String, i64> {
    let mut calls = HashMap::new();
    for server in servers {
        let text: String = redis::cmd("INFO").arg("commandstats").query(&mut server.conn()).unwrap();
        for line in text.lines() {
            let Some((name, rest)) = line.strip_prefix("cmdstat_").and_then(|l| l.split_once(':')) else { continue };
            let n: i64 =
                rest.split(',').find_map(|f| f.strip_prefix("calls=")).and_then(|n| n.parse().ok()).unwrap_or(0);
            *calls.entry(name.to_lowercase()).or_default() += n;
        }
    }
    calls
}

fn run_steps(
    id: &str,
    case: &Json,
    idem: &dyn Loop,
    servers: &dyn Servers,
    raw: &mut dyn ConnectionLike,
    proxy: Option<&proxy::Proxy>,
) {
    let gates = Gates::default();
    let mut tokens: HashMap<String, String> = HashMap::new();
    let calls_before = all_calls(&servers.primaries());
    let functions = idem.edition() == Edition::Functions;
    let ms = |v: &Json| Duration::from_millis(v.as_u64().unwrap());
    let process = |step: &Json, ran: &Ran| -> Call {
        let key = step["key"].as_str().unwrap();
        let call = match step["payload"].as_str() {
            Some(p) => ProcessOptions::new().payload(p),
            None => ProcessOptions::new(),
        };
        if step["typed"] == true {
            let typed = idem.process_typed(key, &|job| {
                let value = work(&step["work"], &gates, ran, job)?.json();
                Ok(serde_json::from_value::<calls::Charge>(value).unwrap())
            });
            // The replay is a Charge by its type; compared as JSON.
            return typed
                .map(|outcome| match outcome {
                    Outcome::Completed { value, attempt, status, result_stored } => Outcome::Completed {
                        value: Out::Json(serde_json::to_value(value).unwrap()),
                        attempt,
                        status,
                        result_stored,
                    },
                    Outcome::Replayed { value, attempt } => Outcome::Replayed {
                        value: value.map(|v: calls::Charge| Out::Json(serde_json::to_value(v).unwrap())),
                        attempt,
                    },
                })
                .map_err(|e| match e {
                    ProcessError::Work(e) => ProcessError::Work(e),
                    ProcessError::Idem(e) => ProcessError::Idem(e),
                    ProcessError::Completed { error, .. }
                    | ProcessError::Unsettled { error, .. }
                    | ProcessError::Replayed { error, .. } => ProcessError::Idem(error),
                });
        }
        idem.process(key, &call, &|job| work(&step["work"], &gates, ran, job))
    };
    std::thread::scope(|scope| {
        // A failed step opens every gate, so that the calls started end.
        struct OpenAll<'a>(&'a Gates);
        impl Drop for OpenAll<'_> {
            fn drop(&mut self) {
                self.0.open("*");
            }
        }
        let _open_all = OpenAll(&gates);
        let mut started: HashMap<String, (std::thread::ScopedJoinHandle<Call>, Arc<Ran>)> = HashMap::new();
        let mut waitings = 0; // the waiting steps so far
        for (n, step) in case["steps"].as_array().unwrap().iter().enumerate() {
            let what = format!("{id} step {n} ({})", step["op"]);
            let primaries = servers.primaries();
            let expect = &step["expect"];
            let key = step["key"].as_str().unwrap_or_default();
            match step["op"].as_str().unwrap() {
                "process" => {
                    let ran = Ran::default();
                    let call = process(step, &ran);
                    check_call(&what, expect, &call, &ran);
                }
                "start" => {
                    let ran = Arc::new(Ran::default());
                    let (r, process) = (ran.clone(), &process);
                    let handle = scope.spawn(move || process(step, &r));
                    started.insert(step["id"].as_str().unwrap().to_string(), (handle, ran));
                }
                "running" => {
                    let ran = &started[step["id"].as_str().unwrap()].1;
                    eventually(Duration::from_secs(10), &what, || ran.started.load(Ordering::SeqCst));
                }
                "waiting" if idem.edition() == Edition::Module => {
                    eventually(Duration::from_secs(10), &what, || !blocked(&primaries).is_empty());
                }
                // No blocked client to see: a call counts its wait at its first BUSY answer.
                "waiting" => {
                    waitings += 1;
                    eventually(Duration::from_secs(10), &what, || idem.stats().waits >= waitings);
                }
                "finish" => {
                    let (handle, ran) = started.remove(step["id"].as_str().unwrap()).unwrap();
                    let call = handle.join().expect("the call panicked");
                    check_call(&what, expect, &call, &ran);
                }
                "open" => gates.open(step["gate"].as_str().unwrap()),
                "process_many" => {
                    let keys: Vec<&str> =
                        step["keys"].as_array().unwrap().iter().map(|k| k.as_str().unwrap()).collect();
                    let ran = Ran::default();
                    let items = idem.process_many(&keys, &|job| work(&step["work"][job.key()], &gates, &ran, job));
                    check_many(&what, expect, &items);
                }
                "claim" => {
                    let options = match step["owner"].as_str() {
                        Some(owner) => ClaimOptions::new().owner(owner),
                        None => ClaimOptions::new(),
                    };
                    let claim = idem.claim(key, ms(&step["lease_ms"]), &options);
                    if let (Some(name), Ok(claim)) = (step["as"].as_str(), &claim) {
                        tokens.insert(name.into(), claim.token().unwrap().into());
                    }
                    check_claim(&what, expect, &claim);
                }
                "claim_many" => {
                    let keys: Vec<&str> =
                        step["keys"].as_array().unwrap().iter().map(|k| k.as_str().unwrap()).collect();
                    let claims = idem.claim_many(&keys, ms(&step["lease_ms"]));
                    for (i, claim) in claims.iter().enumerate() {
                        if let (Some(name), Ok(claim)) = (step["as"][i].as_str(), claim) {
                            tokens.insert(name.into(), claim.token().unwrap().into());
                        }
                        check_claim(&format!("{what} key {i}"), &expect[i], claim);
                    }
                }
                "done" => {
                    let mut options = DoneOptions::new();
                    if let Some(result) = step["result"].as_str() {
                        options = options.result(result);
                    }
                    let done = idem.done(key, &tokens[step["token"].as_str().unwrap()], &options);
                    check_done(&what, expect, &done);
                }
                "done_many" => {
                    let items: Vec<DoneItem> = step["items"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|item| {
                            let done = DoneItem::new(item[0].as_str().unwrap(), &tokens[item[1].as_str().unwrap()]);
                            match item[2].as_str() {
                                Some(result) => done.result(result),
                                None => done,
                            }
                        })
                        .collect();
                    let dones = idem.done_many(&items);
                    for (i, done) in dones.iter().enumerate() {
                        check_done(&format!("{what} item {i}"), &expect[i], done);
                    }
                }
                "release" => {
                    let released = idem.release(key, &tokens[step["token"].as_str().unwrap()]);
                    assert_eq!(Some(&json!(released)), expect.get("released"), "{what}");
                }
                "release_many" => {
                    let items: Vec<ReleaseItem> = step["items"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|item| ReleaseItem::new(item[0].as_str().unwrap(), &tokens[item[1].as_str().unwrap()]))
                        .collect();
                    let released = idem.release_many(&items);
                    for (i, r) in released.iter().enumerate() {
                        assert_eq!(Some(&json!(r.as_ref().unwrap())), expect[i].get("released"), "{what} {i}");
                    }
                }
                "get" => {
                    let record = match step["on"].as_str() {
                        Some("replica") => topology::get_on_replica(servers, key, functions),
                        _ => idem.get(key),
                    };
                    match record {
                        None => assert!(expect.is_null(), "{what}: no record, expected {expect}"),
                        Some(record) => {
                            let state = format!("{:?}", record.state).to_lowercase();
                            let result = record.result.map(|r| String::from_utf8(r).unwrap());
                            let got = json!({"state": state, "attempt": record.attempt, "result": result, "owner": record.owner});
                            for (field, want) in expect.as_object().unwrap() {
                                let want = if want == "$default" { &json!(default_owner()) } else { want };
                                assert_eq!(&got[field], want, "{what}: {field} of {got}");
                            }
                        }
                    }
                }
                "set" => {
                    let _: () = redis::cmd("SET").arg(key).arg(step["value"].as_str().unwrap()).query(raw).unwrap();
                }
                "del" => {
                    let _: i64 = redis::cmd("DEL").arg(key).query(raw).unwrap();
                }
                "sleep" => std::thread::sleep(ms(&step["ms"])),
                "unblock" => {
                    let clients = blocked(&primaries);
                    assert!(!clients.is_empty(), "{what}: nobody blocked");
                    for (server, id) in clients {
                        let _: i64 =
                            redis::cmd("CLIENT").arg("UNBLOCK").arg(id).arg("ERROR").query(&mut server.conn()).unwrap();
                    }
                }
                op @ ("cut_reply" | "cut_request") => {
                    let times = match &step["times"] {
                        Json::Null => Some(1),
                        Json::String(all) if all == "all" => None,
                        n => Some(n.as_u64().unwrap() as u32),
                    };
                    let command = step["command"].as_str().unwrap();
                    proxy.expect("a proxy case").arm(command, functions, op == "cut_reply", times);
                }
                "command_calls" => {
                    let command = step["command"].as_str().unwrap().to_lowercase();
                    let before = calls_before.get(&command).copied().unwrap_or(0);
                    let n = all_calls(&primaries).get(&command).copied().unwrap_or(0) - before;
                    match step.get("expect_max") {
                        Some(max) => assert!(n <= max.as_i64().unwrap(), "{what}: {command} calls {n}, at most {max}"),
                        None => assert_eq!(Some(&json!(n)), Some(expect), "{what}: {command} calls"),
                    }
                }
                "replica" => topology::replica_action(servers, step["action"].as_str().unwrap()),
                "failover" => servers.failover(),
                other => panic!("{what}: no such op {other}"),
            }
        }
    });
    let stats = idem.stats();
    let got = json!({
        "first_runs": stats.first_runs, "retries": stats.retries, "replays": stats.replays, "waits": stats.waits,
        "busy": stats.busy, "completed": stats.completed, "released": stats.released,
        "leases_lost": stats.leases_lost, "results_dropped": stats.results_dropped,
        "mismatches": stats.mismatches, "exhausted": stats.exhausted, "not_durable": stats.not_durable,
    });
    let want = &case["stats"];
    for (name, value) in got.as_object().unwrap() {
        assert_eq!(value, want.get(name).unwrap_or(&json!(0)), "{id}: stats.{name} in {got}");
    }
    if let Some(min) = want["extends_min"].as_u64() {
        assert!(stats.extends >= min, "{id}: {} extends, at least {min} expected", stats.extends);
    }
}

fn cases() -> Vec<Json> {
    let text = std::fs::read_to_string(repo().join("clients/conformance/cases.json")).expect("cases.json");
    let file: Json = serde_json::from_str(&text).unwrap();
    file["cases"].as_array().unwrap().clone()
}

/// Runs every case of `topology` for the suite's edition; panics naming
/// every case that failed.
fn run_all<X: Servers>(topology: &str, servers: impl FnOnce() -> X) {
    let edition = if functions_mode() { "functions" } else { "module" };
    let cases: Vec<Json> = cases()
        .into_iter()
        .filter(|c| c["topology"] == topology && c["editions"].as_array().unwrap().contains(&json!(edition)))
        .collect();
    let (run, skipped): (Vec<Json>, Vec<Json>) =
        cases.into_iter().partition(|c| !c["needs"].as_array().unwrap().contains(&json!("middleware")));
    for case in &skipped {
        eprintln!("conformance: skipped {} (needs an HTTP middleware; this library has none)", case["id"]);
    }
    if run.is_empty() {
        return;
    }
    let servers = servers();
    let mut failed = Vec::new();
    for case in &run {
        let id = case["id"].as_str().unwrap();
        let needs_proxy = case["needs"].as_array().unwrap().contains(&json!("proxy"));
        // AsyncIdem too, on the cases that take no time (no sleeps).
        let cheap = !case.to_string().contains("sleep");
        for asynchronous in [false, true].into_iter().filter(|a| !a || cheap) {
            let started = Instant::now();
            let result = catch_unwind(AssertUnwindSafe(|| {
                // Every case starts with the replica attached (one may end detached).
                if topology == "replicated" && servers.replica().role() == "master" {
                    topology::replica_action(&servers, "attach");
                }
                let proxy = needs_proxy.then(|| proxy::Proxy::start(servers.primaries()[0].port));
                run_case(case, &servers, proxy.as_ref(), asynchronous);
            }));
            let (api, ok) = (if asynchronous { "AsyncIdem" } else { "Idem" }, result.is_ok());
            let outcome = if ok { "passed" } else { "FAILED" };
            eprintln!("conformance {edition} {topology} {api}: {id} {outcome} in {:?}", started.elapsed());
            if !ok {
                failed.push(format!("{id} ({api})"));
            }
        }
    }
    assert!(failed.is_empty(), "conformance cases failed on {edition} {topology}: {failed:?}");
}

#[test]
fn conformance_standalone() {
    run_all("standalone", Server::start);
}

#[test]
fn conformance_cluster() {
    run_all("cluster", Cluster::start);
}

#[test]
fn conformance_replicated() {
    run_all("replicated", Replicated::start);
}

#[test]
fn conformance_sentinel() {
    run_all("sentinel", Sentineled::start);
}

/// docs/clients.md's default owner: the host name as gethostname(2) gives
/// it, `:`, this process's id.
fn default_owner() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("the host name");
    format!("{}:{}", host.trim(), std::process::id())
}
