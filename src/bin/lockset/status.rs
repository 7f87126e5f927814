//! `lockset status`: who holds each key, and for how long (never the token), then who waits
//! for it in its queue; once, or redrawn every interval (`--watch`).

use std::io::{IsTerminal as _, Write as _};
use std::time::Duration;

use lockset::QueuedWaiter;
use lockset::redis::RedisResult;
use lockset::redis::aio::ConnectionLike;
use serde_json::json;

use crate::cli::StatusArgs;
use crate::connect::Redis;
use crate::duration;
use crate::exit::{self, Failure, SYSTEM};
use crate::holder::{self, Key};

/// What the sentinels say, behind Sentinel: one line each (see
/// `SentinelConnection::sentinels_say`).
pub(crate) type Sentinels<'a> = Option<&'a lockset::SentinelConnection>;

/// A key and who waits for it, on each server.
struct Seen {
    key: Key,
    /// Per server (one, or each Redlock master), its queue for the key, first come first.
    queues: Vec<Vec<QueuedWaiter>>,
}

/// Prints the state of every key on stdout: a line each (and one per waiter), or one JSON
/// object; with `--watch`, again every interval until interrupted.
pub(crate) async fn status<C>(
    redis: &Redis<C>,
    args: &StatusArgs,
    sentinels: Sentinels<'_>,
) -> Result<u8, Failure>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let Some(every) = args.watch else {
        let seen = look(redis, &args.keys).await?;
        print(&render(&seen, &said(sentinels).await, args.json))?;
        return Ok(0);
    };
    let redraw = std::io::stdout().is_terminal();
    loop {
        let seen = look(redis, &args.keys).await?;
        let text = render(&seen, &said(sentinels).await, args.json);
        let text = match redraw {
            // Home, clear the screen, then the status.
            true => format!("\x1b[H\x1b[2J{text}"),
            false => log_round(&text),
        };
        print(&text)?;
        tokio::time::sleep(every).await;
    }
}

/// Reads every key, and its queue on every server.
async fn look<C>(redis: &Redis<C>, keys: &[String]) -> Result<Vec<Seen>, Failure>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let failed = |err| exit::redis_failure("cannot read the keys from Redis", &err);
    let held = holder::inspect_all(&redis.nodes, keys)
        .await
        .map_err(failed)?;
    let mut seen = Vec::with_capacity(held.len());
    for key in held {
        let queues = queues(&redis.nodes, &key.name).await.map_err(failed)?;
        seen.push(Seen { key, queues });
    }
    Ok(seen)
}

/// `key`'s queue on every server; a server that does not answer shows none.
async fn queues<C>(nodes: &[C], key: &str) -> RedisResult<Vec<Vec<QueuedWaiter>>>
where
    C: ConnectionLike + Clone,
{
    let mut queues = Vec::with_capacity(nodes.len());
    let mut last_error = None;
    for conn in nodes {
        match lockset::read_queue(&mut conn.clone(), key).await {
            Ok(queue) => queues.push(queue),
            Err(err) => {
                queues.push(Vec::new());
                last_error = Some(err);
            }
        }
    }
    match last_error {
        Some(err) if nodes.len() == 1 => Err(err),
        _ => Ok(queues),
    }
}

/// The status as text: lines, or one JSON object on a line.
fn render(seen: &[Seen], sentinels: &[String], json: bool) -> String {
    match json {
        true => {
            let mut value = as_json(seen);
            if !sentinels.is_empty() {
                value["sentinels"] = json!(sentinels);
            }
            format!("{value}\n")
        }
        false => {
            let keys: String = seen.iter().map(as_lines).collect();
            let sentinels: String = sentinels
                .iter()
                .map(|line| format!("sentinel {line}\n"))
                .collect();
            keys + &sentinels
        }
    }
}

/// What each sentinel names as the primary now (none without Sentinel).
async fn said(sentinels: Sentinels<'_>) -> Vec<String> {
    match sentinels {
        Some(conn) => conn.sentinels_say().await,
        None => Vec::new(),
    }
}

