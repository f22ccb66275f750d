//! The TCP view's own options of `rttscope observe` (flattened into observe's
//! through the registry's [`crate::views::ViewArgs`]), and how they and
//! observe's shared ones ([`crate::views::Scope`]) become its config; and its
//! config in `rttscope compare` ([`compare_config`]).
use std::any::Any;

use anyhow::Result;
use clap::Args;

use super::{AckHook, TcpViewConfig};
use crate::sys::netns::{self, NetNs};
use crate::views::def::{own, AttachOpts, ViewConfig, ViewDef};
use crate::views::scope::{OnTestbed, Scope};
use crate::views::view::View;
use crate::views::ViewKind;

/// The TCP view in the registry (`views::VIEWS`).
pub const DEF: ViewDef = ViewDef {
    kind: ViewKind::Tcp,
    observe: |opts, scope| {
        let args = own::<TcpArgs>(opts).expect("the registry holds the TCP view's options");
        Ok(Box::new(args.config(scope)?))
    },
    by_default: |_| true,
    compare: |_, port| Ok(Some(Box::new(compare_config(port)?))),
    plan: super::plan::plan,
    on_testbed: |_, _, _| on_testbed(),
    testbed_words: |_, _| testbed_words(),
    start_schema: None,
    not_requested: Some("unavailable: tcp view: not requested (--view)"),
};

impl ViewConfig for TcpViewConfig {
    fn def(&self) -> &'static ViewDef {
        &DEF
    }

    fn set_raw(&mut self) {
        self.raw = true;
    }

    fn attach(&self, how: &AttachOpts) -> Result<Box<dyn View>> {
        let tcp = super::attach::Tcp::attach(how.built_loader()?, self)?;
        Ok(Box::new(super::track::TcpView::new(
            Box::new(tcp),
            self,
            how.keep_rows,
            how.keep_summary,
        )))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[derive(Debug, Clone, PartialEq, Args)]
pub struct TcpArgs {
    /// TCP view: take samples from the optional per-ACK hook (fexit/tcp_ack_update_rtt) instead of the sock_ops RTT callback.
    #[arg(long, value_enum, default_value = "auto", value_name = "MODE")]
    pub ack_hook: AckHook,
}

impl TcpArgs {
    /// The view's config: filtered by the scope's namespaces, ports and addresses, on its
    /// cgroup; existing connections enabled in every namespace (`--all-netns`), the `--netns`
    /// ones, or the observer's own.
    pub fn config(&self, scope: &Scope<'_>) -> Result<TcpViewConfig> {
        let iter_netns: Vec<NetNs> = if scope.all_netns {
            netns::all().into_values().collect()
        } else if !scope.netns.is_empty() {
            scope.netns.to_vec()
        } else {
            vec![netns::resolve("self")?]
        };
        Ok(TcpViewConfig {
            cgroup: scope.cgroup.map(|c| c.to_path_buf()),
            netns_filter: scope.netns.to_vec(),
            iter_netns,
            all_netns: scope.all_netns,
            ports: scope.ports.to_vec(),
            cidrs: scope.addrs.to_vec(),
            raw: scope.raw,
            max_flows: scope.max_flows,
            ack_hook: self.ack_hook,
        })
    }

    /// Its options as observe's settings record them (the start record's and the `--json`
    /// document's `settings`): `ack_hook`, as given, whether or not the view runs.
    pub fn record(&self, settings: &mut serde_json::Map<String, serde_json::Value>) {
        settings.insert("ack_hook".into(), serde_json::json!(self.ack_hook));
    }
}

/// Its options on the lab's testbed ([`crate::views::on_testbed`]): none beyond the
/// namespaces every view takes.
pub fn on_testbed() -> OnTestbed {
    OnTestbed::default()
}

/// Its hooks on the testbed and what its columns hold, in words
/// ([`crate::views::testbed_words`]).
pub fn testbed_words() -> (String, String) {
    (
        "cgroup sock_ops BPF_SOCK_OPS_RTT_CB on both ends".into(),
        "the TCP stack's RTT samples (sock_ops) on each end".into(),
    )
}

/// Its config in `rttscope compare` ([`crate::views::CompareViewArgs`]): the responder's
/// `port` (both ends when the server is on this host too), existing connections in the
/// observer's own namespace, and raw samples for the time series.
pub fn compare_config(port: u16) -> Result<TcpViewConfig> {
    Ok(TcpViewConfig {
        iter_netns: vec![netns::resolve("self")?],
        ports: vec![port],
        raw: true,
        max_flows: 4096,
        ..Default::default()
    })
}
