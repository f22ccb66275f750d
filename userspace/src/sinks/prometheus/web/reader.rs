//! What the web config reads: the file and the files it names (bounded, digested, so a change of
//! any of them is noticed), and how their paths are resolved and shown in messages.
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Reads the web config file and the files it names, and digests all it read.
pub struct Reader {
    dir: PathBuf,
    digest: Sha256,
    /// Key files others may read.
    pub world_readable: Vec<PathBuf>,
}

impl Reader {
    pub fn new(config: &Path) -> Reader {
        Reader {
            dir: config.parent().unwrap_or(Path::new(".")).to_path_buf(),
            digest: Sha256::new(),
            world_readable: Vec::new(),
        }
    }

    /// A path of the file: relative to its directory.
    pub fn path(&self, p: &Path) -> PathBuf {
        resolve(&self.dir, p)
    }

    /// The bytes of `path` (named `key` in messages), at most `cap`; digested.
    pub fn read(&mut self, path: &Path, key: &str, cap: u64) -> Result<Vec<u8>, String> {
        let r = read_capped(path, cap);
        self.digest.update(path.as_os_str().as_encoded_bytes());
        match r {
            Ok(b) => {
                self.digest.update((b.len() as u64).to_le_bytes());
                self.digest.update(&b);
                Ok(b)
            }
            Err(e) => {
                let msg = format!("{key} {}: {e}", shown(path));
                self.digest.update(msg.as_bytes());
                Err(msg)
            }
        }
    }

    /// The digest of everything read, and the key files others may read.
    pub fn finish(self) -> ([u8; 32], Vec<PathBuf>) {
        (self.digest.finalize().into(), self.world_readable)
    }

    /// Note a key file any user may read.
    pub fn check_key_mode(&mut self, path: &Path) {
        use std::os::unix::fs::PermissionsExt;
        if std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o004 != 0) {
            self.world_readable.push(path.to_path_buf());
        }
    }
}

/// At most `cap` bytes of `path`; an error says why in a few words (no content).
fn read_capped(path: &Path, cap: u64) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let f = std::fs::File::open(path).map_err(|e| io_words(&e))?;
    let mut b = Vec::new();
    f.take(cap + 1)
        .read_to_end(&mut b)
        .map_err(|e| io_words(&e))?;
    if b.len() as u64 > cap {
        return Err(format!("larger than {cap} bytes"));
    }
    Ok(b)
}

/// An I/O error's kind in words (std's message, without the "(os error N)").
fn io_words(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

/// A path for a message: control and bidirectional characters escaped.
pub fn shown(p: &Path) -> String {
    crate::analysis::input::escape_for_terminal(&p.display().to_string())
}

/// `p` against `dir` when relative (exporter-toolkit's rule for the web config's paths).
pub fn resolve(dir: &Path, p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        dir.join(p)
    }
}
