//! Every file and directory rttscope creates, and every file it reads, goes
//! through here (docs/security.md, "Files").
//!
//! Writing: rttscope often runs as root and writes where the user says,
//! often a shared directory such as /tmp. A file is written to a temporary
//! created exclusively (`O_CREAT|O_EXCL`, a random name, so a planted link or
//! file at a guessable name is never opened) in the destination's directory
//! and renamed over the destination, which replaces whatever name is there
//! and never writes through it. A destination that is a symbolic link or a
//! special file (FIFO, device) owned by another user is refused: as
//! `fs.protected_symlinks` would, rttscope follows only links owned by the
//! user it runs as or by root (`--json /dev/stdout` works). Directories are
//! made by `mkdir` exclusively, with a random name and mode 0700.
//!
//! The temporaries come from the `tempfile` crate (`NamedTempFile::new_in` +
//! `persist`, `TempDir`): it creates with `O_EXCL` and random names, retries
//! on collisions and removes the temporary on every error path.
//!
//! Reading: what a reader takes in is capped while reading (`MAX_READ_BYTES`,
//! plus one byte to see it is over), never trusted from a file's size.
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The most any reader takes from one file or stream: 1 GiB.
pub const MAX_READ_BYTES: u64 = 1 << 30;

/// Write `bytes` to `path` atomically: a reader sees the old file or the whole new one, and no
/// link or file planted at a predictable name is followed or overwritten (module docs).
pub fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    match Existing::of(path)? {
        Existing::Trusted => {
            // A link of ours or root's (`/dev/stdout`), or a device/FIFO: write through it.
            let mut f = open_through(path)?;
            f.write_all(bytes).and_then(|()| f.flush())
        }
        Existing::Replace => {
            let mut tmp = temporary_beside(path)?;
            tmp.write_all(bytes)?;
            tmp.as_file().sync_all()?;
            tmp.persist(path).map_err(|e| e.error)?;
            Ok(())
        }
    }
}

/// A new, empty file at `path` to write into as it goes (a log), by the same rules as
/// [`write_atomically`]: made exclusively and renamed over whatever name is there.
pub fn create_replacing(path: &Path) -> io::Result<std::fs::File> {
    match Existing::of(path)? {
        Existing::Trusted => open_through(path),
        Existing::Replace => temporary_beside(path)?.persist(path).map_err(|e| e.error),
    }
}

fn open_through(path: &Path) -> io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .create(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)
}

/// An exclusively created temporary `.<name>.XXXXXX.tmp` in `path`'s directory, mode
/// 0666 less the umask (as a plain create would give).
fn temporary_beside(path: &Path) -> io::Result<tempfile::NamedTempFile> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    tempfile::Builder::new()
        .prefix(&format!(".{}.", cut_name(&name)))
        .suffix(".tmp")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666))
        .tempfile_in(dir)
}

/// What is at a destination path now, and how to write there.
enum Existing {
    /// Nothing, or a regular file: a new file is renamed over the name.
    Replace,
    /// A link or special file of ours or root's: written through.
    Trusted,
}

impl Existing {
    fn of(path: &Path) -> io::Result<Existing> {
        let meta = match std::fs::symlink_metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Existing::Replace),
            Err(e) => return Err(e),
        };
        let ft = meta.file_type();
        if ft.is_file() {
            return Ok(Existing::Replace);
        }
        if ft.is_dir() {
            return Err(io::Error::other(format!(
                "{} is a directory",
                path.display()
            )));
        }
        let me = nix::unistd::geteuid().as_raw();
        if meta.uid() != me && meta.uid() != 0 {
            let what = if ft.is_symlink() {
                "a symbolic link"
            } else {
                "a special file"
            };
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "it is {what} owned by uid {}, not by you (uid {me}) or root, and rttscope \
                     does not write through it (remove it or choose another path)",
                    meta.uid()
                ),
            ));
        }
        Ok(Existing::Trusted)
    }
}

/// At most 32 characters of a file name, for the temporary's prefix.
fn cut_name(name: &str) -> String {
    name.chars().take(32).collect()
}

/// Make a fresh directory `<prefix>XXXXXX` (random, mode 0700, `mkdir` fails if the name
/// exists) in the temporary directory; the caller removes it.
pub fn create_private_dir(prefix: &str) -> io::Result<PathBuf> {
    create_private_dir_in(&std::env::temp_dir(), prefix)
}

