//! A busy host for the end-to-end tests: background load that a test's own counts must NOT
//! include (issue 27). Any test switches it on with [`BusyHost::start`] before it starts its
//! observer; `RTTSCOPE_E2E_BUSY=0` turns it off (the test then runs on a clean testbed).
//!
//! The load, all started before the observer and running until drop:
//! - other long-lived connections to the same server and port from the test's client namespace
//!   (`rttscope probe tcp-rr` against `rttscope serve`, or the harness's own [`RrClient`]
//!   against an [`RrServer`]), paced at 10 ms;
//! - pings from the client namespace to the same server address (ping's own identifier);
//! - traffic in other namespaces: a second veth pair with the same addresses, a request/response
//!   flow on the same port and pings between its ends.
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};

use crate::{Pair, RrClient, RrServer};

/// What answers on the server port the load connects to.
#[derive(Debug, Clone, Copy)]
pub enum Responder {
    /// `rttscope serve` (its hello protocol): the load runs `rttscope probe tcp-rr`.
    Rttscope,
    /// The harness's [`RrServer`] (1-byte request, `resp`-byte response).
    Plain { resp: usize },
}

/// The background load; everything stops on drop.
#[derive(Default)]
pub struct BusyHost {
    kids: Vec<Child>,
    clients: Vec<RrClient>,
    servers: Vec<RrServer>,
    other: Option<Pair>,
    /// What runs, for failure messages.
    pub what: Vec<String>,
}

/// Whether the busy-host load is on (default on; `RTTSCOPE_E2E_BUSY=0` turns it off).
pub fn enabled() -> bool {
    std::env::var("RTTSCOPE_E2E_BUSY").map_or(true, |v| v != "0")
}

impl BusyHost {
    /// Load beside the test's flows from `pair.a` to `server` (in `pair.b`), answered by
    /// `responder`. Returns an idle `BusyHost` when the load is switched off.
    pub fn start(pair: &Pair, server: SocketAddr, responder: Responder) -> Result<BusyHost> {
        let mut b = BusyHost::default();
        if !enabled() {
            b.what
                .push("busy-host load off (RTTSCOPE_E2E_BUSY=0)".into());
            return Ok(b);
        }
        for _ in 0..2 {
            match responder {
                Responder::Rttscope => b.spawn(
                    pair.a
                        .command(crate::rttscope_bin().to_str().unwrap())
                        .args([
                            "probe",
                            "tcp-rr",
                            &server.ip().to_string(),
                            "-p",
                            &server.port().to_string(),
                            "-l",
                            "600",
                            "-w",
                            "10ms",
                        ]),
                )?,
                Responder::Plain { resp } => {
                    b.clients.push(
                        RrClient::start(&pair.a, server, resp, Duration::from_millis(10))
                            .context("busy host: a second connection to the server port")?,
                    );
                }
            }
        }
        b.what.push(format!(
            "2 other connections to {server} from {}",
            pair.a.name
        ));
        b.ping(&pair.a, server.ip())?;
        b.other_namespaces(server)?;
        // Let the load's connections be established (opened before the test's observer).
        std::thread::sleep(Duration::from_millis(300));
        Ok(b)
    }

    fn spawn(&mut self, cmd: &mut Command) -> Result<()> {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("busy host: spawning load")?;
        self.kids.push(child);
        Ok(())
    }

    /// Run `cmd` (e.g. a ping inside the lab's testbed) as more load until drop, described as
    /// `what`. Nothing when the load is switched off.
    pub fn also_run(&mut self, cmd: &mut Command, what: &str) -> Result<()> {
        if enabled() {
            self.spawn(cmd)?;
            self.what.push(what.to_string());
        }
        Ok(())
    }

    /// Pings every 20 ms from `ns` to `ip` (ping's own echo identifier), beside the load
    /// [`BusyHost::start`] runs (e.g. to the peer's other address family). Nothing when the
    /// load is switched off.
    pub fn also_ping(&mut self, ns: &crate::NetNs, ip: std::net::IpAddr) -> Result<()> {
        if enabled() {
            self.ping(ns, ip)?;
        }
        Ok(())
    }

    /// Pings every 20 ms from `ns` to `ip` (ping's own echo identifier).
    fn ping(&mut self, ns: &crate::NetNs, ip: std::net::IpAddr) -> Result<()> {
        let fam = if ip.is_ipv6() { "-6" } else { "-4" };
        self.spawn(
            ns.command("ping")
                .args([fam, "-q", "-i", "0.02", "-w", "600"])
                .arg(ip.to_string()),
        )?;
        self.what
            .push(format!("ping -i 0.02 {ip} from {}", ns.name));
        Ok(())
    }

    /// A second veth pair (the same addresses, other namespaces) with a request/response flow on
    /// the same port and pings between its ends.
    fn other_namespaces(&mut self, server: SocketAddr) -> Result<()> {
        let o = Pair::new().context("busy host: other namespaces")?;
        let addr = if server.is_ipv6() {
            SocketAddr::new(crate::B_ADDR6.parse().unwrap(), server.port())
        } else {
            SocketAddr::new(crate::B_ADDR.parse().unwrap(), server.port())
        };
        self.servers.push(RrServer::start(&o.b, addr, 1)?);
        self.clients
            .push(RrClient::start(&o.a, addr, 1, Duration::from_millis(5))?);
        self.ping(&o.a, addr.ip())?;
        self.what.push(format!(
            "request/response flow to {addr} and pings in other namespaces {}/{}",
            o.a.name, o.b.name
        ));
        self.other = Some(o);
        Ok(())
    }

    /// One line saying what ran beside the test.
    pub fn describe(&self) -> String {
        if self.what.is_empty() {
            "no busy-host load".into()
        } else {
            format!("busy-host load: {}", self.what.join("; "))
        }
    }
}

impl Drop for BusyHost {
    fn drop(&mut self) {
        for k in self.kids.iter_mut() {
            let _ = k.kill();
            let _ = k.wait();
        }
        // Clients before servers (they join their threads), then the namespaces.
        self.clients.clear();
        self.servers.clear();
        self.other.take();
    }
}
