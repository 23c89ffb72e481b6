//! Durable file writes: the only place that knows how to make a write survive a crash;
//! and the listing of numbered files that logs and state versions are kept in.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::Path;

use crate::error::{Error, Result};

/// Writes `bytes` to `path` atomically: a temp file in the same directory, fsync, rename,
/// fsync of the directory. A reader sees the old content or the new, never a mix.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomic_then(path, bytes, || {})
}

/// [`write_atomic`], calling `before_rename` once the temp file is durable (a crash point).
pub fn write_atomic_then(path: &Path, bytes: &[u8], before_rename: impl FnOnce()) -> Result<()> {
    write_atomic_with(
        path,
        |out| {
            out.write_all(bytes)
                .map_err(|e| Error::io(format!("writing {}", path.display()), e))
        },
        before_rename,
    )
}

/// [`write_atomic_then`] with the content streamed by `write` through a buffered writer,
/// so that a large file is never held in memory whole.
pub fn write_atomic_with(
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> Result<()>,
    before_rename: impl FnOnce(),
) -> Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| Error::Internal(format!("{} has no parent", path.display())))?;
    fs::create_dir_all(dir).map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", uuid::Uuid::new_v4().simple()));
    let ctx = |what: &str| format!("{what} {}", tmp.display());
    {
        let f = File::create(&tmp).map_err(|e| Error::io(ctx("creating"), e))?;
        let mut out = std::io::BufWriter::with_capacity(1 << 20, f);
        let written = write(&mut out).and_then(|()| {
            out.into_inner()
                .map_err(|e| Error::io(ctx("writing"), e.into_error()))
        });
        let f = match written {
            Ok(f) => f,
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                return Err(e);
            }
        };
        f.sync_all().map_err(|e| Error::io(ctx("syncing"), e))?;
    }
    before_rename();
    fs::rename(&tmp, path).map_err(|e| Error::io(format!("renaming to {}", path.display()), e))?;
    sync_dir(dir)
}

/// Writes `bytes` to `path` only if no file is there yet; returns `false` if one was.
/// Used for log entries, which are never overwritten.
pub fn write_new(path: &Path, bytes: &[u8]) -> Result<bool> {
    if path.exists() {
        return Ok(false);
    }
    write_atomic(path, bytes)?;
    Ok(true)
}

/// Makes a directory's entries (created, renamed files) durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    let d = OpenOptions::new()
        .read(true)
        .open(dir)
        .map_err(|e| Error::io(format!("opening {}", dir.display()), e))?;
    d.sync_all()
        .map_err(|e| Error::io(format!("syncing {}", dir.display()), e))
}

/// Creates a directory and its parents.
pub fn create_dir_all(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).map_err(|e| Error::io(format!("creating {}", dir.display()), e))
}

/// The numbers `n` of the entries named `<n><suffix>` in `dir`, ascending (none if `dir`
/// does not exist; other names, such as temporary files, are ignored).
pub fn numbered(dir: &Path, suffix: &str) -> Result<Vec<u64>> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(Error::io(format!("listing {}", dir.display()), e)),
    };
    let mut ids: Vec<u64> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_suffix(suffix)?.parse().ok())
        .collect();
    ids.sort_unstable();
    Ok(ids)
}

/// A file's text, or `None` if it does not exist.
pub fn read_optional(file: &Path) -> Result<Option<String>> {
    match fs::read_to_string(file) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(format!("reading {}", file.display()), e)),
    }
}
