//! `COMMAND DOCS` (docs/operations.md, "COMMAND DOCS"): every command the
//! module registers has a summary and an argument tree, and the tree reads
//! as the command's syntax line in docs/commands.md, so redis-cli's help
//! and hints and client code generators show what the docs say. Argument
//! types and key positions are checked too: each key argument names the
//! key spec that finds it.
#[allow(dead_code)] // each test binary uses part of common/
mod common;

use common::reply::{as_int, as_str};
use common::server::Server;
use redis::Value;
use std::collections::{BTreeMap, BTreeSet};

/// A reply map, from RESP2's flat field-value array.
type Fields = BTreeMap<String, Value>;

fn fields(v: &Value) -> Fields {
    let Value::Array(items) = v else { panic!("expected a field-value array, got {v:?}") };
    items.chunks(2).map(|pair| (as_str(&pair[0]), pair[1].clone())).collect()
}

fn list(v: &Value) -> &[Value] {
    match v {
        Value::Array(items) => items,
        other => panic!("expected an array, got {other:?}"),
    }
}

fn text(f: &Fields, name: &str) -> Option<String> {
    f.get(name).map(as_str)
}

/// The syntax lines of docs/commands.md: `### IDEM.X args / IDEM.Y args`
/// headings, by command name.
fn documented_syntax() -> BTreeMap<String, String> {
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/commands.md")).unwrap();
    let mut lines = BTreeMap::new();
    for heading in docs.lines().filter_map(|l| l.strip_prefix("### IDEM.")) {
        for part in format!("IDEM.{heading}").split(" / ") {
            let (name, args) = part.split_once(' ').unwrap_or((part, ""));
            assert!(lines.insert(name.to_string(), args.to_string()).is_none(), "{name} documented twice");
        }
    }
    lines
}

/// An argument as a syntax line writes it, the way redis-cli renders its
/// help from `COMMAND DOCS` (shown name: `display_text`, else `name`).
fn render(arg: &Fields) -> String {
    let kind = text(arg, "type").unwrap();
    let token = text(arg, "token");
    let shown = match kind.as_str() {
        "pure-token" => token.clone().expect("a pure-token argument has a token"),
        "oneof" | "block" => {
            let sep = if kind == "oneof" { "|" } else { " " };
            list(&arg["arguments"]).iter().map(|a| render(&fields(a))).collect::<Vec<_>>().join(sep)
        }
        _ => text(arg, "display_text").or_else(|| text(arg, "name")).unwrap(),
    };
    let mut s = match token {
        Some(token) if kind != "pure-token" => format!("{token} {shown}"),
        _ => shown,
    };
    let flags: Vec<String> = arg.get("flags").map(|f| list(f).iter().map(as_str).collect()).unwrap_or_default();
    if flags.iter().any(|f| f == "multiple") {
        s = format!("{s} [{s} ...]");
    }
    if flags.iter().any(|f| f == "optional") {
        s = format!("[{s}]");
    }
    s
}

/// The type each argument name has, across the module's commands.
fn expected_type(name: &str) -> &'static str {
    match name {
        "key" | "filterkey" => "key",
        "lease" | "n" | "ms" | "seconds" | "retain" | "capacity" | "window" | "expansion" | "numkeys" | "cursor"
        | "count" => "integer",
        "error_rate" => "double",
        "data" | "token" | "value" | "blob" | "item" | "header" | "payload" | "result" | "pattern" | "state"
        | "name" => "string",
        "payloads" | "results" | "key_token" => "block",
        "period" => "oneof",
        "day" | "hour" => "pure-token",
        other => panic!("argument {other:?}: give it an expected type in this test"),
    }
}

/// Checks every argument's type, nested ones included; unique names among
/// siblings (code generators name parameters after them).
fn check_types(command: &str, args: &[Value]) {
    let mut names = BTreeSet::new();
    for arg in args.iter().map(fields) {
        let name = text(&arg, "name").unwrap();
        assert!(names.insert(name.clone()), "{command}: two arguments named {name}");
        assert_eq!(text(&arg, "type").unwrap(), expected_type(&name), "{command} argument {name}: type");
        if let Some(sub) = arg.get("arguments") {
            check_types(command, list(sub));
        }
    }
}

