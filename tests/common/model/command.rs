//! The commands the model knows, and their arguments as sent.

use std::fmt;

// ---------------------------------------------------------------------------
// Commands
// ---------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq)]
pub enum Cmd {
    Claim {
        key: String,
        lease: i64,
        payload: Option<Vec<u8>>,
        maxtries: Option<i64>,
        bloom: Option<String>,
        owner: Option<Vec<u8>>,
    },
    Done {
        key: String,
        token: String,
        result: Option<Vec<u8>>,
        retain: Option<i64>,
        bloom: Option<String>,
    },
    Release {
        key: String,
        token: String,
    },
    /// IDEM.MCLAIM, IDEM.MDONE or IDEM.MRELEASE: its parts are the single
    /// commands it stands for, in key order, all CLAIMs (one lease,
    /// MAXTRIES and OWNER, payloads on all or none), all DONEs (one RETAIN, results
    /// on all or none) or all RELEASEs, none with BLOOM. Checked part by
    /// part against the reply's elements (tests/stateful.rs).
    Batch(Vec<Cmd>),
    Extend {
        key: String,
        token: String,
        lease: i64,
    },
    Get {
        key: String,
    },
    Requeue {
        key: String,
    },
    Once {
        key: String,
        retain: i64,
    },
    BfReserve {
        key: String,
        rate: f64,
        capacity: i64,
        window: Option<i64>,
        shard: Option<i64>,
        expansion: Option<i64>,
    },
    BfAdd {
        key: String,
        item: String,
    },
    BfMadd {
        key: String,
        items: Vec<String>,
    },
    BfExists {
        key: String,
        item: String,
    },
    BfMexists {
        key: String,
        items: Vec<String>,
    },
    BfInfo {
        key: String,
    },
    Del {
        key: String,
    },
    Unlink {
        key: String,
    },
    Exists {
        key: String,
    },
    Type {
        key: String,
    },
    Pttl {
        key: String,
    },
    Pexpiretime {
        key: String,
    },
    Pexpire {
        key: String,
        ms: i64,
    },
    Expire {
        key: String,
        secs: i64,
    },
    Persist {
        key: String,
    },
    Copy {
        src: String,
        dst: String,
        replace: bool,
    },
    Rename {
        src: String,
        dst: String,
    },
    Dump {
        key: String,
        slot: usize,
    },
    /// `ttl` 0: no expiry; else ms from now, or a Unix ms with ABSTTL.
    Restore {
        key: String,
        slot: usize,
        ttl: i64,
        replace: bool,
        absttl: bool,
    },
    /// MOVE key 1 (from db 0).
    Move {
        key: String,
    },
    Swapdb,
    DebugReload,
    /// SET key plain PX ms: a key of another type, for a while.
    SetStr {
        key: String,
        px: i64,
    },
}

impl Cmd {
    /// The keys the command reads or writes (in its own database).
    pub fn keys(&self) -> Vec<&str> {
        use Cmd::*;
        match self {
            Claim { key, bloom, .. } | Done { key, bloom, .. } => {
                let mut k = vec![key.as_str()];
                if let Some(b) = bloom {
                    k.push(b);
                }
                k
            }
            Copy { src, dst, .. } | Rename { src, dst } => vec![src, dst],
            Batch(parts) => parts.iter().flat_map(Cmd::keys).collect(),
            Swapdb | DebugReload => vec![],
            Release { key, .. }
            | Extend { key, .. }
            | Get { key }
            | Requeue { key }
            | Once { key, .. }
            | BfReserve { key, .. }
            | BfAdd { key, .. }
            | BfMadd { key, .. }
            | BfExists { key, .. }
            | BfMexists { key, .. }
            | BfInfo { key }
            | Del { key }
            | Unlink { key }
            | Exists { key }
            | Type { key }
            | Pttl { key }
            | Pexpiretime { key }
            | Pexpire { key, .. }
            | Expire { key, .. }
            | Persist { key }
            | Dump { key, .. }
            | Restore { key, .. }
            | Move { key }
            | SetStr { key, .. } => vec![key],
        }
    }

