//! Compiles the kernel programs in `bpf/` to CO-RE objects and generates
//! their libbpf-rs skeletons (Rust types for every struct in `bpf/rttscope.h`).
//!
//! Outputs per object `<name>`: `<name>.bpf.o` (loaded by either loader),
//! `<name>.skel.rs` (the libbpf-rs skeleton, used with the `libbpf` feature)
//! and `<name>.types.rs` (the skeleton's `types` module alone: the Rust types
//! generated from the object's BTF, which need no libbpf at run time; the
//! aya-only build decodes with these, so both loaders use one generator's
//! types). libbpf-cargo runs only here, in the build script: an aya-only
//! binary links no libbpf (scripts/check-aya-build.sh proves it).
//!
//! - clang: `BPF_CLANG` (default `clang-19`, then `clang`).
//! - `RTTSCOPE_BPF_CFLAGS`: more clang arguments for every object, split on
//!   whitespace (benchmark variants: scripts/bench-sampler.sh's
//!   `BENCH_BEFORE_CFLAGS`, docs/perf-sampler.md). Unset in every shipped build.
//! - `RTTSCOPE_GIT_COMMIT` (for `--version`): `git rev-parse --short HEAD`,
//!   or "unknown" outside a git checkout (a source tarball).
//! - `RTTSCOPE_FEATURES`, `RTTSCOPE_LOADERS` and `RTTSCOPE_LINKAGE` (for `--version`, results
//!   and `rttscope_build_info`): the cargo features built in, those of them that are BPF
//!   loaders, and `static` where the C library is linked in (target feature `crt-static`),
//!   else `dynamic`.
//! - vmlinux.h: `RTTSCOPE_VMLINUX_H` (a file) if set, else generated from the
//!   build machine's BTF (`bpftool btf dump file /sys/kernel/btf/vmlinux format c`).
//!   The objects are CO-RE: field offsets are relocated at load time, so a
//!   header from any recent kernel works on others.
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use libbpf_cargo::SkeletonBuilder;

/// The objects: every `bpf/<name>.bpf.c` (a new view's C file needs no
/// line here), sorted by name.
fn objects(bpf_dir: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for e in std::fs::read_dir(bpf_dir).with_context(|| format!("reading {}", bpf_dir.display()))? {
        let file = e?.file_name();
        if let Some(name) = file.to_str().and_then(|f| f.strip_suffix(".bpf.c")) {
            names.push(name.to_string());
        }
    }
    names.sort();
    Ok(names)
}

/// Objects also compiled a second time with `-DRTTSCOPE_NO_ATOMICS`, as
/// `<name>_noatomic.bpf.o`: for kernels without BPF atomics that return a
/// value (< 5.12; the loader picks by the `atomics` feature probe). Same
/// `.rodata`/`.bss` layout, so the types generated from `<name>.bpf.o`
/// serve both; no skeleton of their own.
const NOATOMIC_OBJECTS: &[&str] = &["tcp", "sampler"];

fn find_clang() -> String {
    if let Ok(c) = env::var("BPF_CLANG") {
        return c;
    }
    for c in ["clang-19", "clang"] {
        if Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return c.to_string();
        }
    }
    "clang-19".to_string()
}

