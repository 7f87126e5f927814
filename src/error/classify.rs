//! What a Redis error means for a lock, decided here and nowhere else: the connection failed
//! or no answer came, the server is changing over (a failover, a restart), the outcome is
//! unknown, the server refuses who we are, or refuses a command as such.

use redis::{RedisError, RetryMethod};

/// Errors of the connection, not of the command: nothing reached Redis, or no answer came.
/// A TLS handshake that failed over a certificate is an I/O error too, but not one of these:
/// a setting to fix (see [`is_access_refusal`]).
pub(crate) fn is_unreachable(err: &RedisError) -> bool {
    (err.is_timeout()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_io_error())
        && !is_access_refusal(err)
}

/// The server answered that it cannot serve the request now: it is no longer the primary,
/// still loading, its cluster or primary is down, or it has too few replicas in reach for a
/// write (`min-replicas-to-write`: `NOREPLICAS`, refused before anything runs). Nothing ran.
/// Also when a command inside one of lockset's scripts was told so, as Redis 6.2 reports it
/// (see [`inner_message`]).
pub(crate) fn is_changing_over(err: &RedisError) -> bool {
    // By code: redis-rs names the kinds it knows by theirs, and knows no `NOREPLICAS`.
    let changing = |code: &str| {
        matches!(
            code,
            "READONLY" | "LOADING" | "MASTERDOWN" | "CLUSTERDOWN" | "TRYAGAIN" | "NOREPLICAS"
        )
    };
    err.code().is_some_and(changing)
        || inner_message(err)
            .as_deref()
            .and_then(|message| message.strip_prefix('-'))
            .and_then(|message| message.split(' ').next())
            .is_some_and(changing)
}

/// What a command inside a script was told, when Redis 6.2 wrapped it in the script's own
/// error: "@user_script: N: <message>" (the code `@user_script:`: a script that returns what
/// `redis.pcall` gave it), or "Error running script (call to ...): @user_script:N:
/// @user_script: N: <message>" (the code `ERR`: a command that raised). `None` for any other
/// error.
fn inner_message(err: &RedisError) -> Option<String> {
    let detail = err.detail()?;
    let after_line = |rest: &str| {
        rest.trim_start_matches(|c: char| c == ':' || c == ' ' || c.is_ascii_digit())
            .to_owned()
    };
    if detail
        .to_ascii_lowercase()
        .starts_with("error running script")
    {
        return Some(
            detail
                .rsplit_once("@user_script")
                .map_or(String::new(), |(_, rest)| after_line(rest)),
        );
    }
    err.code()
        .is_some_and(|code| code.starts_with("@user_script"))
        .then(|| after_line(detail))
}

/// No intact reply came (none, or a cut one): the request may or may not have run. A
/// refused connection is not one: nothing was sent.
pub(crate) fn is_outcome_unknown(err: &RedisError) -> bool {
    (is_unreachable(err) && !err.is_connection_refusal()) || err.kind() == redis::ErrorKind::Parse
}

/// Errors that say nothing about the lock itself: the connection, a timeout, a busy or
/// failing-over server. A refused login or certificate is not one (see
/// [`is_access_refusal`]).
pub(crate) fn is_transient(err: &RedisError) -> bool {
    !is_access_refusal(err)
        && (err.is_timeout()
            || is_changing_over(err)
            || !matches!(err.retry_method(), RetryMethod::NoRetry))
}

/// Whether the server refused who we are, or we refused who it is: a wrong password or user,
/// missing permissions, a certificate not trusted (or ours not accepted). Trying again until
/// a deadline would only hide a setting to fix.
pub(crate) fn is_access_refusal(err: &RedisError) -> bool {
    err.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(err.code(), Some("WRONGPASS" | "NOAUTH"))
        || is_acl_refusal(err)
        || is_tls_refusal(err)
}

/// Whether the server's ACL refuses the user a key, channel or command: `NOPERM`, or a
/// command a script runs, which Redis 7.0 reports as "The user executing the script can't
/// run this command or subcommand" (or "... access at least one of the keys") and Redis
/// 7.2 and Valkey as "ACL failure in script", with the code `ERR`; Redis 6.2 puts "Error
/// running script (call to ...): @user_script:N: @user_script: N: " before it. Read at the start of the
/// message (after that prefix) only: a script's own error may quote a key that contains
/// the words (a fencing counter's name).
pub(crate) fn is_acl_refusal(err: &RedisError) -> bool {
    if err.code() == Some("NOPERM") {
        return true;
    }
    let Some(message) = inner_message(err).or_else(|| err.detail().map(str::to_owned)) else {
        return false;
    };
    let message = message.to_ascii_lowercase();
    [
        "the user executing the script can't",
        "acl failure in script",
    ]
    .iter()
    .any(|start| message.starts_with(start))
}

/// Whether the server refused the database a URL selects (`SELECT` of an index it lacks).
pub(crate) fn is_no_such_database(err: &RedisError) -> bool {
    err.to_string().contains("DB index is out of range")
}

/// Whether `err` is a TLS handshake that failed: the server's certificate not trusted (an
/// unknown CA, another host name, expired), or ours refused or missing (an alert from the
/// server). rustls reports these inside the I/O error redis-rs keeps (in an `Arc`; the I/O
/// error's own `source` skips the rustls error, so the chain is not enough).
#[cfg(feature = "tls")]
pub(crate) fn is_tls_refusal(err: &RedisError) -> bool {
    type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    let Some(source) = std::error::Error::source(err) else {
        return false;
    };
    let io = match source.downcast_ref::<Shared>() {
        Some(shared) => shared.downcast_ref::<std::io::Error>(),
        None => source.downcast_ref::<std::io::Error>(),
    };
    io.and_then(std::io::Error::get_ref)
        .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some())
}

