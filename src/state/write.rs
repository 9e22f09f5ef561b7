//! Writing a state file so that a crash at any point leaves the old document or the new one
//! whole: a temporary file beside it, synced, the previous one kept as the backup, renamed over,
//! the folder synced.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

use super::{io_err, parent_dir, with_suffix, StateError};

/// Writes `doc` to `path` atomically, the previous version kept as `path.backup`.
pub(crate) fn write_file(path: &Path, doc: &[u8]) -> Result<(), StateError> {
    let dir = parent_dir(path);
    fs::create_dir_all(&dir).map_err(|e| io_err(&dir, e))?;
    let file_name = path
        .file_name()
        .ok_or_else(|| {
            io_err(
                path,
                io::Error::new(io::ErrorKind::InvalidInput, "state path has no file name"),
            )
        })?
        .to_string_lossy()
        .into_owned();
    let pid = std::process::id();
    let tmp = dir.join(format!(".{file_name}.tmp-{pid}"));
    let result = write_via(path, &tmp, &dir, &file_name, pid, doc);
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

fn write_via(
    path: &Path,
    tmp: &Path,
    dir: &Path,
    file_name: &str,
    pid: u32,
    doc: &[u8],
) -> Result<(), StateError> {
    write_synced(tmp, doc)?;

    if fs::symlink_metadata(path).is_ok() {
        let backup = with_suffix(path, ".backup");
        let backup_tmp = dir.join(format!(".{file_name}.backup.tmp-{pid}"));
        let result = link_or_copy(path, &backup_tmp)
            .and_then(|()| fs::rename(&backup_tmp, &backup).map_err(|e| io_err(&backup, e)));
        if result.is_err() {
            let _ = fs::remove_file(&backup_tmp);
        }
        result?;
    }

    fs::rename(tmp, path).map_err(|e| io_err(path, e))?;
    sync_dir(dir)
}

/// Creates/truncates `path`, writes `bytes` and fsyncs it.
fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), StateError> {
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(|e| io_err(path, e))?;
    f.write_all(bytes).map_err(|e| io_err(path, e))?;
    f.sync_all().map_err(|e| io_err(path, e))
}

/// Makes `to` a hard link to `from`, or a synced copy where links are not
/// supported. `to` is a private temp name, replaced if it exists.
fn link_or_copy(from: &Path, to: &Path) -> Result<(), StateError> {
    match fs::remove_file(to) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(to, e)),
    }
    if fs::hard_link(from, to).is_ok() {
        return Ok(());
    }
    let bytes = fs::read(from).map_err(|e| io_err(from, e))?;
    write_synced(to, &bytes)
}

/// Persists renames in `dir` (no-op where directories cannot be opened).
fn sync_dir(dir: &Path) -> Result<(), StateError> {
    #[cfg(unix)]
    {
        fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io_err(dir, e))
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        Ok(())
    }
}