/// Each top-level key argument names the key spec (COMMAND INFO) that finds
/// it: an index spec at its position (for a counted spec, `numkeys key
/// [key ...]`, the first key after the count), or a keyword spec on its
/// token. A key inside a block (the batch commands' `key token` pairs)
/// names a counted spec that steps over the block.
fn check_key_specs(con: &mut redis::Connection, command: &str, args: &[Value]) {
    let info: Value = redis::cmd("COMMAND").arg("INFO").arg(command).query(con).unwrap();
    let entry = list(&list(&info)[0]);
    let specs: Vec<Fields> = list(&entry[8]).iter().map(fields).collect();
    let mut used = BTreeSet::new();
    for (i, arg) in args.iter().map(fields).enumerate() {
        if text(&arg, "type").as_deref() == Some("block") {
            let parts = list(&arg["arguments"]);
            for part in parts.iter().map(fields).filter(|p| p.contains_key("key_spec_index")) {
                let index = as_int(&part["key_spec_index"]) as usize;
                assert!(index < specs.len(), "{command}: key_spec_index {index} of {} key specs", specs.len());
                used.insert(index);
                let find = fields(&specs[index]["find_keys"]);
                assert_eq!(text(&find, "type").unwrap(), "keynum", "{command}: a key in a block is counted");
                let step = as_int(&fields(&find["spec"])["keystep"]);
                assert_eq!(step, parts.len() as i64, "{command}: key spec {index} steps over the block");
            }
            continue;
        }
        if text(&arg, "type").as_deref() != Some("key") {
            assert!(!arg.contains_key("key_spec_index"), "{command}: only key arguments name a key spec");
            continue;
        }
        let index = as_int(&arg["key_spec_index"]) as usize;
        assert!(index < specs.len(), "{command}: key_spec_index {index} of {} key specs", specs.len());
        used.insert(index);
        let begin = fields(&specs[index]["begin_search"]);
        let spec = fields(&begin["spec"]);
        let find = fields(&specs[index]["find_keys"]);
        let first_key = match text(&find, "type").as_deref() {
            Some("keynum") => as_int(&fields(&find["spec"])["firstkey"]),
            _ => 0,
        };
        match text(&arg, "token") {
            None => {
                assert_eq!(text(&begin, "type").unwrap(), "index", "{command} arg {i}");
                assert_eq!(as_int(&spec["index"]) + first_key, i as i64 + 1, "{command}: key spec {index} position");
            }
            Some(token) => {
                assert_eq!(text(&begin, "type").unwrap(), "keyword", "{command} arg {i}");
                assert_eq!(text(&spec, "keyword").unwrap(), token, "{command}: key spec {index} keyword");
            }
        }
    }
    assert_eq!(used.len(), specs.len(), "{command}: every key spec has its key argument");
}

#[test]
fn command_docs_give_every_command_its_documented_arguments() {
    let s = Server::start();
    let mut con = s.conn();
    let registered: Vec<String> =
        redis::cmd("COMMAND").arg("LIST").arg("FILTERBY").arg("MODULE").arg("idem").query(&mut con).unwrap();
    let registered: BTreeSet<String> = registered.iter().map(|n| n.to_uppercase()).collect();
    let documented = documented_syntax();
    assert_eq!(
        registered,
        documented.keys().cloned().collect::<BTreeSet<_>>(),
        "the commands registered and the commands docs/commands.md gives a syntax line"
    );

    // Redis 7.0 has no display_text (7.2 added it; Redis 8 and Valkey fill
    // it in with the name where a module gives none): it shows names, so
    // RESERVE's two values the docs call `n` show as their names there.
    let docs: Value = redis::cmd("COMMAND").arg("DOCS").arg("IDEM.CLAIM").query(&mut con).unwrap();
    let claim = fields(&fields(&docs)["IDEM.CLAIM"]);
    let key_arg = fields(&list(&claim["arguments"])[0]);
    let has_display_text = key_arg.contains_key("display_text");

    for command in &registered {
        let docs: Value = redis::cmd("COMMAND").arg("DOCS").arg(command).query(&mut con).unwrap();
        let docs = fields(&docs);
        assert_eq!(docs.len(), 1, "COMMAND DOCS {command}: {docs:?}");
        let doc = fields(docs.values().next().unwrap());
        assert!(text(&doc, "summary").is_some_and(|s| !s.is_empty()), "{command}: summary");
        assert_eq!(text(&doc, "module").as_deref(), Some("idem"), "{command}: module");
        let args = list(doc.get("arguments").unwrap_or_else(|| panic!("{command}: no arguments in {doc:?}")));
        let rendered = args.iter().map(|a| render(&fields(a))).collect::<Vec<_>>().join(" ");
        let mut want = documented[command].clone();
        if !has_display_text && command == "IDEM.BF.RESERVE" {
            want = want.replace("WINDOW n", "WINDOW window").replace("EXPANSION n", "EXPANSION expansion");
        }
        assert_eq!(rendered, want, "{command}: COMMAND DOCS arguments against docs/commands.md");
        check_types(command, args);
        check_key_specs(&mut con, command, args);
    }
}