/// Without TLS, no handshake can fail.
#[cfg(not(feature = "tls"))]
pub(crate) fn is_tls_refusal(_: &RedisError) -> bool {
    false
}

/// Whether `err` refuses a command or the form it was sent in: the server does not know it
/// or one of its options, or the ACL user may not run it. (Not an error about the key, such
/// as WRONGTYPE.)
pub(crate) fn refuses_command_form(err: &RedisError) -> bool {
    is_syntax_error(err) || err.code() == Some("NOPERM") || refuses_command(err)
}

/// Whether `err` refuses the command itself, whatever its arguments: the server does not
/// know it (or it was renamed away), or the ACL user may not run it. (Not a refusal of the
/// keys it names, nor of a command a script runs.)
pub(crate) fn refuses_command(err: &RedisError) -> bool {
    match err.code() {
        Some("NOPERM") => err
            .detail()
            .is_some_and(|detail| detail.to_ascii_lowercase().contains("permissions to run")),
        _ => is_unknown_command(err),
    }
}

/// Whether the server does not know the command (or it was renamed away). Read off the whole
/// text: a cluster connection may wrap the server's reply.
pub(crate) fn is_unknown_command(err: &RedisError) -> bool {
    err.to_string()
        .to_ascii_lowercase()
        .contains("unknown command")
}

/// Whether `err` says the server does not understand a command's arguments.
pub(crate) fn is_syntax_error(err: &RedisError) -> bool {
    err.code() == Some("ERR") && err.detail().is_some_and(|d| d.contains("syntax error"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_refused_inside_a_script_is_an_acl_refusal() {
        let refusal = |text: &str| {
            RedisError::from((
                redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
                "An error was signalled by the server",
                text.to_owned(),
            ))
        };
        for text in [
            "The user executing the script can't run this command or subcommand script: 3f1a, on @user_script:82.",
            "ACL failure in script: User 'min' has no permissions to run the 'pexpire' command script: 3f1a, on @user_script:82.",
        ] {
            assert!(is_acl_refusal(&refusal(text)), "{text}");
            assert!(is_access_refusal(&refusal(text)), "{text}");
        }
        assert!(!is_acl_refusal(&refusal(
            "user_script:1: Script attempted to access nonexistent global variable"
        )));
    }

    fn server_error(line: &str) -> RedisError {
        match redis::parse_redis_value(line.as_bytes()).map(redis::Value::extract_error) {
            Ok(Err(err)) => err,
            other => panic!("not an error reply: {other:?}"),
        }
    }

    #[test]
    fn a_refusal_a_script_returns_from_pcall_on_redis_6_is_an_acl_refusal() {
        let refused = server_error(
            "-@user_script: 105: The user executing the script can't run this command or subcommand\r\n",
        );
        assert!(is_acl_refusal(&refused), "{refused:?}");
        let other = server_error("-@user_script: 12: Script attempted to access a global\r\n");
        assert!(!is_acl_refusal(&other), "{other:?}");
    }

    #[test]
    fn only_a_refusal_of_the_command_itself_refuses_scripts() {
        for line in [
            "-NOPERM User locker has no permissions to run the 'evalsha' command\r\n",
            "-NOPERM this user has no permissions to run the 'eval' command or its subcommand\r\n",
            "-ERR unknown command 'EVALSHA', with args beginning with: 'abc' '0' \r\n",
            "-ERR unknown command `EVALSHA`, with args beginning with: `abc`, `0`, \r\n",
        ] {
            assert!(refuses_command(&server_error(line)), "{line}");
        }
        for line in [
            "-NOPERM No permissions to access a key\r\n",
            "-ERR The user executing the script can't access at least one of the keys\r\n",
            "-NOSCRIPT No matching script. Please use EVAL.\r\n",
            "-LOADING Redis is loading the dataset in memory\r\n",
        ] {
            assert!(!refuses_command(&server_error(line)), "{line}");
        }
    }

    #[test]
    fn a_server_that_cannot_serve_now_is_changing_over_and_transient() {
        for line in [
            "-LOADING Redis is loading the dataset in memory\r\n",
            "-READONLY You can't write against a read only replica.\r\n",
            "-MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.\r\n",
            "-NOREPLICAS Not enough good replicas to write.\r\n",
        ] {
            let err = server_error(line);
            assert!(is_changing_over(&err) && is_transient(&err), "{line}");
        }
        // Redis 6.2, a command inside a script told so: returned from pcall, or raised.
        for line in [
            "-@user_script: 70: -NOREPLICAS Not enough good replicas to write.\r\n",
            "-ERR Error running script (call to f_1a2b): @user_script:70: @user_script: 70: -READONLY You can't write against a read only replica.\r\n",
        ] {
            let err = server_error(line);
            assert!(is_changing_over(&err) && is_transient(&err), "{line}");
        }
        let held = server_error("-WRONGTYPE Operation against a key holding the wrong kind\r\n");
        assert!(!is_changing_over(&held) && !is_transient(&held));
        let wrapped = server_error("-@user_script: 70: -WRONGTYPE Operation against a key\r\n");
        assert!(!is_changing_over(&wrapped));
    }

    #[cfg(feature = "tls")]
    #[test]
    fn a_rejected_certificate_is_a_refusal() {
        let rustls = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, rustls);
        assert!(is_tls_refusal(&RedisError::from(io)));
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(!is_tls_refusal(&RedisError::from(reset)));
    }
}
