//! Pure code, no privileges: histograms, statistics, cloud bucket layouts,
//! the result format and units.
pub mod cloud_monitoring;
pub mod columns;
pub mod dist;
pub mod fields;
pub mod flow;
pub mod hist;
pub mod hook_status;
pub mod input;
pub mod nat;
pub mod peers;
pub mod records;
pub mod results;
pub mod stats;
pub mod strict_json;
pub mod units;
pub mod view_kind;
pub mod workload;

/// Test helper: the schema checked in at `rel` (from the repository root) is
/// `want`, the one the Rust types generate; with RTTSCOPE_WRITE_SCHEMA set it
/// is written there first. `test` names the test that regenerates it.
#[cfg(test)]
pub(crate) fn assert_checked_in_schema(rel: &str, want: &str, test: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel);
    if std::env::var_os("RTTSCOPE_WRITE_SCHEMA").is_some() {
        std::fs::write(&path, want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "{} differs from the schema the Rust types generate; regenerate it with\n  \
         RTTSCOPE_WRITE_SCHEMA=1 cargo test -p rttscope --features rttscope/aya -- \
         {test}\nand commit it",
        path.display()
    );
}
