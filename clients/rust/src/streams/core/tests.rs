//! The consumer's decisions, without a server.
use super::*;
use crate::reply::Granted;

fn core(options: StreamOptions) -> StreamCore {
    let setup = Setup {
        lease: Duration::from_secs(2),
        owner: "host:1".into(),
        cluster: false,
        max_block: Duration::from_secs(5),
    };
    StreamCore::new("s", "g", options, setup).unwrap()
}

fn entry(fields: &[(&str, &str)]) -> StreamEntry {
    let fields = fields.iter().map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec())).collect();
    StreamEntry::new("s", "1-0", fields)
}

fn bulk(s: &str) -> Value {
    Value::BulkString(s.as_bytes().to_vec())
}

type R = Result<Outcome<u32>, ProcessError<u32, String>>;

#[test]
fn settings_are_checked() {
    let setup = || Setup {
        lease: Duration::from_secs(2),
        owner: "h:1".into(),
        cluster: false,
        max_block: Duration::from_secs(5),
    };
    let refused = |o: StreamOptions| StreamCore::new("s", "g", o, setup()).err().map(|e| e.to_string());
    assert!(refused(StreamOptions::new().claim_idle(Duration::from_secs(1))).unwrap().contains("claim_idle"));
    assert!(refused(StreamOptions::new().block(Duration::ZERO)).unwrap().contains("block"));
    assert!(refused(StreamOptions::new().block(Duration::from_secs(5))).unwrap().contains("block"));
    assert!(refused(StreamOptions::new().concurrency(0)).unwrap().contains("concurrency"));
    assert!(refused(StreamOptions::new().retry_delay(Duration::from_secs(2), Duration::from_secs(1))).is_some());
    assert!(StreamCore::new("", "g", StreamOptions::new(), setup()).is_err());
    let core = core(StreamOptions::new());
    assert_eq!((core.consumer.as_str(), core.dead_letter.as_str()), ("host:1", "s:dlq"));
}

#[test]
fn the_key_is_a_field_or_a_function_never_the_id() {
    let core = core(StreamOptions::new());
    assert_eq!(core.key_of(&entry(&[("idem-key", "k1"), ("body", "x")])).unwrap(), "k1");
    for fields in [&[("body", "x")][..], &[("idem-key", "")][..]] {
        assert!(matches!(core.key_of(&entry(fields)), Err(Error::MissingKey { .. })));
    }
    let core = super::StreamCore::new(
        "s",
        "g",
        StreamOptions::new().key(|e| e.field_str("order").map(|o| format!("order:{o}"))),
        Setup { lease: Duration::from_secs(2), owner: "h:1".into(), cluster: false, max_block: Duration::from_secs(5) },
    )
    .unwrap();
    assert_eq!(core.key_of(&entry(&[("order", "7")])).unwrap(), "order:7");
    assert!(core.key_of(&entry(&[("idem-key", "k")])).is_err());
}

#[test]
fn verdicts_follow_the_contract() {
    let core = core(StreamOptions::new());
    let judge = |r: R, attempt| core.judge(&r, attempt);
    let done = Outcome::Completed { value: 1, attempt: 1, status: Granted::New, result_stored: true };
    assert_eq!(judge(Ok(done), Some(1)), Verdict::Ack { replayed: false });
    assert_eq!(judge(Ok(Outcome::Replayed { value: None, attempt: 1 }), None), Verdict::Ack { replayed: true });
    let held = |r: R, attempt| match core.judge(&r, attempt) {
        Verdict::Hold { delay, .. } => delay,
        other => panic!("held back, not {other:?}"),
    };
    // Busy: the holder's lease left, never less than the least delay.
    let busy = |ms| {
        Err(ProcessError::Idem(Error::Busy { key: "k".into(), lease_left: Duration::from_millis(ms), owner: None }))
    };
    assert_eq!(held(busy(1500), None), Duration::from_millis(1500));
    assert_eq!(held(busy(3), None), Duration::from_millis(100));
    // A failure: 100 ms, doubling with each attempt, up to the max.
    assert_eq!(held(Err(ProcessError::Work("no".into())), Some(1)), Duration::from_millis(100));
    assert_eq!(held(Err(ProcessError::Work("no".into())), Some(3)), Duration::from_millis(400));
    assert_eq!(held(Err(ProcessError::Work("no".into())), Some(60)), Duration::from_secs(30));
    for error in [
        Error::LeaseLost { key: "k".into(), attempt: 1 },
        Error::DoneUnconfirmed { key: "k".into(), cause: Box::new(Error::Stale("x".into())) },
    ] {
        assert_eq!(held(Err(ProcessError::Unsettled { value: 1, error }), Some(1)), Duration::from_millis(100));
    }
    let not_durable = || Error::NotDurable { key: "k".into(), stage: crate::DurableStage::Done, acknowledged: 0 };
    assert!(matches!(
        judge(Err(ProcessError::Completed { value: 1, error: not_durable() }), Some(1)),
        Verdict::Hold { .. }
    ));
    let hook = Error::Hook { key: "k".into(), message: "x".into() };
    assert_eq!(
        judge(Err(ProcessError::Completed { value: 1, error: hook }), Some(1)),
        Verdict::Ack { replayed: false }
    );
    for error in [
        Error::Exhausted { key: "k".into() },
        Error::Mismatch { key: "k".into() },
        Error::MissingKey { what: "x".into() },
    ] {
        assert!(matches!(judge(Err(ProcessError::Idem(error)), None), Verdict::Dead { .. }));
    }
    assert!(matches!(judge(Err(ProcessError::Idem(Error::WrongType("x".into()))), None), Verdict::Hold { .. }));
}

