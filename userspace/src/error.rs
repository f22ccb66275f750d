//! Turning an error chain into the one sentence a user sees.

/// The outermost context and the root cause, joined: "attaching the TCP view: Operation not permitted".
pub fn sentence(e: &anyhow::Error) -> String {
    let outer = e.to_string();
    let root = e.root_cause().to_string();
    if outer == root || outer.contains(&root) {
        outer
    } else {
        format!("{outer}: {root}")
    }
}
