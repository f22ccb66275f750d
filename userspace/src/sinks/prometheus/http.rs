//! The `/metrics` HTTP endpoint: hyper's HTTP/1 server with a header-read
//! timeout, a whole-connection deadline and a cap on connections; TLS and basic
//! authentication as the web config file says ([`super::web`]).
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};

use super::web::{Active, Web};
use super::{MetricsHandle, CONTENT_TYPE};

/// Parse a listen address; a bare port means loopback.
pub fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    let s = s.trim();
    if let Ok(p) = s.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], p)));
    }
    s.parse::<SocketAddr>().map_err(|_| {
        format!("'{s}' is not a listen address: give IP:PORT, e.g. 127.0.0.1:9464 or [::1]:9464")
    })
}

/// Length of the `/metrics` listener's accept queue (the kernel caps it at
/// `net.core.somaxconn`, 4096 by default since 5.4). Connections beyond
/// [`ServeLimits::max_conns`] wait there; tokio's default of 1,024 made the
/// rest of 2,000 concurrent scrapers lose their handshake's last ACK and wait
/// for a SYN-ACK retransmission (1 s, 3 s, ...: docs/PERFORMANCE.md).
pub const ACCEPT_BACKLOG: u32 = 4096;

/// Bind the `/metrics` listener (before capabilities are dropped).
pub async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener> {
    let listen = || -> std::io::Result<tokio::net::TcpListener> {
        let sock = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        // As tokio's own bind (mio sets it): a restarted daemon rebinds its port
        // while the old connections sit in TIME_WAIT.
        sock.set_reuseaddr(true)?;
        sock.bind(addr)?;
        sock.listen(ACCEPT_BACKLOG)
    };
    listen().with_context(|| format!("cannot listen for /metrics on {addr}"))
}

/// The bound `/metrics` socket and the web config it is served with (None: plain HTTP).
pub struct Listener {
    pub tcp: tokio::net::TcpListener,
    pub web: Option<Arc<Web>>,
}

impl Listener {
    /// Plain HTTP without authentication.
    pub fn plain(tcp: tokio::net::TcpListener) -> Listener {
        Listener { tcp, web: None }
    }
}

/// How the `/metrics` server bounds what clients can hold.
#[derive(Clone, Copy, Debug)]
pub struct ServeLimits {
    /// Connections served at once; more wait in the kernel's accept queue.
    pub max_conns: usize,
    /// A client must send its whole request head within this time of
    /// connecting, or the connection is closed (half-sent and idle
    /// connections alike).
    pub header_read_timeout: Duration,
    /// Everything, including writing the answer to a slow reader, ends
    /// within this time of accepting the connection.
    pub conn_timeout: Duration,
}

impl ServeLimits {
    /// The daemon's limits (docs/metrics.md, docs/security.md).
    pub const DEFAULT: ServeLimits = ServeLimits {
        max_conns: 256,
        header_read_timeout: Duration::from_secs(5),
        conn_timeout: Duration::from_secs(10),
    };
}

/// Largest request head accepted (hyper's minimum read buffer): larger is
/// answered 431.
const MAX_REQUEST: usize = 8192;

/// The `/metrics` server on a thread of its own, with its own runtime, until
/// dropped. observe's runtime has one thread and its kernel reads are
/// synchronous: a server task beside them waited for each read to end (one
/// scrape took 656 ms at 100,000 flows read every second, and 2,000
/// scrapers got ~290 answers a second; docs/PERFORMANCE.md). Spawn it after
/// the privileges are dropped: a thread keeps the capabilities it started with.
pub struct ServerThread {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// bcrypt checks run at once (tokio's blocking pool of the server's runtime); more wait.
const BCRYPT_THREADS: usize = 2;

/// Start [`serve`] on a [`ServerThread`] (the listener moves to its runtime), and the
/// web config's polling ([`Web::watch`]) beside it.
pub fn serve_on_thread(listener: Listener, handle: MetricsHandle) -> Result<ServerThread> {
    let web = listener.web;
    let listener = listener
        .tcp
        .into_std()
        .context("moving the /metrics listener to its thread")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(BCRYPT_THREADS)
        .build()
        .context("starting the /metrics server's runtime")?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("metrics-http".into())
        .spawn(move || {
            rt.block_on(async move {
                let listener = match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::warn!("/metrics is not served: {e}");
                        return;
                    }
                };
                let watch = web
                    .clone()
                    .map(|w| tokio::spawn(w.watch(super::web::POLL_EVERY)));
                tokio::select! {
                    _ = serve_with(listener, handle, ServeLimits::DEFAULT, web) => {}
                    _ = stopped => {}
                }
                if let Some(w) = watch {
                    w.abort();
                }
            })
        })
        .context("starting the /metrics server's thread")?;
    Ok(ServerThread {
        stop: Some(stop),
        thread: Some(thread),
    })
}

