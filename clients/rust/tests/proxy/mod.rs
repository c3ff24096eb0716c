//! The conformance runner's TCP proxy for `cut_reply`: it forwards bytes
//! both ways; armed, after forwarding a client chunk that contains the DONE
//! command it closes that client connection before the server's reply is
//! forwarded, and keeps listening so that the library can reconnect.
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

pub struct Proxy {
    port: u16,
    armed: Arc<AtomicBool>,
    batch: Arc<AtomicBool>,
}

/// A chunk with the DONE command (or, for `batch`, also IDEM.MDONE).
fn is_done(chunk: &[u8], batch: bool) -> bool {
    let text = String::from_utf8_lossy(chunk).to_lowercase();
    text.contains("idem.done") || text.contains("idem_done") || (batch && text.contains("idem.mdone"))
}

impl Proxy {
    pub fn start(server_port: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (armed, batch) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let (armed_, batch_) = (armed.clone(), batch.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(("127.0.0.1", server_port)) else { continue };
                let cut = Arc::new(AtomicBool::new(false));
                let (mut c_in, mut c_out) = (client.try_clone().unwrap(), client);
                let (mut s_in, mut s_out) = (server.try_clone().unwrap(), server);
                let (armed, batch, cut_) = (armed_.clone(), batch_.clone(), cut.clone());
                std::thread::spawn(move || {
                    let mut buf = [0u8; 65536];
                    while let Ok(n @ 1..) = c_in.read(&mut buf) {
                        let cutting =
                            is_done(&buf[..n], batch.load(Ordering::SeqCst)) && armed.swap(false, Ordering::SeqCst);
                        if cutting {
                            cut_.store(true, Ordering::SeqCst);
                        }
                        if s_out.write_all(&buf[..n]).is_err() {
                            break;
                        }
                        if cutting {
                            break;
                        }
                    }
                    let _ = c_in.shutdown(Shutdown::Both);
                    let _ = s_out.shutdown(Shutdown::Write);
                });
                std::thread::spawn(move || {
                    let mut buf = [0u8; 65536];
                    while let Ok(n @ 1..) = s_in.read(&mut buf) {
                        if cut.load(Ordering::SeqCst) || c_out.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = c_out.shutdown(Shutdown::Both);
                });
            }
        });
        Proxy { port, armed, batch }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// Arms it for the batch command IDEM.MDONE as well.
    #[allow(dead_code)] // the conformance runner cuts single DONEs only
    pub fn arm_batch(&self) {
        self.batch.store(true, Ordering::SeqCst);
        self.arm();
    }
}