/// An argument's name, type, token, key spec index and flags.
type ArgRow = (String, String, Option<String>, Option<i64>, Vec<String>);

/// IDEM.CLAIM's tree exactly, field by field, as a client generator reads
/// it: options are optional top-level arguments, each a token and a value.
#[test]
fn claim_arguments_in_full() {
    let s = Server::start();
    let mut con = s.conn();
    let docs: Value = redis::cmd("COMMAND").arg("DOCS").arg("IDEM.CLAIM").query(&mut con).unwrap();
    let claim = fields(&fields(&docs)["IDEM.CLAIM"]);
    let args: Vec<Fields> = list(&claim["arguments"]).iter().map(fields).collect();
    let summary: Vec<ArgRow> = args
        .iter()
        .map(|a| {
            (
                text(a, "name").unwrap(),
                text(a, "type").unwrap(),
                text(a, "token"),
                a.get("key_spec_index").map(as_int),
                a.get("flags").map(|f| list(f).iter().map(as_str).collect()).unwrap_or_default(),
            )
        })
        .collect();
    let optional = || vec!["optional".to_string()];
    let want = vec![
        ("key".into(), "key".into(), None, Some(0), vec![]),
        ("lease".into(), "integer".into(), None, None, vec![]),
        ("data".into(), "string".into(), Some("PAYLOAD".into()), None, optional()),
        ("n".into(), "integer".into(), Some("MAXTRIES".into()), None, optional()),
        ("filterkey".into(), "key".into(), Some("BLOOM".into()), Some(1), optional()),
        ("ms".into(), "integer".into(), Some("WAIT".into()), None, optional()),
        ("name".into(), "string".into(), Some("OWNER".into()), None, optional()),
    ];
    assert_eq!(summary, want);
}

/// The backquoted names in `text` that look like counters (`a_b`, lower
/// case), as `INFO idem` would name them.
fn counter_names(text: &str, prefix: &str) -> BTreeSet<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|word| {
            word.contains('_') && !word.ends_with('_') && word.chars().all(|c| c.is_ascii_lowercase() || c == '_')
        })
        .map(|word| if word.starts_with(prefix) { word.to_string() } else { format!("{prefix}{word}") })
        .collect()
}

fn doc_section(file: &str, heading: &str) -> String {
    let docs = std::fs::read_to_string(format!("{}/docs/{file}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let start = docs.find(heading).unwrap_or_else(|| panic!("docs/{file} has no {heading}"));
    let rest = &docs[start + heading.len()..];
    rest[..rest.find("\n#").unwrap_or(rest.len())].to_string()
}

/// Every `INFO idem` field is in both docs' lists, and they list no other.
#[test]
fn info_idem_fields_are_the_documented_ones() {
    let s = Server::start();
    let mut con = s.conn();
    let served: BTreeSet<String> =
        s.info(&mut con, "idem").into_keys().filter(|name| name.starts_with("idem_")).collect();
    assert!(served.len() > 20, "INFO idem: {served:?}");
    for (file, heading) in [("commands.md", "## INFO idem"), ("operations.md", "## INFO idem")] {
        let documented = counter_names(&doc_section(file, heading), "idem_");
        assert_eq!(documented, served, "docs/{file} {heading} against INFO idem");
    }
}