/// One round of a line log: a time stamp, then the round's lines indented.
fn log_round(text: &str) -> String {
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now());
    let lines: String = text.lines().map(|line| format!("  {line}\n")).collect();
    format!("{now}\n{lines}")
}

fn print(text: &str) -> Result<(), Failure> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(|err| Failure::new(SYSTEM, format!("cannot print the status: {err}")))
}

/// `"orders" is held by "web-1:42" (12.3s left)`, plus the masters holding it for a quorum,
/// then a line per waiter: `  1. "web-2:17" waiting 3.2s (lease 4.1s left)`.
fn as_lines(seen: &Seen) -> String {
    let key = &seen.key;
    let nodes = key.nodes.len();
    let head = match nodes {
        1 => key.describe(),
        _ => format!(
            "{}, on {} of {nodes} masters",
            key.describe(),
            key.held_on()
        ),
    };
    let mut text = format!("{head}\n");
    for (node, queue) in seen.queues.iter().enumerate() {
        for (place, waiter) in queue.iter().enumerate() {
            let on = match nodes {
                1 => String::new(),
                _ => format!("master {}: ", node + 1),
            };
            text.push_str(&format!("  {on}{}. {}\n", place + 1, describe(waiter)));
        }
    }
    text
}

/// `"web-2:17" waiting 3.2s (lease 4.1s left)`; metadata quoted, as the holder's is.
fn describe(waiter: &QueuedWaiter) -> String {
    let who = match waiter.metadata.as_str() {
        "" => "a waiter without metadata".to_owned(),
        metadata => format!("{metadata:?}"),
    };
    let lease = match waiter.lease {
        Some(left) => format!("lease {} left", duration::show(left)),
        None => "lease ran out: gone at the next release".to_owned(),
    };
    let more = match waiter.keys.len() {
        0 | 1 => String::new(),
        n => format!(", for {n} keys"),
    };
    format!(
        "{who} waiting {} ({lease}{more})",
        duration::show(waiter.waited)
    )
}

/// `{"keys": [{"key", "state", "metadata", "ttl_ms", "held_on", "nodes", "waiters"}]}`.
fn as_json(seen: &[Seen]) -> serde_json::Value {
    let keys: Vec<_> = seen
        .iter()
        .map(|Seen { key, queues }| {
            let waiters: Vec<_> = queues
                .iter()
                .enumerate()
                .flat_map(|(node, queue)| queue.iter().map(move |w| waiter_json(w, node)))
                .collect();
            json!({
                "key": key.name,
                "state": key.state().name(),
                "metadata": key.metadata(),
                "ttl_ms": key.ttl().map(millis),
                "held_on": key.held_on(),
                "nodes": key.nodes.len(),
                "waiters": waiters,
            })
        })
        .collect();
    json!({ "keys": keys })
}

/// `{"metadata", "waited_ms", "lease_ms", "keys", "node"}`.
fn waiter_json(waiter: &QueuedWaiter, node: usize) -> serde_json::Value {
    json!({
        "metadata": waiter.metadata,
        "waited_ms": millis(waiter.waited),
        "lease_ms": waiter.lease.map(millis),
        "keys": waiter.keys,
        "node": node,
    })
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::holder::Node;

    #[test]
    fn json_shows_metadata_and_time_left_but_not_the_token() {
        let key = Key {
            name: "k".to_owned(),
            nodes: vec![Node::Held {
                token: "secret".to_owned(),
                metadata: "web-1:42".to_owned(),
                ttl: Some(Duration::from_millis(1500)),
            }],
        };
        let text = as_json(&[Seen {
            key,
            queues: vec![Vec::new()],
        }])
        .to_string();
        assert_eq!(
            text,
            r#"{"keys":[{"held_on":1,"key":"k","metadata":"web-1:42","nodes":1,"state":"held","ttl_ms":1500,"waiters":[]}]}"#
        );
    }

    #[test]
    fn a_line_log_stamps_each_round() {
        let round = log_round("\"k\" is free\n");
        let lines: Vec<&str> = round.lines().collect();
        assert_eq!(lines.len(), 2, "{round}");
        assert!(lines[0].ends_with('Z'), "{round}");
        assert_eq!(lines[1], "  \"k\" is free");
    }
}
