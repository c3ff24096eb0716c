//! The conformance runner's TCP proxy for `cut_reply` and `cut_request`:
//! it forwards bytes both ways; armed for a command, when a chunk the
//! library sends holds that command it either forwards the chunk and
//! closes the library's connection before the reply reaches it
//! (`cut_reply`), or closes it without forwarding (`cut_request`: the
//! server never sees the command). It keeps listening, so that the library
//! can reconnect. It can also keep what the library sends, chunk by chunk
//! (`record`), to see which commands went in one round trip.
#![allow(dead_code)] // each test binary uses part of it
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// What is armed: the command's names as sent, whether the request is
/// forwarded, and how many times more (None: every time).
#[derive(Clone)]
struct Cut {
    names: Vec<&'static str>,
    forward: bool,
    left: Option<u32>,
}

pub struct Proxy {
    port: u16,
    cut: Arc<Mutex<Option<Cut>>>,
    sent: Arc<Mutex<Option<Vec<String>>>>,
}

/// The names a conformance command takes in the bytes the library sends
/// (lowercased): the module's command, or the Functions edition's function
/// (for `mdone`/`mrelease`, the pipelined singles of a batch).
fn names(command: &str, functions: bool) -> Vec<&'static str> {
    match (command, functions) {
        ("claim", _) => vec!["idem.claim\r\n", "idem_claim\r\n"],
        ("done", _) => vec!["idem.done\r\n", "idem_done\r\n"],
        ("release", _) => vec!["idem.release\r\n", "idem_release\r\n"],
        ("mdone", false) => vec!["idem.mdone\r\n"],
        ("mdone", true) => vec!["idem_done\r\n"],
        ("mrelease", false) => vec!["idem.mrelease\r\n"],
        ("mrelease", true) => vec!["idem_release\r\n"],
        (other, _) => panic!("the proxy cannot cut {other}"),
    }
}

impl Proxy {
    pub fn start(server_port: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut: Arc<Mutex<Option<Cut>>> = Arc::new(Mutex::new(None));
        let sent: Arc<Mutex<Option<Vec<String>>>> = Arc::new(Mutex::new(None));
        let (armed, log) = (cut.clone(), sent.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(("127.0.0.1", server_port)) else { continue };
                let closed = Arc::new(AtomicBool::new(false));
                let (mut c_in, mut c_out) = (client.try_clone().unwrap(), client);
                let (mut s_in, mut s_out) = (server.try_clone().unwrap(), server);
                let (armed, closed_, log) = (armed.clone(), closed.clone(), log.clone());
                std::thread::spawn(move || {
                    let mut buf = [0u8; 65536];
                    while let Ok(n @ 1..) = c_in.read(&mut buf) {
                        if let Some(chunks) = log.lock().unwrap().as_mut() {
                            chunks.push(String::from_utf8_lossy(&buf[..n]).to_lowercase());
                        }
                        let forward = match take(&armed, &buf[..n]) {
                            None => {
                                if s_out.write_all(&buf[..n]).is_err() {
                                    break;
                                }
                                continue;
                            }
                            Some(forward) => forward,
                        };
                        closed_.store(true, Ordering::SeqCst);
                        if forward {
                            let _ = s_out.write_all(&buf[..n]);
                        }
                        break;
                    }
                    let _ = c_in.shutdown(Shutdown::Both);
                    let _ = s_out.shutdown(Shutdown::Write);
                });
                std::thread::spawn(move || {
                    let mut buf = [0u8; 65536];
                    while let Ok(n @ 1..) = s_in.read(&mut buf) {
                        if closed.load(Ordering::SeqCst) || c_out.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = c_out.shutdown(Shutdown::Both);
                });
            }
        });
        Proxy { port, cut, sent }
    }

    /// Keeps what the library sends from now on, one string per chunk read
    /// (a pipeline written at once is one chunk on loopback), lowercased.
    pub fn record(&self) {
        *self.sent.lock().unwrap() = Some(Vec::new());
    }

    /// The chunks kept since `record`.
    pub fn recorded(&self) -> Vec<String> {
        self.sent.lock().unwrap().clone().unwrap_or_default()
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Arms the proxy for `command` (`times`: None for every time).
    pub fn arm(&self, command: &str, functions: bool, forward: bool, times: Option<u32>) {
        *self.cut.lock().unwrap() = Some(Cut { names: names(command, functions), forward, left: times });
    }
}

/// Whether this chunk is to be cut, and then whether it is forwarded.
fn take(armed: &Mutex<Option<Cut>>, chunk: &[u8]) -> Option<bool> {
    let mut armed = armed.lock().unwrap();
    let cut = armed.as_mut()?;
    let text = String::from_utf8_lossy(chunk).to_lowercase();
    if !cut.names.iter().any(|name| text.contains(name)) {
        return None;
    }
    let forward = cut.forward;
    match &mut cut.left {
        Some(1) => *armed = None,
        Some(n) => *n -= 1,
        None => {}
    }
    Some(forward)
}
