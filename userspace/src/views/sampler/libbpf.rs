//! The sampler view loaded by libbpf-rs through the generated skeleton
//! (`crate::bpf::sampler`): one copy of `bpf/sampler.bpf.c`'s object per
//! interface, the copies after the first reusing the first one's maps,
//! attached by `tc.rs` (tcx links, or clsact filters).
use std::collections::BTreeMap;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd};

use anyhow::{bail, Context, Result};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags, MapType};

use super::tc::{clsact_attach, clsact_claim, tcx_attach, Attached, Attachments};
use super::{
    attach_info, derived_counters, hash_seed, resolve_ifaces, table_flows, AttachInfo, AttachMode,
    IfaceSpec, ResolvedIface, SamplerConfig, SamplerFlowStats, SamplerView, COUNTERS,
};
use crate::bpf::sampler::{SamplerMaps, SamplerSkel, SamplerSkelBuilder};
use crate::sys::netns;
use crate::views::libbpf::LibbpfRing;
use crate::views::{LoaderKind, PassiveView, RawSamples, ViewKind};

/// The sampler view loaded by libbpf-rs.
pub(crate) struct LibbpfSampler {
    cfg: SamplerConfig,
    #[allow(dead_code)] // held for its Drop: detaches
    attached: Attachments,
    info: Vec<AttachInfo>,
    /// The raw-sample ring buffer was handed out (`raw_samples`).
    raw_taken: bool,
    epoch: u32,
    // the skeletons last: their programs must outlive the attachments above.
    // skels[0] created the shared maps; the others reuse them.
    skels: Vec<SamplerSkel<'static>>,
}

impl LibbpfSampler {
    /// Load one copy of the programs per interface and attach them at
    /// ingress and egress.
    pub(crate) fn attach(ifaces: &[IfaceSpec], cfg: SamplerConfig) -> Result<LibbpfSampler> {
        let resolved = resolve_ifaces(ifaces, &cfg)?;
        let mut skels: Vec<SamplerSkel<'static>> = Vec::new();
        let mut attached = Attachments::default();
        let mut info = Vec::new();
        let seed = hash_seed();
        for ResolvedIface {
            spec,
            ns,
            meta,
            link,
        } in resolved
        {
            let skel = load_copy(
                &cfg,
                seed,
                ns.inode,
                meta.ifindex,
                link.0,
                skels.first().map(|s| &s.maps),
            )
            .with_context(|| format!("loading the sampler programs for {spec}"))?;
            let mut how = None;
            // our clsact slot on this interface, claimed at its first filter
            let mut slot = None;
            for egress in [true, false] {
                let prog = if egress {
                    &skel.progs.rtt_sampler_egr
                } else {
                    &skel.progs.rtt_sampler_ing
                };
                let prog_fd = prog.as_fd().as_raw_fd();
                let ifindex = meta.ifindex;
                let mode = cfg.attach;
                // auto: tcx where the feature probe found it (`rttscope features`), as under aya
                let try_tcx = match mode {
                    AttachMode::Clsact => false,
                    AttachMode::Tcx => true,
                    AttachMode::Auto => crate::views::probe::Features::get().tcx.ok,
                };
                let tcx = if try_tcx {
                    match netns::run_in(&ns, move || tcx_attach(prog_fd, ifindex, egress)) {
                        Ok(fd) => Some(fd),
                        Err(e) if mode == AttachMode::Auto => {
                            tracing::info!("tcx attach on {spec} failed ({e:#}); using clsact");
                            None
                        }
                        Err(e) => return Err(e.context(format!("attaching a tcx link to {spec}"))),
                    }
                } else {
                    None
                };
                match tcx {
                    Some(fd) => {
                        attached.0.push(Attached::Tcx(fd));
                        how = Some("tcx");
                    }
                    None => {
                        let slot = match slot {
                            Some(s) => s,
                            None => {
                                let claim = netns::run_in(&ns, move || clsact_claim(ifindex))
                                    .with_context(|| format!("claiming a clsact slot on {spec}"))?;
                                let s = claim.slot;
                                attached.0.push(Attached::Claim {
                                    ns: ns.clone(),
                                    claim,
                                });
                                *slot.insert(s)
                            }
                        };
                        netns::run_in(&ns, move || clsact_attach(prog_fd, ifindex, egress, slot))
                            .with_context(|| format!("attaching a clsact filter to {spec}"))?;
                        attached.0.push(Attached::Clsact {
                            ns: ns.clone(),
                            ifindex,
                            egress,
                            slot,
                        });
                        // mixed only if tcx worked one way and not the other
                        how = Some(if how == Some("tcx") {
                            "tcx+clsact"
                        } else {
                            "clsact"
                        });
                    }
                }
            }
            info.push(attach_info(
                &spec,
                &ns,
                meta.ifindex,
                how.unwrap_or("?"),
                link,
            ));
            skels.push(skel);
        }
        if skels.is_empty() {
            bail!("no sampler object loaded");
        }
        Ok(LibbpfSampler {
            cfg,
            attached,
            info,
            raw_taken: false,
            epoch: 0,
            skels,
        })
    }

