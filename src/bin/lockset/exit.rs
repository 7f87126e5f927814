//! Exit statuses (sysexits(3) where one fits) and the failures that lead to them.

use std::io;
use std::process::ExitStatus;

use lockset::redis::RedisError;
use lockset::{Error, NodeFailure};

/// Bad usage or input; nothing was sent to Redis (EX_USAGE).
pub(crate) const USAGE: u8 = 64;
/// A key holds a value that is not a string (EX_DATAERR).
pub(crate) const DATA: u8 = 65;
/// Redis unreachable or failing (EX_UNAVAILABLE).
pub(crate) const UNAVAILABLE: u8 = 69;
/// The lock was lost, or is not held by the given token (EX_SOFTWARE).
pub(crate) const LOST: u8 = 70;
/// The server refuses what lockset must run: its scripts, or a key of the lock (EX_NOPERM).
pub(crate) const NOPERM: u8 = 77;
/// A local system failure: no runtime, no signal handling, no way to wait for the command
/// or to print (EX_OSERR).
pub(crate) const SYSTEM: u8 = 71;
/// The command exists but could not be executed (as the shell says).
pub(crate) const CANNOT_EXECUTE: u8 = 126;
/// The command was not found (as the shell says).
pub(crate) const NOT_FOUND: u8 = 127;

/// Why a subcommand did not succeed.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Bad usage or input: printed with the subcommand's usage, exit [`USAGE`].
    Usage(String),
    /// Anything else: one line on stderr (unless quiet), then exit `code`.
    Exit {
        /// The exit status.
        code: u8,
        /// What happened, for the line on stderr; `None` when already said.
        message: Option<String>,
        /// Waiting would not change it: a setting to fix (a login or a certificate
        /// refused), not a state of the deployment that passes. `--wait` does not try it
        /// again.
        lasting: bool,
    },
}

impl Failure {
    /// Exit with `code` after saying `message`.
    pub(crate) fn new(code: u8, message: impl Into<String>) -> Self {
        Self::Exit {
            code,
            message: Some(message.into()),
            lasting: false,
        }
    }

    /// Exit with `code` after saying `message`, a failure waiting would not change.
    pub(crate) fn lasting(code: u8, message: impl Into<String>) -> Self {
        Self::Exit {
            code,
            message: Some(message.into()),
            lasting: true,
        }
    }

    /// Whether waiting could change this failure: a state of the deployment that passes
    /// (Redis unreachable or not ready), said by exit [`UNAVAILABLE`], not a setting to fix.
    pub(crate) fn may_pass(&self) -> bool {
        matches!(
            self,
            Self::Exit {
                code: UNAVAILABLE,
                lasting: false,
                ..
            }
        )
    }

    /// Exit with `code` silently: a signal or the command's own status says it all.
    pub(crate) fn silent(code: u8) -> Self {
        Self::Exit {
            code,
            message: None,
            lasting: false,
        }
    }

    /// A library error that is not "held by someone else" (that one needs the holder, see
    /// `conflict`): bad input, a non-string key, or Redis failing.
    pub(crate) fn from_error(err: &Error) -> Self {
        match err {
            Error::InvalidInput(invalid) => Self::Usage(invalid.to_string()),
            Error::WrongType { .. } | Error::ModeMismatch { .. } => {
                Self::new(DATA, err.to_string())
            }
            _ if err.is_scripts_refused() => Self::new(NOPERM, err.to_string()),
            _ if err.is_refused_by_acl() => Self::lasting(NOPERM, format!("{err}{ACL_HINT}")),
            Error::Redis(redis) if is_refusal(redis) => {
                Self::lasting(UNAVAILABLE, format!("{err}{}", hint(redis)))
            }
            Error::Redis(redis) => Self::new(UNAVAILABLE, format!("{err}{}", hint(redis))),
            _ => Self::new(UNAVAILABLE, err.to_string()),
        }
    }

    /// The command could not be started.
    pub(crate) fn cannot_run(program: &str, err: &io::Error) -> Self {
        let code = match err.kind() {
            io::ErrorKind::NotFound => NOT_FOUND,
            _ => CANNOT_EXECUTE,
        };
        Self::new(code, format!("cannot run {program:?}: {err}"))
    }
}

/// Redis failed (or could not be reached) doing `what`: exit [`UNAVAILABLE`]; a lasting
/// failure when it refused the login or a certificate (a setting to fix).
pub(crate) fn redis_failure(what: &str, err: &RedisError) -> Failure {
    if is_acl_refusal(err) {
        return Failure::lasting(NOPERM, format!("{what}: {err}{ACL_HINT}"));
    }
    if refuses_scripts(err) {
        // The server's words echo the script's text: the command's name says it all.
        return Failure::lasting(
            NOPERM,
            format!(
                "{what}: the server does not run scripts (EVAL and EVALSHA are renamed or \
                 disabled), which lockset needs to read and write locks"
            ),
        );
    }
    let message = format!("{what}: {err}{}", hint(err));
    match is_refusal(err) {
        true => Failure::lasting(UNAVAILABLE, message),
        false => Failure::new(UNAVAILABLE, message),
    }
}

/// What an ACL refusal (`NOPERM`) is told with: the rule a lock user needs.
const ACL_HINT: &str = " (the server's ACL refuses this user a key or command of the lock: a \
    lock user needs a key pattern that covers each lock key and the queue names that begin \
    with it, such as ~app:* for app:... keys, and the commands; see the servers guide)";