impl Drop for ServerThread {
    /// Stop accepting, end the connections being served, join the thread.
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Serve `/metrics` until the task is dropped, with [`ServeLimits::DEFAULT`], plain HTTP.
pub async fn serve(listener: tokio::net::TcpListener, handle: MetricsHandle) {
    serve_with(listener, handle, ServeLimits::DEFAULT, None).await
}

/// Serve `/metrics` with hyper's HTTP/1 server: GET/HEAD only, one request
/// per connection (Connection: close), a header-read timeout, a bounded
/// request head, a whole-connection deadline and a cap on connections held
/// at once. Malformed requests are answered 400 (431 when too large) by
/// hyper's parser. With `web`, each connection is served as the web config in
/// force when it was accepted says: a TLS handshake (within the header-read
/// timeout, inside the connection's deadline), then basic authentication.
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    handle: MetricsHandle,
    limits: ServeLimits,
    web: Option<Arc<Web>>,
) {
    let sem = Arc::new(tokio::sync::Semaphore::new(limits.max_conns));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(false)
        .half_close(false)
        .title_case_headers(true)
        .max_buf_size(MAX_REQUEST);
    let http = Arc::new(http);
    loop {
        let Ok(permit) = sem.clone().acquire_owned().await else {
            return;
        };
        let (sock, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("accepting a /metrics connection: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let conn = Conn {
            handle: handle.clone(),
            active: web.as_ref().map(|w| w.current()),
            web: web.clone(),
        };
        let http = http.clone();
        tokio::spawn(async move {
            // Errors (handshake and header timeouts, parse errors already answered,
            // resets) only end the connection.
            let served = conn.serve(sock, &http, limits.header_read_timeout);
            let _ = tokio::time::timeout(limits.conn_timeout, served).await;
            drop(permit);
        });
    }
}

/// One accepted connection and the configuration it is served with.
#[derive(Clone)]
struct Conn {
    handle: MetricsHandle,
    /// The web config in force when accepted (None: plain, no authentication).
    active: Option<Arc<Active>>,
    web: Option<Arc<Web>>,
}

impl Conn {
    /// The TLS handshake if configured, within `handshake_timeout` (a refusal counted),
    /// then one HTTP exchange.
    async fn serve(
        self,
        sock: tokio::net::TcpStream,
        http: &hyper::server::conn::http1::Builder,
        handshake_timeout: Duration,
    ) {
        let Some(acceptor) = self.active.as_ref().and_then(|a| a.tls.clone()) else {
            return self.http(sock, http).await;
        };
        match tokio::time::timeout(handshake_timeout, acceptor.accept(sock)).await {
            Ok(Ok(tls)) => self.http(tls, http).await,
            _ => self.refused("tls_handshake"),
        }
    }

    async fn http<IO>(self, io: IO, http: &hyper::server::conn::http1::Builder)
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let service = hyper::service::service_fn(move |req| {
            let conn = self.clone();
            async move { Ok::<_, std::convert::Infallible>(conn.answer(req).await) }
        });
        let _ = http
            .serve_connection(hyper_util::rt::TokioIo::new(io), service)
            .await;
    }

    /// 401 without the credentials the web config asks for; else the answer, with the
    /// web config's headers.
    async fn answer<B>(&self, req: hyper::Request<B>) -> hyper::Response<Body> {
        let header = req
            .headers()
            .get(hyper::header::AUTHORIZATION)
            .map(|v| v.as_bytes().to_vec());
        let mut res = match self.authorized(header).await {
            true => answer(&req, &self.handle),
            false => {
                self.refused("unauthorized");
                unauthorized()
            }
        };
        if let Some(a) = &self.active {
            for (k, v) in &a.headers {
                res.headers_mut().insert(k.clone(), v.clone());
            }
        }
        res
    }

    /// Whether basic authentication, if configured, lets this request in (bcrypt on the
    /// runtime's blocking pool, [`BCRYPT_THREADS`] at once).
    async fn authorized(&self, header: Option<Vec<u8>>) -> bool {
        let (Some(active), Some(web)) = (&self.active, &self.web) else {
            return true;
        };
        let Some(users) = &active.users else {
            return true;
        };
        let header = header.as_deref();
        super::web::auth::allowed(users, &web.cache, header, |password, hash| async move {
            tokio::task::spawn_blocking(move || super::web::auth::bcrypt_matches(&password, &hash))
                .await
                .unwrap_or(false)
        })
        .await
    }

    fn refused(&self, reason: &str) {
        if let Some(w) = &self.web {
            w.stats.refused(reason);
        }
    }
}