/// [`create_private_dir`] in `parent`.
pub fn create_private_dir_in(parent: &Path, prefix: &str) -> io::Result<PathBuf> {
    Ok(tempfile::Builder::new()
        .prefix(prefix)
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .tempdir_in(parent)?
        .keep())
}

/// An output directory the user named (the lab's results): created if missing (mode 0755,
/// parents as needed); an existing one must be a real directory (not a link) owned by the user
/// rttscope runs as or by root, and not writable by others, so nobody else can swap the files
/// written into it.
pub fn create_output_dir(path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if let Some(p) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(p)?;
            }
            std::fs::DirBuilder::new()
                .mode_0755()
                .create(path)
                .or_else(|e| match e.kind() {
                    io::ErrorKind::AlreadyExists => check_output_dir(path),
                    _ => Err(e),
                })
        }
        Err(e) => Err(e),
        Ok(_) => check_output_dir(path),
    }
}

trait Mode0755 {
    fn mode_0755(&mut self) -> &mut Self;
}

impl Mode0755 for std::fs::DirBuilder {
    fn mode_0755(&mut self) -> &mut Self {
        std::os::unix::fs::DirBuilderExt::mode(self, 0o755)
    }
}

fn check_output_dir(path: &Path) -> io::Result<()> {
    let meta = std::fs::symlink_metadata(path)?;
    let me = nix::unistd::geteuid().as_raw();
    let refuse = |why: String| {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} {why}: rttscope writes its results only into a directory nobody else can \
                 change (choose another one)",
                path.display()
            ),
        ))
    };
    if !meta.file_type().is_dir() {
        return refuse("exists and is not a directory (or is a symbolic link)".into());
    }
    if meta.uid() != me && meta.uid() != 0 {
        return refuse(format!("is owned by uid {}", meta.uid()));
    }
    if meta.mode() & 0o022 != 0 {
        return refuse("is writable by other users".into());
    }
    Ok(())
}

/// A reader that fails, in one sentence, once more than `cap` bytes come through it.
pub struct Capped<R> {
    inner: R,
    left: u64,
    name: String,
    cap: u64,
}

impl<R: Read> Capped<R> {
    pub fn new(inner: R, name: &str, cap: u64) -> Self {
        Capped {
            inner,
            left: cap,
            name: name.to_string(),
            cap,
        }
    }
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.left == 0 {
            let mut one = [0u8; 1];
            return match self.inner.read(&mut one)? {
                0 => Ok(0),
                _ => Err(over_cap(&self.name, self.cap)),
            };
        }
        let n = buf.len().min(self.left.min(usize::MAX as u64) as usize);
        let got = self.inner.read(&mut buf[..n])?;
        self.left -= got as u64;
        Ok(got)
    }
}

/// The one sentence for an input over its cap (kind `FileTooLarge`, which readers can tell apart).
pub fn over_cap(name: &str, cap: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::FileTooLarge,
        format!(
            "{name} is larger than {}, the most rttscope reads of one input",
            human_bytes(cap)
        ),
    )
}

pub fn human_bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 && n % (1 << 30) == 0 => format!("{} GiB", n >> 30),
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n => format!("{n} bytes"),
    }
}

/// Open `path` for reading through the cap.
pub fn open_capped(path: &Path) -> io::Result<Capped<std::fs::File>> {
    let f = std::fs::File::open(path)?;
    Ok(Capped::new(f, &path.display().to_string(), MAX_READ_BYTES))
}

/// The whole text of `r` (named `name` in errors), at most `cap` bytes. Every input rttscope
/// reads is text (JSON, TOML, sample lists), where a NUL byte never belongs: the first one
/// ends the read at once (`/dev/zero`, a sparse file's hole), before megabytes pile up. The
/// buffer never grows past `cap` + one read.
pub fn read_text_capped(r: impl Read, name: &str, cap: u64) -> io::Result<String> {
    const CHUNK: usize = 1 << 16;
    let mut r = Capped::new(r, name, cap);
    let mut bytes: Vec<u8> = Vec::new();
    loop {
        if bytes.capacity() - bytes.len() < CHUNK {
            let want = (bytes.capacity() * 2).max(CHUNK * 4);
            let want = want.min(cap.min(usize::MAX as u64 / 2) as usize + CHUNK);
            bytes.reserve_exact(want.saturating_sub(bytes.len()).max(CHUNK));
        }
        let start = bytes.len();
        bytes.resize(start + CHUNK, 0);
        let got = r.read(&mut bytes[start..]);
        bytes.truncate(start + *got.as_ref().unwrap_or(&0));
        let n = match got {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if let Some(i) = bytes[start..].iter().position(|&b| b == 0) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{name} is not text: it holds a NUL byte at offset {}",
                    start + i
                ),
            ));
        }
        if n == 0 {
            break; // the end (Capped says when the input goes on past the cap)
        }
    }
    String::from_utf8(bytes).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{name} is not UTF-8 text"),
        )
    })
}