#[test]
fn settling_commands() {
    let core = core(StreamOptions::new());
    let e = entry(&[("idem-key", "k"), ("body", "b")]);
    let packed = |sends: Vec<Settling>| -> Vec<String> {
        sends
            .iter()
            .flat_map(|s| s.cmds.iter().map(|c| String::from_utf8_lossy(&c.get_packed_command()).replace("\r\n", " ")))
            .collect()
    };
    let ack = Verdict::Ack { replayed: false };
    // The XACK that rode with DONE ran: nothing more.
    assert!(core.settle(&e, &ack, &Some(vec![Ok(Value::Int(1))])).is_empty());
    // It did not ride, or failed: XACK alone.
    for ridden in [None, Some(vec![Err(redis::RedisError::from((redis::ErrorKind::Io, "cut")))])] {
        let cmds = packed(core.settle(&e, &ack, &ridden));
        assert!(cmds.len() == 1 && cmds[0].contains("XACK") && cmds[0].contains("1-0"), "{cmds:?}");
    }
    // Held back 500 ms of a 2 s claim_idle: idle 1500 ms, FORCE only when XACK may have run.
    let hold = Verdict::Hold { delay: Duration::from_millis(500), error: "busy".into() };
    let cmds = packed(core.settle(&e, &hold, &None));
    assert!(cmds[0].contains("XCLAIM") && cmds[0].contains("IDLE $4 1500") && !cmds[0].contains("FORCE"), "{cmds:?}");
    let cmds = packed(core.settle(&e, &hold, &Some(vec![Ok(Value::Int(1))])));
    assert!(cmds[0].contains("FORCE"), "{cmds:?}");
    // Dead letters: one MULTI, the fields then where it came from and why.
    let sends = core.settle(&e, &Verdict::Dead { error: "exhausted".into() }, &None);
    assert!(sends.len() == 1 && sends[0].multi && !sends[0].retry);
    let cmds = packed(sends);
    assert!(cmds[0].contains("MULTI") && cmds[3].contains("EXEC"), "{cmds:?}");
    for part in ["s:dlq", "idem-key", "original-stream", "original-id", "1-0", "error", "exhausted"] {
        assert!(cmds[1].contains(part), "{part} in {}", cmds[1]);
    }
}

#[test]
fn replies_are_read_in_both_protocols() {
    let core = core(StreamOptions::new());
    let one = Value::Array(vec![bulk("1-0"), Value::Array(vec![bulk("idem-key"), bulk("k"), bulk("body"), bulk("b")])]);
    let resp2 = Value::Array(vec![Value::Array(vec![bulk("s"), Value::Array(vec![one.clone()])])]);
    let resp3 = Value::Map(vec![(bulk("s"), Value::Array(vec![one.clone()]))]);
    for reply in [resp2, resp3] {
        let entries = core.on_read(Ok(reply)).unwrap();
        assert_eq!(entries, vec![entry(&[("idem-key", "k"), ("body", "b")])]);
    }
    assert!(core.on_read(Ok(Value::Nil)).unwrap().is_empty());
    // XAUTOCLAIM: the cursor, the entries, the ids deleted while pending.
    let reply = Value::Array(vec![bulk("0-0"), Value::Array(vec![one]), Value::Array(vec![bulk("0-1"), bulk("0-2")])]);
    let (entries, more) = core.on_autoclaim(Ok(reply)).unwrap();
    assert_eq!((entries.len(), more), (1, false));
    assert_eq!(core.stats(Stats::default()).trimmed_pending, 2);
    // A walk that found nothing is not due again at once.
    assert!(core.autoclaim_cmd(1).is_some());
    let reply = Value::Array(vec![bulk("0-0"), Value::Array(vec![]), Value::Array(vec![])]);
    assert_eq!(core.on_autoclaim(Ok(reply)).unwrap(), (vec![], false));
    assert!(core.autoclaim_cmd(1).is_none());
}

#[test]
fn a_multi_is_answered_only_by_its_exec() {
    let send = Settling {
        cmds: vec![redis::cmd("MULTI"), redis::cmd("XADD"), redis::cmd("XACK"), redis::cmd("EXEC")],
        route: "s".into(),
        retry: false,
        multi: true,
    };
    let queued = || Ok(Value::SimpleString("QUEUED".into()));
    let ran = vec![Ok(Value::Okay), queued(), queued(), Ok(Value::Array(vec![bulk("2-0"), Value::Int(1)]))];
    assert!(send.answered(&ran));
    let aborted = vec![Ok(Value::Okay), queued(), queued(), Ok(Value::Nil)];
    assert!(!send.answered(&aborted));
    let cut: Vec<RedisResult<Value>> =
        (0..4).map(|_| Err(redis::RedisError::from((redis::ErrorKind::Io, "cut")))).collect();
    assert!(!send.answered(&cut));
}
