//! Durations on the command line (`500ms`, `30s`, `5m`, humantime's syntax) and on stderr.

use std::time::Duration;

/// A duration of zero or more: `0`, `500ms`, `30s`, `1h 30m`.
pub(crate) fn non_negative(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.starts_with('-') {
        return Err("a duration cannot be negative".to_owned());
    }
    humantime::parse_duration(text)
        .map_err(|err| format!("{err} (write a number with a unit: 500ms, 30s, 5m)"))
}

/// A duration above zero: how often `status --watch` redraws.
pub(crate) fn positive(text: &str) -> Result<Duration, String> {
    let every = non_negative(text)?;
    if every.is_zero() {
        return Err("the interval must be above zero".to_owned());
    }
    Ok(every)
}

/// A lock's time to live: at least a millisecond, at most the library's limit.
pub(crate) fn ttl(text: &str) -> Result<Duration, String> {
    let ttl = non_negative(text)?;
    if ttl < Duration::from_millis(1) {
        return Err("the TTL must be at least 1ms".to_owned());
    }
    if ttl > lockset::MAX_TTL {
        return Err(format!(
            "the TTL must be at most {}",
            humantime::format_duration(lockset::MAX_TTL)
        ));
    }
    Ok(ttl)
}

/// A remaining time for people: `12.3s`, `250ms`, `4m 10s`.
pub(crate) fn show(left: Duration) -> String {
    if left < Duration::from_secs(1) {
        format!("{}ms", left.as_millis())
    } else if left < Duration::from_secs(60) {
        format!("{:.1}s", left.as_secs_f64())
    } else {
        humantime::format_duration(Duration::from_secs(left.as_secs())).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_are_parsed() {
        assert_eq!(non_negative("0"), Ok(Duration::ZERO));
        assert_eq!(non_negative("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(ttl("5m"), Ok(Duration::from_secs(300)));
    }

    #[test]
    fn bad_durations_are_refused() {
        assert!(non_negative("-1s").unwrap_err().contains("negative"));
        assert!(non_negative("ten").is_err());
        assert!(non_negative("10").is_err(), "a bare number has no unit");
        assert!(ttl("0").unwrap_err().contains("at least 1ms"));
        assert!(ttl("0s").is_err());
        assert!(ttl("1000000y").unwrap_err().contains("at most"));
    }

    #[test]
    fn remaining_times_read_well() {
        assert_eq!(show(Duration::from_millis(250)), "250ms");
        assert_eq!(show(Duration::from_millis(12_345)), "12.3s");
        assert_eq!(show(Duration::from_secs(250)), "4m 10s");
    }
}
