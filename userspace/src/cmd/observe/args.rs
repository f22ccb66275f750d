//! `rttscope observe`'s options.
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::analysis::units::duration_arg;
use crate::views::{LoaderKind, Scope, ViewArgs, ViewKind};

#[derive(Debug, Clone, Args)]
pub struct ObserveArgs {
    /// Only these network namespaces (names under /var/run/netns, or `host`); repeatable.
    #[arg(long = "netns", value_name = "NAME")]
    pub netns: Vec<String>,
    /// Also enable existing connections in every network namespace [default: the current one and the --netns ones].
    #[arg(long)]
    pub all_netns: bool,
    /// cgroup v2 directory to attach the sock_ops program to [default: the cgroup v2 root].
    #[arg(long, value_name = "PATH")]
    pub cgroup: Option<PathBuf>,
    /// Only connections with this local or remote port; repeatable.
    #[arg(long = "port", value_name = "N")]
    pub ports: Vec<u16>,
    /// Only connections with a local or remote address in this CIDR; repeatable.
    #[arg(long = "addr", value_name = "CIDR")]
    pub addrs: Vec<ipnet::IpNet>,
    /// Report interval (a duration with a unit: 500ms, 1s, 1min).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = duration_arg)]
    pub interval: Duration,
    /// Stop after this long, a duration with a unit [default: until Ctrl-C or SIGTERM].
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    pub duration: Option<Duration>,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
    /// Also stream every raw sample (ring buffer) to the output (not with --format cloud-monitoring).
    #[arg(long)]
    pub raw: bool,
    /// Capacity of the per-flow tables (TCP view: when nearly full, the least recently active flows are evicted; sampler view: the flow table, rounded up to a power of two; each entry holds a flow's pending segments).
    #[arg(long, value_name = "N", default_value_t = 16384)]
    pub max_flows: u32,
    /// Each view's own options and `--view` (`views/<view>/options.rs`, through the registry).
    #[command(flatten)]
    pub view_opts: ViewArgs,
    /// Also aggregate each view like the cloud metric: a distribution per alignment period with
    /// percentile-aligner interpolation (layout --cloud-layout, period --cloud-period).
    #[arg(long)]
    pub cloud_buckets: bool,
    /// Bucket layout for --cloud-buckets (see `rttscope bucket --help`).
    #[arg(long, value_name = "LAYOUT", default_value = "vm_flow", value_parser = crate::analysis::dist::layout_arg)]
    pub cloud_layout: crate::analysis::dist::BucketOptions,
    /// Alignment period for --cloud-buckets, a duration with a unit (the metric API's default).
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = crate::analysis::units::period_arg)]
    pub cloud_period: Duration,
    /// BPF loader: libbpf (libbpf-rs over C libbpf) or aya (pure Rust); see docs/loaders.md.
    // Offered only in builds with aya; otherwise the one loader built in.
    #[cfg_attr(feature = "aya", arg(long, value_enum, env = "RTTSCOPE_LOADER", default_value_t = LoaderKind::DEFAULT))]
    #[cfg_attr(not(feature = "aya"), arg(skip = LoaderKind::DEFAULT))]
    pub loader: LoaderKind,
    // --- daemon mode (sinks/prometheus, cmd/observe/config.rs, sys/caps.rs) ---
    /// Read options from this TOML file (flags given on the command line win).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Validate --config FILE, print the result and exit.
    #[arg(long, requires = "config")]
    pub check_config: bool,
    /// Serve Prometheus /metrics on this address (bare --listen: 127.0.0.1:9464; other addresses must be given explicitly).
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = crate::sinks::prometheus::DEFAULT_LISTEN, value_parser = crate::sinks::prometheus::http::parse_listen)]
    pub listen: Option<std::net::SocketAddr>,
    /// Serve /metrics as this web config file says: TLS, client certificates, basic-auth users
    /// (Prometheus exporter-toolkit's YAML: tls_server_config, basic_auth_users,
    /// http_server_config); re-read when it changes (docs/metrics.md#tls-and-authentication).
    #[arg(long, value_name = "PATH", requires = "listen")]
    pub web_config_file: Option<PathBuf>,
    /// Push the metrics over OTLP/HTTP (protobuf) to this http:// or https:// URL: an OpenTelemetry Collector (http://127.0.0.1:4318) or any OTLP receiver (Prometheus: http://HOST:9090/api/v1/otlp/v1/metrics); RTT as exponential histograms. Bare --otlp: the URL from OTEL_EXPORTER_OTLP_METRICS_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT (default http://localhost:4318). Every other OTLP option not given falls back to its OTEL_EXPORTER_OTLP_* variable (docs/metrics.md).
    #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = "")]
    pub otlp: Option<String>,
    /// How often to push OTLP, a duration with a unit [default: --interval].
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    pub otlp_interval: Option<Duration>,
    /// An HTTP header of every OTLP request, NAME=VALUE (e.g. 'Authorization=Bearer ...'); repeatable. The value is never printed; a command line is visible to every user of the host, so prefer OTEL_EXPORTER_OTLP_HEADERS or the TOML file [default: OTEL_EXPORTER_OTLP_HEADERS].
    #[arg(long = "otlp-header", value_name = "NAME=VALUE", value_parser = crate::sinks::otlp::settings::header_arg)]
    pub otlp_headers: Vec<crate::sinks::otlp::settings::HeaderArg>,
    /// https:// OTLP: trust the CA certificates in this PEM file instead of the system's [default: OTEL_EXPORTER_OTLP_CERTIFICATE].
    #[arg(long, value_name = "FILE")]
    pub otlp_ca_file: Option<PathBuf>,
    /// https:// OTLP: present this client certificate chain (PEM), with --otlp-client-key (mTLS) [default: OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE].
    #[arg(long, value_name = "FILE")]
    pub otlp_client_cert: Option<PathBuf>,
    /// https:// OTLP: the client certificate's private key (PEM; keep it mode 0640) [default: OTEL_EXPORTER_OTLP_CLIENT_KEY].
    #[arg(long, value_name = "FILE")]
    pub otlp_client_key: Option<PathBuf>,
    /// An OTLP request not answered within this time fails, a duration with a unit [default: OTEL_EXPORTER_OTLP_TIMEOUT, else 10s].
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    pub otlp_timeout: Option<Duration>,
    /// Compress OTLP request bodies [default: OTEL_EXPORTER_OTLP_COMPRESSION, else none].
    #[arg(long, value_name = "HOW", value_enum)]
    pub otlp_compression: Option<crate::sinks::otlp::settings::Compression>,
    /// Metrics labels: remote IPv4 addresses aggregated to this prefix length [default: 24].
    #[arg(long, value_name = "BITS", value_parser = clap::value_parser!(u8).range(0..=32))]
    pub v4_prefix: Option<u8>,
    /// Metrics labels: remote IPv6 addresses aggregated to this prefix length [default: 48].
    #[arg(long, value_name = "BITS", value_parser = clap::value_parser!(u8).range(0..=128))]
    pub v6_prefix: Option<u8>,
    /// Metrics labels: keep this local port as a label value (others: "other"); repeatable.
    #[arg(long = "label-port", value_name = "N")]
    pub label_ports: Vec<u16>,
    /// Name flows by their owners: the socket's cgroup (the sampler's flows: their local
    /// socket's) as a systemd unit, a container, a Kubernetes pod (labels unit, container, pod_namespace, pod, qos; the `workload` of
    /// --format json and the result document), and unnamed network namespaces by the pod or
    /// container that holds them (docs/deploy.md#labels).
    #[arg(long)]
    pub label_workload: bool,
    /// Name remote addresses from FILE: `CIDR[:PORT] NAME` lines, or the JSON of `kubectl get
    /// services,pods,endpointslices -A -o json`; re-read when it changes (the table's
    /// `remote_name`, the records', the `remote_name` label; docs/observe.md#remote-names).
    #[arg(long, value_name = "FILE")]
    pub names: Option<PathBuf>,
    /// Metrics labels: the backend a NATed connection was translated to (`backend_prefix`,
    /// cut as remote_prefix); off by default (a label set per backend).
    #[arg(long)]
    pub label_backend: bool,
    /// Metrics labels: at most this many RTT label sets; more go to an overflow series [default: 1000].
    #[arg(long, value_name = "N")]
    pub max_series: Option<usize>,
    /// Metrics labels: remove a label set idle for this long, a duration with a unit [default: 10min].
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    pub series_idle: Option<Duration>,
    /// At the end, save the whole run as a result document (every view and side, every flow,
    /// settings, counters; the raw samples with --raw; docs/results.md) to FILE; `-` prints it
    /// on standard output and sends everything else observe prints to stderr.
    #[arg(short = 'o', long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Nothing on standard output but the --json - document: no header, table, raw sample
    /// lines nor closing line (daemon mode: metrics only; --raw samples only into --json's
    /// document). Refused with --format json or cloud-monitoring.
    #[arg(long)]
    pub quiet: bool,
    /// Turn on kernel BPF run-time statistics while running (needs CAP_SYS_ADMIN; else set sysctl kernel.bpf_stats_enabled=1).
    #[arg(long)]
    pub bpf_stats: bool,
}

impl ObserveArgs {
    /// Daemon mode (`--listen` or `--otlp`) that keeps no whole-run summary:
    /// only what is exported, unless a result (`--json`) or JSON Lines
    /// (`--format json`, whose `end` record is the summary) is asked for.
    pub fn daemon_without_summary(&self) -> bool {
        (self.listen.is_some() || self.otlp.is_some())
            && self.json.is_none()
            && self.format == Format::Table
    }

    /// The views this run shows.
    pub fn views(&self) -> Vec<ViewKind> {
        self.view_opts.kinds()
    }

    /// What observe's own options say to every view, with `--netns` resolved (`netns`).
    pub fn scope<'a>(&'a self, netns: &'a [crate::sys::netns::NetNs]) -> Scope<'a> {
        Scope {
            netns,
            all_netns: self.all_netns,
            cgroup: self.cgroup.as_deref(),
            ports: &self.ports,
            addrs: &self.addrs,
            raw: self.raw,
            max_flows: self.max_flows,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Json,
    /// Cloud Monitoring TimeSeries for projects.timeSeries.create, one request per line per
    /// interval: every view's samples since the start per label set, CUMULATIVE, in the
    /// --cloud-layout buckets (docs/cloud.md).
    CloudMonitoring,
}