/// Whether the server's ACL refuses the user a key or a command (`NOPERM`, or a command
/// a script runs: see [`Error::is_refused_by_acl`]).
fn is_acl_refusal(err: &RedisError) -> bool {
    Error::Redis(err.clone()).is_refused_by_acl()
}

/// Whether the server does not know the scripting commands (renamed away, say). Redis 7
/// quotes the command's name with `'`, Redis 6.2 with a backquote.
fn refuses_scripts(err: &RedisError) -> bool {
    err.detail().is_some_and(|detail| {
        let detail = detail.to_ascii_lowercase();
        ["unknown command 'eval", "unknown command `eval"]
            .iter()
            .any(|start| detail.starts_with(start))
    })
}

/// Whether the server refused the login (a wrong password, an unknown user) or the TLS
/// handshake over a certificate. (An ACL refusal, `NOPERM`, is told apart before.)
fn is_refusal(err: &RedisError) -> bool {
    err.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(err.code(), Some("WRONGPASS" | "NOAUTH"))
        || is_certificate_refusal(err)
}

/// Whether a TLS handshake failed over a certificate: the server's not trusted, or ours
/// wanted and missing or refused.
fn is_certificate_refusal(err: &RedisError) -> bool {
    let said = err.to_string();
    untrusted_certificate(&said) || client_certificate_wanted(&said)
}

/// The TLS handshake failed: the server's certificate is not trusted (rustls' words).
fn untrusted_certificate(said: &str) -> bool {
    said.contains("invalid peer certificate")
}

/// The TLS handshake failed: the server wants a client certificate it trusts.
fn client_certificate_wanted(said: &str) -> bool {
    said.contains("CertificateRequired") || said.contains("BadCertificate")
}

/// What to add to a Redis error: how to fix it, when the server redirected the key to
/// another node (a Redis Cluster node addressed without `--cluster`), or a TLS handshake
/// failed over a certificate.
fn hint(err: &RedisError) -> &'static str {
    let said = err.to_string();
    match err.code() {
        Some("MOVED" | "ASK") => {
            " (this server is a Redis Cluster node and another node serves the key: add \
             --cluster)"
        }
        _ if untrusted_certificate(&said) => {
            " (the server's TLS certificate is not trusted: give the CA that signed it with \
             --tls-ca-cert)"
        }
        _ if client_certificate_wanted(&said) => {
            " (the server wants a client certificate its CA signed: --tls-cert and --tls-key)"
        }
        _ => "",
    }
}

/// True when `err` says the lock is held by someone else, rather than that Redis could not
/// be asked: for a Redlock quorum, when the masters that answered could still have made a
/// majority.
pub(crate) fn is_conflict(err: &Error) -> bool {
    match err {
        Error::Quorum {
            needed,
            nodes,
            failures,
            ..
        } => {
            let unreachable = failures
                .iter()
                .filter(|(_, failure)| !matches!(failure, NodeFailure::Refused))
                .count();
            err.is_not_obtained() && nodes - unreachable >= *needed
        }
        _ => err.is_not_obtained(),
    }
}

/// The status a shell would give for `status`: the exit code, or 128 + the signal number.
pub(crate) fn of_status(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt as _;

    if let Some(code) = status.code() {
        // An exit code is 0..=255 on Unix; anything else cannot happen.
        return u8::try_from(code & 0xff).unwrap_or(u8::MAX);
    }
    let signal = status.signal().unwrap_or(0);
    of_signal(signal)
}

/// 128 + the signal number, as a shell reports a death by that signal.
pub(crate) fn of_signal(signal: i32) -> u8 {
    u8::try_from(128 + signal).unwrap_or(u8::MAX)
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt as _;

    use super::*;

    /// Scripts renamed away, as Redis 7 and Redis 6.2 word it: 77, lasting.
    #[test]
    fn scripts_renamed_away_are_77_on_every_version() {
        for words in [
            "unknown command 'EVAL', with args beginning with: '-- Reads'",
            "unknown command `EVALSHA`, with args beginning with: `abc`, ",
        ] {
            let line = format!("-ERR {words}\r\n");
            let Ok(Err(err)) =
                redis::parse_redis_value(line.as_bytes()).map(redis::Value::extract_error)
            else {
                panic!("not a server error");
            };
            assert!(refuses_scripts(&err), "{words}");
            let failure = redis_failure("cannot read the keys from Redis", &err);
            assert!(
                matches!(
                    failure,
                    Failure::Exit {
                        code: NOPERM,
                        lasting: true,
                        ..
                    }
                ),
                "{words}"
            );
        }
    }

    #[test]
    fn signals_add_128() {
        assert_eq!(of_status(ExitStatus::from_raw(15)), 143);
        assert_eq!(of_status(ExitStatus::from_raw(9)), 137);
        assert_eq!(of_status(ExitStatus::from_raw(7 << 8)), 7);
    }

    #[test]
    fn a_quorum_out_of_reach_is_no_conflict() {
        let refused = |failures: Vec<(usize, NodeFailure)>| Error::Quorum {
            op: lockset::QuorumOp::Obtain,
            succeeded: 0,
            needed: 2,
            nodes: 3,
            expired: false,
            failures,
        };
        let down = || NodeFailure::TimedOut(std::time::Duration::from_millis(5));
        let held = refused(vec![(0, NodeFailure::Refused), (1, down())]);
        assert!(is_conflict(&held));
        let out_of_reach = refused(vec![(0, NodeFailure::Refused), (1, down()), (2, down())]);
        assert!(!is_conflict(&out_of_reach));
    }
}
