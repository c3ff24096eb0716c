//! The batch commands inside scripts and functions (docs/commands.md,
//! "Batch commands"): flagged `noscript`, so `EVAL` and `FCALL` refuse them
//! on every server with one error and nothing written. Valkey 9.1 would
//! otherwise hand a script one error for a reply with an error element
//! while the call's claims stood, held by nobody.
#[allow(dead_code)] // each test binary uses part of common/
mod common;

use common::commands::{claim_new, digest, idem_counters};
use common::reply::err_text;
use common::server::Server;
use redis::Value;

/// Each batch command as a script would call it: the first key a fresh
/// one (a call that ran would write it), the second a string (a per-key
/// error element).
const CALLS: [&str; 3] = [
    "'IDEM.MCLAIM', 30, 2, 'fresh', 'str'",
    "'IDEM.MDONE', 2, 'fresh', '00000000000000000000000000000000', 'str', 'x'",
    "'IDEM.MRELEASE', 2, 'held', ARGV[1], 'str', 'x'",
];

fn refused(reply: redis::RedisResult<Value>, what: &str) -> String {
    match reply {
        Err(e) => {
            let text = err_text(&e);
            // "Redis" or "Valkey": the server's own refusal of a noscript command.
            let server_name =
                text.strip_prefix("ERR This ").and_then(|rest| rest.split_once(' ')).map(|(name, _)| name);
            assert!(matches!(server_name, Some("Redis" | "Valkey")), "{what}: {text}");
            assert!(text.contains(" command is not allowed from script"), "{what}: {text}");
            text
        }
        Ok(v) => panic!("{what} ran inside a script: {v:?}"),
    }
}

#[test]
fn batch_commands_are_flagged_noscript() {
    let s = Server::start();
    let mut con = s.conn();
    for name in ["IDEM.MCLAIM", "IDEM.MDONE", "IDEM.MRELEASE"] {
        let info: Value = redis::cmd("COMMAND").arg("INFO").arg(name).query(&mut con).unwrap();
        let text = format!("{info:?}");
        assert!(text.contains("noscript"), "{name} is not flagged noscript: {text}");
    }
}

#[test]
fn eval_and_fcall_of_a_batch_command_are_refused_and_write_nothing() {
    let s = Server::start();
    let mut con = s.conn();
    let _: () = redis::cmd("SET").arg("str").arg("x").query(&mut con).unwrap();
    let held = claim_new(&mut con, "held", 30);
    let library = format!(
        "#!lua name=batches\n{}",
        CALLS
            .iter()
            .enumerate()
            .map(|(i, call)| {
                format!(
                    "redis.register_function('call{i}', function(KEYS, ARGV) return redis.call({call}) end)\n\
                     redis.register_function('pcall{i}', function(KEYS, ARGV) return redis.pcall({call}) end)\n"
                )
            })
            .collect::<String>()
    );
    let _: String = redis::cmd("FUNCTION").arg("LOAD").arg(&library).query(&mut con).unwrap();
    let before = (digest(&mut con), idem_counters(&mut con));
    let mut errors = Vec::new();
    for (i, call) in CALLS.iter().enumerate() {
        for (how, resp3) in [("redis.call", false), ("redis.pcall", false), ("redis.pcall", true)] {
            let setresp = if resp3 { "redis.setresp(3) " } else { "" };
            let script = format!("{setresp}return {how}({call})");
            let reply = redis::cmd("EVAL").arg(&script).arg(0).arg(&held).query::<Value>(&mut con);
            let text = refused(reply, &format!("EVAL {script}"));
            errors.push(text);
        }
        for function in [format!("call{i}"), format!("pcall{i}")] {
            let reply = redis::cmd("FCALL").arg(&function).arg(0).arg(&held).query::<Value>(&mut con);
            errors.push(refused(reply, &format!("FCALL {function} ({call})")));
        }
    }
    assert_eq!(errors.len(), CALLS.len() * 5);
    let exists: i64 = redis::cmd("EXISTS").arg("fresh").query(&mut con).unwrap();
    assert_eq!(exists, 0, "a refused batch claimed a key");
    assert_eq!((digest(&mut con), idem_counters(&mut con)), before, "a refused batch changed something");
}
