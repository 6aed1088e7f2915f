//! Files the gateway watches for a change (the config file, module files, the listeners'
//! certificates, the control file): a file has changed when its stamp has.

use std::path::Path;
use std::time::SystemTime;

/// A file's modification time and length.
pub type Stamp = (SystemTime, u64);

/// The stamp of the file at `path`, `None` when it cannot be read.
pub fn stamp(path: &Path) -> Option<Stamp> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}
