//! Who `lockset` is, for the default lock metadata.

/// `HOST:PID`: enough for a person to find the holder of a lock.
pub(crate) fn host_pid() -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|name| name.into_string().ok())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "unknown-host".to_owned());
    format!("{host}:{}", std::process::id())
}
