//! The sampler view loaded by libbpf-rs: one copy of `bpf/sampler.bpf.c`'s
//! object per interface, the copies after the first reusing the first one's
//! maps, attached by `tc.rs` (tcx links, or clsact filters).
use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd};

use anyhow::{bail, Context, Result};
use libbpf_rs::{MapCore, MapFlags, MapHandle, MapType, Object, ObjectBuilder};

use super::tc::{clsact_attach, tcx_attach, Attached, Attachments};
use super::{
    attach_info, derived_counters, hash_seed, resolve_ifaces, table_flows, AttachInfo, AttachMode,
    IfaceSpec, ResolvedIface, SamplerConfig, SamplerFlowStats, SamplerView, COUNTERS, PROG_EGRESS,
    PROG_INGRESS, SHARED_MAPS,
};
use crate::bpf::{self, SamplerRodata};
use crate::sys::netns;
use crate::views::libbpf::LibbpfRing;
use crate::views::{LoaderKind, PassiveView, RawSamples, ViewKind};

/// The sampler view loaded by libbpf-rs.
pub(crate) struct LibbpfSampler {
    cfg: SamplerConfig,
    #[allow(dead_code)] // held for its Drop: detaches
    attached: Attachments,
    info: Vec<AttachInfo>,
    /// The raw-sample ring buffer until the stream is taken (with `raw`).
    events: Option<MapHandle>,
    table: MapHandle,
    counters: MapHandle,
    epoch_map: MapHandle,
    epoch: u32,
    // the objects last: their programs must outlive the attachments above
    objects: Vec<Object>,
}

fn map_handle(obj: &Object, name: &str) -> Result<MapHandle> {
    let m = obj
        .maps()
        .find(|m| m.name() == name)
        .with_context(|| format!("map {name} missing from the sampler object"))?;
    MapHandle::try_from(&m).with_context(|| format!("duplicating map {name}"))
}

impl LibbpfSampler {
    /// Load one copy of the programs per interface and attach them at
    /// ingress and egress.
    pub(crate) fn attach(ifaces: &[IfaceSpec], cfg: SamplerConfig) -> Result<LibbpfSampler> {
        let resolved = resolve_ifaces(ifaces, &cfg)?;
        let mut objects: Vec<Object> = Vec::new();
        let mut attached = Attachments::default();
        let mut info = Vec::new();
        let mut shared: Option<Vec<(String, MapHandle)>> = None;
        let mut view_maps = None;
        let seed = hash_seed();
        for ResolvedIface {
            spec,
            ns,
            meta,
            link,
        } in resolved
        {
            let obj = load_copy(&cfg, seed, ns.inode, meta.ifindex, link.0, shared.as_ref())
                .with_context(|| format!("loading the sampler programs for {spec}"))?;
            if shared.is_none() {
                let mut v = Vec::new();
                for n in SHARED_MAPS {
                    v.push((n.to_string(), map_handle(&obj, n)?));
                }
                view_maps = Some((
                    map_handle(&obj, "sampler_table")?,
                    map_handle(&obj, "sampler_counters")?,
                    map_handle(&obj, "sampler_epoch")?,
                    map_handle(&obj, "sampler_events")?,
                ));
                shared = Some(v);
            }
            let mut how = None;
            for egress in [true, false] {
                let pname = if egress { PROG_EGRESS } else { PROG_INGRESS };
                let prog = obj
                    .progs()
                    .find(|p| p.name() == pname)
                    .with_context(|| format!("program {pname} missing"))?;
                let prog_fd = prog.as_fd().as_raw_fd();
                let ifindex = meta.ifindex;
                let mode = cfg.attach;
                let tcx = if mode != AttachMode::Clsact {
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
                        let created =
                            netns::run_in(&ns, move || clsact_attach(prog_fd, ifindex, egress))
                                .with_context(|| format!("attaching a clsact filter to {spec}"))?;
                        attached.0.push(Attached::Clsact {
                            ns: ns.clone(),
                            ifindex,
                            egress,
                            created_qdisc: created,
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
            objects.push(obj);
        }
        let (table, counters, epoch_map, events) = view_maps.context("no sampler object loaded")?;
        let events = cfg.raw.then_some(events);
        drop(shared);
        Ok(LibbpfSampler {
            cfg,
            attached,
            info,
            events,
            table,
            counters,
            epoch_map,
            epoch: 0,
            objects,
        })
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
        for o in &self.objects {
            for p in o.progs() {
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
                .counters
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
        let Some(events) = self.events.take() else {
            bail!(
                "raw samples were not enabled when the sampler was loaded, or were already taken"
            );
        };
        RawSamples::new(Box::new(LibbpfRing::new(&events)?))
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
        let out = table_flows(self.table.as_fd(), &self.cfg, &self.info, self.epoch)?;
        self.epoch = self.epoch.wrapping_add(1);
        self.epoch_map.update(
            &0u32.to_ne_bytes(),
            &self.epoch.to_ne_bytes(),
            MapFlags::ANY,
        )?;
        Ok(out)
    }
}

/// Open one copy of the object, configure it, reuse the shared maps, load.
fn load_copy(
    cfg: &SamplerConfig,
    seed: u64,
    netns_inode: u32,
    ifindex: u32,
    link: u32,
    shared: Option<&Vec<(String, MapHandle)>>,
) -> Result<Object> {
    let mut open = ObjectBuilder::default()
        .open_memory(bpf::sampler::OBJECT)
        .context("opening the sampler object")?;
    for mut m in open.maps_mut() {
        let name = m.name().to_string_lossy().into_owned();
        if name.ends_with(".rodata") {
            let bytes = m
                .initial_value_mut()
                .context("sampler .rodata not mapped")?;
            let ro: &mut SamplerRodata = plain::from_mut_bytes(bytes)
                .map_err(|e| anyhow::anyhow!("sampler .rodata layout: {e:?}"))?;
            ro.cfg_netns = netns_inode;
            ro.cfg_ifindex = ifindex;
            ro.cfg_link = link;
            ro.cfg_sample_threshold = cfg.threshold();
            ro.cfg_match = cfg.matching.raw();
            ro.cfg_raw = cfg.raw as u32;
            ro.cfg_timeout_ns = cfg.pending_timeout.as_nanos().min(u64::MAX as u128) as u64;
            ro.cfg_set_mask = cfg.set_mask();
            ro.cfg_hash_seed = seed;
            continue;
        }
        if let Some(sh) = shared {
            if let Some((_, h)) = sh.iter().find(|(n, _)| *n == name) {
                m.reuse_fd(h.as_fd())
                    .with_context(|| format!("reusing map {name}"))?;
                continue;
            }
        }
        if name == "sampler_table" {
            m.set_max_entries(cfg.table_entries())?;
        }
    }
    let obj = open.load().context("loading the sampler programs")?;
    // sanity: the ring buffer is what we think it is
    if let Some(m) = obj.maps().find(|m| m.name() == "sampler_events") {
        if m.map_type() != MapType::RingBuf {
            bail!("sampler_events is not a ring buffer");
        }
    }
    Ok(obj)
}