/// The whole text of the file at `path`, at most [`MAX_READ_BYTES`]; a read error is
/// `cannot read PATH: why`, one sentence.
pub fn read_to_string(path: &Path) -> io::Result<String> {
    read_to_string_capped(path, MAX_READ_BYTES)
}

/// [`read_to_string`] with another cap.
pub fn read_to_string_capped(path: &Path, cap: u64) -> io::Result<String> {
    let name = path.display().to_string();
    let cannot = |e: io::Error| match e.kind() {
        io::ErrorKind::FileTooLarge | io::ErrorKind::InvalidData => e,
        k => io::Error::new(k, format!("cannot read {name}: {e}")),
    };
    let f = std::fs::File::open(path).map_err(cannot)?;
    // A regular file's size is known: refuse at once (the cap still holds while reading, for
    // a file that grows and for devices and pipes, whose size says nothing).
    if f.metadata().is_ok_and(|m| m.is_file() && m.len() > cap) {
        return Err(over_cap(&name, cap));
    }
    read_text_capped(f, &name, cap).map_err(cannot)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capped_reader_stops_one_byte_over_the_cap() {
        let mut s = String::new();
        let e = Capped::new(io::repeat(b'a'), "zeros", 1000)
            .read_to_string(&mut s)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "zeros is larger than 1000 bytes, the most rttscope reads of one input"
        );
        assert_eq!(e.kind(), io::ErrorKind::FileTooLarge);
        let mut s = String::new();
        Capped::new(&b"0123456789"[..], "ten", 10)
            .read_to_string(&mut s)
            .unwrap();
        assert_eq!(s, "0123456789");
        assert_eq!(human_bytes(MAX_READ_BYTES), "1 GiB");
    }

    #[test]
    fn text_reader_stops_at_a_nul_and_at_the_cap() {
        let e = read_text_capped(io::repeat(0), "zeros", MAX_READ_BYTES).unwrap_err();
        assert_eq!(
            e.to_string(),
            "zeros is not text: it holds a NUL byte at offset 0"
        );
        let e = read_text_capped(io::repeat(b'7'), "sevens", 3 << 20).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::FileTooLarge, "{e}");
        let big = "1\n".repeat(300_000);
        assert_eq!(
            read_text_capped(big.as_bytes(), "ok", 600_000).unwrap(),
            big
        );
        assert!(read_text_capped(big.as_bytes(), "over", 599_999).is_err());
        assert!(read_text_capped(&b"\xff\xfe"[..], "bin", 10).is_err());
    }

    #[test]
    fn atomic_write_replaces_and_never_leaves_temporaries() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.json");
        write_atomically(&p, b"one").unwrap();
        write_atomically(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "{names:?}");
        // A link of our own is written through; the target changes, the link stays.
        let target = dir.path().join("target");
        std::fs::write(&target, b"old").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        write_atomically(&link, b"new").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"new");
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert!(write_atomically(dir.path(), b"x").is_err());
    }

    #[test]
    fn private_dirs_are_fresh_and_0700() {
        use std::os::unix::fs::PermissionsExt;
        let parent = tempfile::tempdir().unwrap();
        let a = create_private_dir_in(parent.path(), "rttscope-x-").unwrap();
        let b = create_private_dir_in(parent.path(), "rttscope-x-").unwrap();
        assert_ne!(a, b);
        let mode = std::fs::metadata(&a).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        let out = parent.path().join("res/run-1");
        create_output_dir(&out).unwrap();
        create_output_dir(&out).unwrap();
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = create_output_dir(&out).unwrap_err();
        assert!(e.to_string().contains("writable by other users"), "{e}");
    }
}