    /// The command's arguments; `payload` is the DUMP payload a RESTORE sends.
    pub fn argv(&self, payload: Option<&[u8]>) -> Vec<Vec<u8>> {
        use Cmd::*;
        let mut a: Vec<Vec<u8>> = Vec::new();
        let mut s = |x: &str| a.push(x.as_bytes().to_vec());
        match self {
            Claim { key, lease, payload, maxtries, bloom, owner } => {
                s("IDEM.CLAIM");
                s(key);
                s(&lease.to_string());
                if let Some(p) = payload {
                    s("PAYLOAD");
                    a.push(p.clone());
                }
                let mut s = |x: &str| a.push(x.as_bytes().to_vec());
                if let Some(n) = maxtries {
                    s("MAXTRIES");
                    s(&n.to_string());
                }
                if let Some(b) = bloom {
                    s("BLOOM");
                    s(b);
                }
                if let Some(name) = owner {
                    s("OWNER");
                    a.push(name.clone());
                }
            }
            Done { key, token, result, retain, bloom } => {
                s("IDEM.DONE");
                s(key);
                s(token);
                if let Some(r) = result {
                    s("RESULT");
                    a.push(r.clone());
                }
                let mut s = |x: &str| a.push(x.as_bytes().to_vec());
                if let Some(r) = retain {
                    s("RETAIN");
                    s(&r.to_string());
                }
                if let Some(b) = bloom {
                    s("BLOOM");
                    s(b);
                }
            }
            Release { key, token } => {
                s("IDEM.RELEASE");
                s(key);
                s(token);
            }
            Batch(parts) => {
                a = batch_argv(parts);
            }
            Extend { key, token, lease } => {
                s("IDEM.EXTEND");
                s(key);
                s(token);
                s(&lease.to_string());
            }
            Get { key } => {
                s("IDEM.GET");
                s(key);
            }
            Requeue { key } => {
                s("IDEM.REQUEUE");
                s(key);
            }
            Once { key, retain } => {
                s("IDEM.ONCE");
                s(key);
                s(&retain.to_string());
            }
            BfReserve { key, rate, capacity, window, shard, expansion } => {
                s("IDEM.BF.RESERVE");
                s(key);
                s(&rate.to_string());
                s(&capacity.to_string());
                if let Some(w) = window {
                    s("WINDOW");
                    s(&w.to_string());
                }
                if let Some(p) = shard {
                    s("SHARD");
                    s(&p.to_string());
                }
                if let Some(e) = expansion {
                    s("EXPANSION");
                    s(&e.to_string());
                }
            }
            BfAdd { key, item } => {
                s("IDEM.BF.ADD");
                s(key);
                s(item);
            }
            BfMadd { key, items } => {
                s("IDEM.BF.MADD");
                s(key);
                for i in items {
                    s(i);
                }
            }
            BfExists { key, item } => {
                s("IDEM.BF.EXISTS");
                s(key);
                s(item);
            }
            BfMexists { key, items } => {
                s("IDEM.BF.MEXISTS");
                s(key);
                for i in items {
                    s(i);
                }
            }
            BfInfo { key } => {
                s("IDEM.BF.INFO");
                s(key);
            }
            Del { key } => {
                s("DEL");
                s(key);
            }
            Unlink { key } => {
                s("UNLINK");
                s(key);
            }
            Exists { key } => {
                s("EXISTS");
                s(key);
            }
            Type { key } => {
                s("TYPE");
                s(key);
            }
            Pttl { key } => {
                s("PTTL");
                s(key);
            }
            Pexpiretime { key } => {
                s("PEXPIRETIME");
                s(key);
            }
            Pexpire { key, ms } => {
                s("PEXPIRE");
                s(key);
                s(&ms.to_string());
            }
            Expire { key, secs } => {
                s("EXPIRE");
                s(key);
                s(&secs.to_string());
            }
            Persist { key } => {
                s("PERSIST");
                s(key);
            }
            Copy { src, dst, replace } => {
                s("COPY");
                s(src);
                s(dst);
                if *replace {
                    s("REPLACE");
                }
            }
            Rename { src, dst } => {
                s("RENAME");
                s(src);
                s(dst);
            }
            Dump { key, .. } => {
                s("DUMP");
                s(key);
            }
            Restore { key, ttl, replace, absttl, .. } => {
                s("RESTORE");
                s(key);
                s(&ttl.to_string());
                a.push(payload.expect("RESTORE needs a payload").to_vec());
                let mut s = |x: &str| a.push(x.as_bytes().to_vec());
                if *replace {
                    s("REPLACE");
                }
                if *absttl {
                    s("ABSTTL");
                }
            }
            Move { key } => {
                s("MOVE");
                s(key);
                s("1");
            }
            Swapdb => {
                s("SWAPDB");
                s("0");
                s("1");
            }
            DebugReload => {
                s("DEBUG");
                s("RELOAD");
            }
            SetStr { key, px } => {
                s("SET");
                s(key);
                s("plain");
                s("PX");
                s(&px.to_string());
            }
        }
        a
    }