    /// The maps every copy shares (created by the first copy).
    fn maps(&self) -> &SamplerMaps<'static> {
        &self.skels[0].maps
    }
}

impl PassiveView for LibbpfSampler {
    fn view(&self) -> ViewKind {
        ViewKind::Sampler
    }

    fn loader(&self) -> LoaderKind {
        LoaderKind::Libbpf
    }

    fn prog_ids(&self) -> Vec<(String, u32)> {
        let mut out = Vec::new();
        for s in &self.skels {
            for p in [&s.progs.rtt_sampler_egr, &s.progs.rtt_sampler_ing] {
                if let Ok(id) = libbpf_rs::Program::id_from_fd(p.as_fd()) {
                    out.push((p.name().to_string_lossy().into_owned(), id));
                }
            }
        }
        out
    }

    fn counters(&self) -> Result<BTreeMap<&'static str, u64>> {
        let mut out = BTreeMap::new();
        for (name, idx) in COUNTERS {
            let vals = self
                .maps()
                .sampler_counters
                .lookup_percpu(&idx.0.to_ne_bytes(), MapFlags::ANY)?
                .unwrap_or_default();
            let sum: u64 = vals
                .iter()
                .map(|b| u64::from_ne_bytes(b[..8].try_into().unwrap_or([0; 8])))
                .sum();
            out.insert(*name, sum);
        }
        derived_counters(&mut out);
        Ok(out)
    }

    fn raw_samples(&mut self) -> Result<RawSamples> {
        if !self.cfg.raw || self.raw_taken {
            bail!(
                "raw samples were not enabled when the sampler was loaded, or were already taken"
            );
        }
        self.raw_taken = true;
        RawSamples::new(Box::new(LibbpfRing::new(&self.maps().sampler_events)?))
    }
}

impl SamplerView for LibbpfSampler {
    fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    fn attach_info(&self) -> &[AttachInfo] {
        &self.info
    }

    fn read_flows(&mut self) -> Result<Vec<SamplerFlowStats>> {
        let out = table_flows(
            self.maps().sampler_table.as_fd(),
            &self.cfg,
            &self.info,
            self.epoch,
        )?;
        self.epoch = self.epoch.wrapping_add(1);
        self.maps().sampler_epoch.update(
            &0u32.to_ne_bytes(),
            &self.epoch.to_ne_bytes(),
            MapFlags::ANY,
        )?;
        Ok(out)
    }
}

/// Open one copy of the object through the skeleton, configure its
/// `.rodata`, reuse the first copy's maps (`shared`; `None` for the first
/// copy, which sizes the flow table), load.
fn load_copy(
    cfg: &SamplerConfig,
    seed: u64,
    netns_inode: u32,
    ifindex: u32,
    link: u32,
    shared: Option<&SamplerMaps<'static>>,
) -> Result<SamplerSkel<'static>> {
    // The skeleton borrows its open object for its whole life; the view lives
    // as long as the command, so the (small) storage is leaked on purpose, one
    // per interface (at most 64).
    let open_object = Box::leak(Box::new(MaybeUninit::uninit()));
    let mut open = SamplerSkelBuilder::default()
        .open(open_object)
        .context("opening the sampler object")?;
    {
        let ro = open
            .maps
            .rodata_data
            .as_deref_mut()
            .context("sampler object has no .rodata")?;
        ro.cfg_netns = netns_inode;
        ro.cfg_ifindex = ifindex;
        ro.cfg_link = link;
        ro.cfg_sample_threshold = cfg.threshold();
        ro.cfg_match = cfg.matching.raw();
        ro.cfg_raw = cfg.raw as u32;
        ro.cfg_timeout_ns = cfg.pending_timeout.as_nanos().min(u64::MAX as u128) as u64;
        ro.cfg_set_mask = cfg.set_mask();
        ro.cfg_hash_seed = seed;
        ro.cfg_protos = cfg.proto_mask();
    }
    match shared {
        None => {
            open.maps
                .sampler_table
                .set_max_entries(cfg.table_entries())
                .context("sizing the flow table")?;
        }
        Some(first) => {
            let m = &mut open.maps;
            m.sampler_table
                .reuse_fd(first.sampler_table.as_fd())
                .context("reusing map sampler_table")?;
            m.sampler_counters
                .reuse_fd(first.sampler_counters.as_fd())
                .context("reusing map sampler_counters")?;
            m.sampler_epoch
                .reuse_fd(first.sampler_epoch.as_fd())
                .context("reusing map sampler_epoch")?;
            m.sampler_events
                .reuse_fd(first.sampler_events.as_fd())
                .context("reusing map sampler_events")?;
        }
    }
    let skel = open.load().context("loading the sampler programs")?;
    // sanity: the ring buffer is what we think it is
    if skel.maps.sampler_events.map_type() != MapType::RingBuf {
        bail!("sampler_events is not a ring buffer");
    }
    Ok(skel)
}