fn vmlinux_h(out: &Path) -> Result<PathBuf> {
    let dir = out.join("vmlinux");
    std::fs::create_dir_all(&dir)?;
    let dst = dir.join("vmlinux.h");
    if let Ok(src) = env::var("RTTSCOPE_VMLINUX_H") {
        std::fs::copy(&src, &dst).with_context(|| format!("copying RTTSCOPE_VMLINUX_H={src}"))?;
        return Ok(dir);
    }
    if dst.exists() {
        return Ok(dir);
    }
    let btf = "/sys/kernel/btf/vmlinux";
    let o = Command::new("bpftool")
        .args(["btf", "dump", "file", btf, "format", "c"])
        .output()
        .context("running bpftool to generate vmlinux.h (install bpftool: scripts/setup.sh, or set RTTSCOPE_VMLINUX_H)")?;
    if !o.status.success() {
        bail!(
            "bpftool btf dump failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    std::fs::write(&dst, o.stdout)?;
    Ok(dir)
}

/// Copy the skeleton's `pub mod types { ... }` block (the Rust types of the
/// object's BTF: structs, enums, `.rodata`/`.bss` layouts) into its own file.
/// The block uses nothing from libbpf-rs; if a libbpf-cargo upgrade changes
/// the skeleton's layout, this fails the build rather than guessing.
fn extract_types(skel: &Path, dst: &Path) -> Result<()> {
    let text = std::fs::read_to_string(skel)?;
    let start = "    pub mod types {";
    let mut lines = text.lines().skip_while(|l| *l != start);
    let mut block = Vec::new();
    for l in lines.by_ref() {
        block.push(l.strip_prefix("    ").unwrap_or(l));
        if l == "    }" {
            break;
        }
    }
    if block.len() < 2 || block.last() != Some(&"}") {
        bail!(
            "{}: no `pub mod types` block found (libbpf-cargo output changed?)",
            skel.display()
        );
    }
    if block.iter().any(|l| l.contains("libbpf")) {
        bail!(
            "{}: the generated types mention libbpf; the aya build cannot use them",
            skel.display()
        );
    }
    let mut s =
        String::from("// Extracted by build.rs from the libbpf-cargo skeleton's `types` module.\n");
    for l in block {
        s.push_str(l);
        s.push('\n');
    }
    std::fs::write(dst, s)?;
    Ok(())
}

/// What this build is, beyond its commit: `RTTSCOPE_FEATURES` (the cargo features enabled, as
/// cargo names them to build scripts), `RTTSCOPE_LOADERS` (those that are BPF loaders) and
/// `RTTSCOPE_LINKAGE` (`static` with the target feature crt-static, else `dynamic`).
fn build_info() {
    let mut features: Vec<String> = env::vars()
        .filter_map(|(k, _)| {
            let f = k
                .strip_prefix("CARGO_FEATURE_")?
                .to_lowercase()
                .replace('_', "-");
            (f != "default").then_some(f)
        })
        .collect();
    features.sort();
    let loaders: Vec<&str> = ["libbpf", "aya"]
        .into_iter()
        .filter(|l| features.iter().any(|f| f == l))
        .collect();
    let crt_static = env::var("CARGO_CFG_TARGET_FEATURE")
        .unwrap_or_default()
        .split(',')
        .any(|f| f == "crt-static");
    println!("cargo:rustc-env=RTTSCOPE_FEATURES={}", features.join(","));
    println!("cargo:rustc-env=RTTSCOPE_LOADERS={}", loaders.join(","));
    println!(
        "cargo:rustc-env=RTTSCOPE_LINKAGE={}",
        if crt_static { "static" } else { "dynamic" }
    );
}

/// The short commit of the checkout, for `--version`; "unknown" outside git.
/// Rebuilds when HEAD moves (the files git updates on commit and checkout).
fn git_commit(manifest: &Path) -> String {
    let git = |args: &[&str]| -> Option<String> {
        let o = Command::new("git")
            .arg("-C")
            .arg(manifest)
            .args(args)
            .output()
            .ok()?;
        let s = String::from_utf8(o.stdout).ok()?.trim().to_string();
        (o.status.success() && !s.is_empty()).then_some(s)
    };
    // Only files that exist: cargo reruns a build script whose watched file
    // is missing on every build (a checkout without packed-refs recompiled
    // the crate each time, 5 min for the release image).
    let watch = |p: String| {
        let p = manifest.join(p);
        if p.exists() {
            println!("cargo:rerun-if-changed={}", p.display());
        }
    };
    for f in ["HEAD", "packed-refs"] {
        if let Some(p) = git(&["rev-parse", "--git-path", f]) {
            watch(p);
        }
    }
    if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
        if let Some(p) = git(&["rev-parse", "--git-path", &r]) {
            watch(p);
        }
    }
    git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".to_string())
}

fn main() -> Result<()> {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    println!(
        "cargo:rustc-env=RTTSCOPE_GIT_COMMIT={}",
        git_commit(&manifest)
    );
    build_info();
    let bpf_dir = manifest
        .join("../bpf")
        .canonicalize()
        .context("bpf/ directory")?;
    let out = PathBuf::from(env::var("OUT_DIR")?);
    let vmlinux_dir = vmlinux_h(&out)?;
    let clang = find_clang();
    // The objects' BTF names their source files: relative to the checkout,
    // so that two checkouts build the same bytes (a reproducible image).
    let prefix_map = format!(
        "-ffile-prefix-map={}=.",
        bpf_dir.parent().context("bpf/'s parent")?.display()
    );

    println!("cargo:rerun-if-env-changed=BPF_CLANG");
    println!("cargo:rerun-if-env-changed=RTTSCOPE_VMLINUX_H");
    println!("cargo:rerun-if-env-changed=RTTSCOPE_BPF_CFLAGS");
    let extra = env::var("RTTSCOPE_BPF_CFLAGS").unwrap_or_default();
    for header in ["rttscope.h", "fine_pool.bpf.h", "sampler_noatomic.bpf.h"] {
        println!("cargo:rerun-if-changed={}", bpf_dir.join(header).display());
    }
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "-I".as_ref(),
        vmlinux_dir.as_os_str(),
        "-I".as_ref(),
        bpf_dir.as_os_str(),
        "-O2".as_ref(),
        "-g".as_ref(),
        prefix_map.as_ref(),
        "-Wall".as_ref(),
        "-Werror".as_ref(),
    ];
    args.extend(extra.split_whitespace().map(std::ffi::OsStr::new));
    // A C file added or removed changes the directory: the list is read again.
    println!("cargo:rerun-if-changed={}", bpf_dir.display());
    for name in &objects(&bpf_dir)? {
        let src = bpf_dir.join(format!("{name}.bpf.c"));
        println!("cargo:rerun-if-changed={}", src.display());
        let skel = out.join(format!("{name}.skel.rs"));
        SkeletonBuilder::new()
            .source(&src)
            .obj(out.join(format!("{name}.bpf.o")))
            .clang(&clang)
            .clang_args(&args)
            .build_and_generate(&skel)
            .with_context(|| format!("compiling {}", src.display()))?;
        if NOATOMIC_OBJECTS.contains(&name.as_str()) {
            let mut na = args.clone();
            na.push("-DRTTSCOPE_NO_ATOMICS".as_ref());
            SkeletonBuilder::new()
                .source(&src)
                .obj(out.join(format!("{name}_noatomic.bpf.o")))
                .clang(&clang)
                .clang_args(&na)
                .build()
                .with_context(|| format!("compiling {} without atomics", src.display()))?;
        }
        let types = out.join(format!("{name}.types.rs"));
        extract_types(&skel, &types)?;
        println!("cargo:rustc-cfg=has_{name}_skel");
        println!("cargo::rustc-check-cfg=cfg(has_{name}_skel)");
    }
    Ok(())
}