/// 401 with `WWW-Authenticate: Basic` (what exporter-toolkit answers).
fn unauthorized() -> hyper::Response<Body> {
    let mut res = hyper::Response::new(Body::new("Unauthorized\n".into()));
    *res.status_mut() = hyper::StatusCode::UNAUTHORIZED;
    let h = res.headers_mut();
    h.insert(
        hyper::header::WWW_AUTHENTICATE,
        hyper::header::HeaderValue::from_static("Basic"),
    );
    h.insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    res
}

type Body = http_body_util::Full<hyper::body::Bytes>;
type Bytes = hyper::body::Bytes;

/// The Prometheus text format (0.0.4), what a scraper gets unless it asks
/// for OpenMetrics or protobuf.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The exposition formats `/metrics` serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// The Prometheus text format 0.0.4 (the default).
    Text,
    /// OpenMetrics text 1.0.
    OpenMetrics,
    /// Delimited `io.prometheus.client.MetricFamily` protobuf: native histograms.
    Protobuf,
}

/// The format an `Accept` header asks for: the supported media type with
/// the highest `q` (ties: protobuf, then OpenMetrics, then text; what
/// Prometheus sends with native histograms enabled picks protobuf).
pub fn negotiate(accept: Option<&str>) -> Format {
    let mut best = (0.0f64, Format::Text);
    for entry in accept.unwrap_or("").split(',') {
        let mut parts = entry.split(';').map(str::trim);
        let media = parts.next().unwrap_or("").to_ascii_lowercase();
        let params: Vec<String> = parts
            .map(|p| p.replace(' ', "").to_ascii_lowercase())
            .collect();
        let q = params
            .iter()
            .find_map(|p| p.strip_prefix("q=").and_then(|v| v.parse::<f64>().ok()))
            .unwrap_or(1.0);
        let format = match media.as_str() {
            "application/vnd.google.protobuf"
                if params
                    .iter()
                    .any(|p| p == "proto=io.prometheus.client.metricfamily")
                    && params.iter().any(|p| p == "encoding=delimited") =>
            {
                Format::Protobuf
            }
            "application/openmetrics-text" => Format::OpenMetrics,
            _ => continue,
        };
        let rank = |f: Format| match f {
            Format::Protobuf => 2,
            Format::OpenMetrics => 1,
            Format::Text => 0,
        };
        if q > best.0 || (q == best.0 && q > 0.0 && rank(format) > rank(best.1)) {
            best = (q, format);
        }
    }
    best.1
}

/// The status, content type and body for a request's method, path and
/// wanted format, from the last render (hyper has already parsed the
/// request; malformed ones never get here).
pub fn respond(
    method: &str,
    path: &str,
    handle: Option<&MetricsHandle>,
    format: Format,
) -> (u16, &'static str, Bytes) {
    if method != "GET" && method != "HEAD" {
        return (
            405,
            "text/plain; charset=utf-8",
            "only GET and HEAD\n".into(),
        );
    }
    if path != "/metrics" {
        return (
            404,
            "text/plain; charset=utf-8",
            "not found: try /metrics\n".into(),
        );
    }
    let Some(h) = handle else {
        return (200, CONTENT_TYPE, "# EOF\n".into());
    };
    let r = h.scrape();
    match format {
        Format::Protobuf => (200, super::proto::CONTENT_TYPE, r.protobuf.clone()),
        Format::OpenMetrics => (200, CONTENT_TYPE, r.openmetrics.clone()),
        Format::Text => (200, TEXT_CONTENT_TYPE, r.text.clone()),
    }
}

