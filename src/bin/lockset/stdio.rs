//! The standard streams: whether stdout reaches anyone.
//!
//! Rust's runtime opens /dev/null in place of a standard stream that is closed when the
//! program starts (so that no file or connection takes its number), read-write. Printing a
//! token there would succeed and lose it: `lockset acquire >&-` must fail instead.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};

use nix::fcntl::{FcntlArg, OFlag, fcntl};

/// True when stdout was closed when `lockset` started: it is /dev/null opened read-write,
/// as the runtime opens it (a shell's `>/dev/null` opens it write-only, and is respected).
pub(crate) fn stdout_was_closed() -> bool {
    let stdout = io::stdout();
    let Ok(flags) = fcntl(stdout.as_fd(), FcntlArg::F_GETFL) else {
        return true;
    };
    if OFlag::from_bits_truncate(flags) & OFlag::O_ACCMODE != OFlag::O_RDWR {
        return false;
    }
    let device = |file: io::Result<File>| {
        let metadata = file.and_then(|file| file.metadata()).ok()?;
        metadata
            .file_type()
            .is_char_device()
            .then(|| metadata.rdev())
    };
    let stdout = stdout.as_fd().try_clone_to_owned().map(File::from);
    let null = device(File::open("/dev/null"));
    null.is_some() && device(stdout) == null
}