    /// Whether the reply depends on the key's expiry (beyond the key's
    /// existence).
    pub fn shows_expiry(&self) -> bool {
        matches!(self, Cmd::Pttl { .. } | Cmd::Pexpiretime { .. } | Cmd::Persist { .. })
    }

    /// Read-only commands never change the world (but for what the module
    /// may do on its own, see `variants`).
    pub fn is_read(&self) -> bool {
        use Cmd::*;
        matches!(
            self,
            Get { .. }
                | BfExists { .. }
                | BfMexists { .. }
                | BfInfo { .. }
                | Exists { .. }
                | Type { .. }
                | Pttl { .. }
                | Pexpiretime { .. }
        )
    }
}

/// The batch command a [`Cmd::Batch`]'s parts stand for.
fn batch_argv(parts: &[Cmd]) -> Vec<Vec<u8>> {
    let mut a: Vec<Vec<u8>> = Vec::new();
    let n = parts.len().to_string();
    let text = |x: &str| x.as_bytes().to_vec();
    match &parts[0] {
        Cmd::Claim { lease, payload, maxtries, owner, .. } => {
            a.extend([text("IDEM.MCLAIM"), text(&lease.to_string()), text(&n)]);
            a.extend(parts.iter().map(|p| text(p.keys()[0])));
            if payload.is_some() {
                a.push(text("PAYLOADS"));
                a.extend(parts.iter().map(|p| match p {
                    Cmd::Claim { payload, .. } => payload.clone().unwrap_or_default(),
                    _ => unreachable!("a batch of one kind"),
                }));
            }
            if let Some(n) = maxtries {
                a.extend([text("MAXTRIES"), text(&n.to_string())]);
            }
            if let Some(name) = owner {
                a.extend([text("OWNER"), name.clone()]);
            }
        }
        Cmd::Done { result, retain, .. } => {
            a.extend([text("IDEM.MDONE"), text(&n)]);
            let mut results = Vec::new();
            for p in parts {
                let Cmd::Done { key, token, result, .. } = p else { unreachable!("a batch of one kind") };
                a.extend([text(key), text(token)]);
                results.push(result.clone().unwrap_or_default());
            }
            if result.is_some() {
                a.push(text("RESULTS"));
                a.extend(results);
            }
            if let Some(r) = retain {
                a.extend([text("RETAIN"), text(&r.to_string())]);
            }
        }
        _ => {
            a.extend([text("IDEM.MRELEASE"), text(&n)]);
            for p in parts {
                let Cmd::Release { key, token } = p else { unreachable!("a batch of one kind") };
                a.extend([text(key), text(token)]);
            }
        }
    }
    a
}

/// Printable form of an argument (binary bytes escaped, long ones cut).
pub fn show_arg(a: &[u8]) -> String {
    let mut s = String::new();
    for &b in a.iter().take(40) {
        if b.is_ascii_graphic() {
            s.push(b as char);
        } else {
            s.push_str(&format!("\\x{b:02x}"));
        }
    }
    if a.len() > 40 {
        s.push_str(&format!("...({} bytes)", a.len()));
    }
    if s.is_empty() {
        s.push_str("\"\"");
    }
    s
}

impl fmt::Display for Cmd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let placeholder = b"<payload>".to_vec();
        let argv = self.argv(Some(&placeholder));
        let parts: Vec<String> = argv.iter().map(|a| show_arg(a)).collect();
        write!(f, "{}", parts.join(" "))
    }
}