/// Whether an `Accept` header asks for OpenMetrics (Prometheus sends
/// `application/openmetrics-text;version=1.0.0,...` when it prefers it).
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    negotiate(accept) == Format::OpenMetrics
}

/// OpenMetrics text as the Prometheus text format: no `# EOF` and no
/// `# UNIT` lines, and a counter family's `# TYPE`/`# HELP` named like its
/// samples (`..._total`), as the text format requires.
pub fn to_text_format(om: &str) -> String {
    let mut counters = std::collections::HashSet::new();
    for l in om.lines() {
        if let Some(rest) = l.strip_prefix("# TYPE ") {
            if let Some(name) = rest.strip_suffix(" counter") {
                counters.insert(name.to_string());
            }
        }
    }
    let mut out = String::with_capacity(om.len());
    for l in om.lines() {
        if l == "# EOF" || l.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# TYPE ", "# HELP "]
            .iter()
            .find_map(|p| l.strip_prefix(p).map(|rest| (*p, rest)));
        if let Some((prefix, rest)) = meta {
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            if counters.contains(name) && !name.ends_with("_total") {
                out.push_str(&format!("{prefix}{name}_total {tail}\n"));
                continue;
            }
        }
        out.push_str(l);
        out.push('\n');
    }
    out
}

fn answer<B>(req: &hyper::Request<B>, h: &MetricsHandle) -> hyper::Response<Body> {
    let accept = req
        .headers()
        .get(hyper::header::ACCEPT)
        .and_then(|v| v.to_str().ok());
    let (code, ctype, body) = respond(
        req.method().as_str(),
        req.uri().path(),
        Some(h),
        negotiate(accept),
    );
    let mut res = hyper::Response::new(Body::new(body));
    *res.status_mut() =
        hyper::StatusCode::from_u16(code).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    let headers = res.headers_mut();
    headers.insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(ctype),
    );
    if code == 405 {
        headers.insert(
            hyper::header::ALLOW,
            hyper::header::HeaderValue::from_static("GET, HEAD"),
        );
    }
    res
}

#[cfg(test)]
mod tests {
    use super::super::{Exporter, LabelPolicy};
    use super::*;
    use std::time::Instant;
    #[test]
    fn http_responses() {
        let ex = Exporter::new(LabelPolicy::default()).unwrap();
        ex.render();
        let h = ex.handle();
        let om = Format::OpenMetrics;
        let (c, t, b) = respond("GET", "/metrics", Some(&h), om);
        assert_eq!((c, t), (200, CONTENT_TYPE));
        let b = String::from_utf8_lossy(&b);
        assert!(b.contains("# TYPE rttscope_rtt_seconds histogram"), "{b}");
        assert_eq!(respond("HEAD", "/metrics", Some(&h), om).0, 200);
        assert_eq!(respond("GET", "/", Some(&h), om).0, 404);
        assert_eq!(respond("GET", "/metricsx", Some(&h), om).0, 404);
        assert_eq!(respond("POST", "/metrics", Some(&h), om).0, 405);
        let (c, t, b) = respond("GET", "/metrics", Some(&h), Format::Protobuf);
        assert_eq!((c, t), (200, super::super::proto::CONTENT_TYPE));
        let fams = super::super::proto::decode(&b).unwrap();
        assert!(fams.iter().any(|f| f.name == "rttscope_rtt_seconds"));
    }

    #[test]
    fn accept_negotiation() {
        // What Prometheus 2.53 sends with --enable-feature=native-histograms.
        let prom = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,application/openmetrics-text;version=1.0.0;q=0.6,application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.1";
        assert_eq!(negotiate(Some(prom)), Format::Protobuf);
        // ... and without it.
        let plain = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(negotiate(Some(plain)), Format::OpenMetrics);
        assert_eq!(negotiate(None), Format::Text);
        assert_eq!(negotiate(Some("text/plain")), Format::Text);
        // Protobuf of another message, or not delimited: not ours.
        assert_eq!(
            negotiate(Some(
                "application/vnd.google.protobuf;proto=x.Y;encoding=delimited"
            )),
            Format::Text
        );
        assert_eq!(
            negotiate(Some("application/openmetrics-text;q=0.9, application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited; q=0.5")),
            Format::OpenMetrics
        );
    }

    /// Send raw bytes, read until the server closes: (status, head, body).
    async fn exchange(addr: SocketAddr, req: &[u8]) -> (u16, String, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(req).await.unwrap();
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out))
            .await
            .expect("server closes after one answer")
            .unwrap();
        let out = String::from_utf8_lossy(&out).to_string();
        let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
        let code = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        (code, head.to_string(), body.to_string())
    }

    /// observe's runtime thread busy in a kernel read (here: asleep, the
    /// runtime not polled) does not hold up a scrape: it is answered before
    /// the busy spell ends; after the server is dropped nothing accepts.
    #[test]
    fn metrics_are_served_while_the_observer_thread_is_busy() {
        use std::io::{Read, Write};
        use std::sync::atomic::{AtomicBool, Ordering};
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let ex = Exporter::new(LabelPolicy::default()).unwrap();
        ex.render();
        let (server, addr) = rt.block_on(async {
            let l = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
            let a = l.local_addr().unwrap();
            (serve_on_thread(Listener::plain(l), ex.handle()).unwrap(), a)
        });
        let busy_over = Arc::new(AtomicBool::new(false));
        let over = busy_over.clone();
        let scraper = std::thread::spawn(move || {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                .unwrap();
            let mut out = Vec::new();
            let _ = s.read_to_end(&mut out);
            (over.load(Ordering::SeqCst), out)
        });
        std::thread::sleep(Duration::from_secs(5)); // the "kernel read"
        busy_over.store(true, Ordering::SeqCst);
        let (answered_after, out) = scraper.join().unwrap();
        let head = String::from_utf8_lossy(&out[..out.len().min(200)]).to_string();
        assert!(out.starts_with(b"HTTP/1.1 200 "), "answer: {head}");
        assert!(
            !answered_after,
            "the scrape was answered only after the observer's thread was free again"
        );
        drop(server);
        assert!(
            std::net::TcpStream::connect(addr).is_err(),
            "still accepting after the server was dropped"
        );
    }

    /// The listener's accept queue is ACCEPT_BACKLOG long (or somaxconn's cap),
    /// as `ss -ltn` prints it (Send-Q of a listening socket), not tokio's 1,024.
    #[tokio::test]
    async fn listener_accept_queue_holds_a_scrape_storm() {
        let l = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let port = l.local_addr().unwrap().port();
        let cap: u32 = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(4096);
        let Ok(out) = std::process::Command::new("ss")
            .args(["-Hltn", &format!("sport = :{port}")])
            .output()
        else {
            eprintln!("skipped: no ss");
            return;
        };
        let text = String::from_utf8_lossy(&out.stdout);
        let send_q: Vec<u32> = text
            .lines()
            .filter_map(|l| l.split_whitespace().nth(2)?.parse().ok())
            .collect();
        assert_eq!(
            send_q,
            vec![ACCEPT_BACKLOG.min(cap)],
            "ss -ltn printed: {text}"
        );
    }

    /// The hyper server on loopback: status codes, headers and body as the
    /// hand-written responder had them; half-sent and idle connections are
    /// closed at the header-read timeout.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn http_server_on_loopback() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let ex = Exporter::new(LabelPolicy::default()).unwrap();
        ex.render();
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let limits = ServeLimits {
            max_conns: 8,
            header_read_timeout: Duration::from_millis(400),
            conn_timeout: Duration::from_secs(5),
        };
        let server = tokio::spawn(serve_with(l, ex.handle(), limits, None));

        let (c, head, body) = exchange(
            addr,
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\n\r\n",
        )
        .await;
        assert_eq!(c, 200, "{head}");
        assert!(
            head.contains(&format!("Content-Type: {CONTENT_TYPE}")),
            "{head}"
        );
        assert!(
            head.contains(&format!("Content-Length: {}", body.len())),
            "{head}"
        );
        assert!(head.contains("Connection: close"), "{head}");
        assert!(body.ends_with("# EOF\n"), "{body}");
        // No Accept header: the Prometheus text format.
        let (c, head, body) = exchange(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert_eq!(c, 200, "{head}");
        assert!(
            head.contains(&format!("Content-Type: {TEXT_CONTENT_TYPE}")),
            "{head}"
        );
        assert!(
            !body.contains("# EOF") && !body.contains("# UNIT"),
            "{body}"
        );
        let (c, head, body) = exchange(addr, b"HEAD /metrics?x=1 HTTP/1.0\r\n\r\n").await;
        assert_eq!(c, 200, "{head}");
        assert!(body.is_empty(), "HEAD has no body: {body}");
        let (c, _, body) = exchange(addr, b"GET /metricsx HTTP/1.1\r\n\r\n").await;
        assert_eq!((c, body.as_str()), (404, "not found: try /metrics\n"));
        let (c, head, _) =
            exchange(addr, b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n").await;
        assert_eq!(c, 405, "{head}");
        assert!(head.contains("Allow: GET, HEAD"), "{head}");
        assert_eq!(exchange(addr, b"garbage\r\n\r\n").await.0, 400);
        assert_eq!(
            exchange(addr, b"GET /metrics HTTP/2.0\r\n\r\n").await.0,
            400
        );
        let mut big = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
        big.extend(std::iter::repeat_n(b'a', 3 * MAX_REQUEST));
        big.extend(b"\r\n\r\n");
        assert_eq!(exchange(addr, &big).await.0, 431);

        // More half-sent and idle connections than the cap: all are closed
        // at the header-read timeout, and a scrape after them is answered.
        let t0 = Instant::now();
        let mut held = Vec::new();
        for i in 0..12 {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            if i % 3 != 0 {
                s.write_all(b"GET /metr").await.unwrap();
            }
            held.push(s);
        }
        for mut s in held {
            let mut b = [0u8; 64];
            let r = tokio::time::timeout(Duration::from_secs(3), s.read(&mut b)).await;
            assert!(
                matches!(r, Ok(Ok(0)) | Ok(Err(_))),
                "held connection not closed: {r:?} after {:?}",
                t0.elapsed()
            );
        }
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_millis(350) && took < Duration::from_millis(2000),
            "closed after {took:?}, timeout 400 ms (two rounds: 12 connections, cap 8)"
        );
        let (c, _, body) = exchange(addr, b"GET /metrics HTTP/1.1\r\n\r\n").await;
        assert_eq!(c, 200);
        assert!(
            body.contains("# TYPE rttscope_rtt_seconds histogram"),
            "{body}"
        );
        server.abort();
    }

    #[test]
    fn listen_addresses() {
        assert_eq!(
            parse_listen("9464").unwrap(),
            "127.0.0.1:9464".parse().unwrap()
        );
        assert_eq!(
            parse_listen("[::1]:9464").unwrap(),
            "[::1]:9464".parse().unwrap()
        );
        let e = parse_listen("localhost").unwrap_err();
        assert!(e.contains("not a listen address"), "{e}");
    }

    /// The text format passes `promtool check metrics` (Prometheus' own
    /// linter: `apt-get install prometheus`, which scripts/setup.sh does);
    /// a counter's TYPE and HELP carry its `_total` name.
    #[test]
    fn text_format_passes_promtool() {
        let mut ex = Exporter::new(LabelPolicy::default()).unwrap();
        ex.set_process_stats();
        let text = to_text_format(&ex.encode());
        assert!(
            text.contains("# TYPE process_cpu_seconds_total counter"),
            "{text}"
        );
        assert!(!text.contains("# EOF"), "{text}");
        assert!(!wants_openmetrics(None));
        assert!(!wants_openmetrics(Some("text/plain;version=0.0.4")));
        assert!(wants_openmetrics(Some(
            "application/openmetrics-text;version=1.0.0,text/plain;q=0.5"
        )));
        let Ok(mut child) = std::process::Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
        else {
            // Only where promtool is missing: the e2e metrics test insists on it.
            eprintln!("promtool not installed: skipped");
            return;
        };
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "promtool check metrics: {}{}\n{text}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
