//! `lockset status`: who holds each key, and for how long (never the token), then who waits
//! for it in its queue; once, or redrawn every interval (`--watch`).

use std::io::{IsTerminal as _, Write as _};
use std::time::Duration;

use lockset::redis::aio::ConnectionLike;
use lockset::{Mode, QueuedWaiter};
use serde_json::json;

use crate::cli::StatusArgs;
use crate::connect::Redis;
use crate::duration;
use crate::exit::{self, Failure, SYSTEM};
use crate::holder::{self, Key, Node};

/// What the sentinels say, behind Sentinel: one line each (see
/// `SentinelConnection::sentinels_say`).
pub(crate) type Sentinels<'a> = Option<&'a lockset::SentinelConnection>;

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
        print(&render(&seen, &said(sentinels).await, args.json, None))?;
        return Ok(0);
    };
    let redraw = std::io::stdout().is_terminal();
    loop {
        let seen = look(redis, &args.keys).await?;
        let now = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
        let at = (args.json && !redraw).then_some(now.as_str());
        let text = render(&seen, &said(sentinels).await, args.json, at);
        let text = match redraw {
            // Home, clear the screen, then the status.
            true => format!("\x1b[H\x1b[2J{text}"),
            // JSON lines stay one object a line, the time inside.
            false if args.json => text,
            false => log_round(&now, &text),
        };
        if !print(&text)? {
            return Ok(0);
        }
        tokio::time::sleep(every).await;
    }
}

/// Reads every key, its holders and its queue, on every server.
async fn look<C>(redis: &Redis<C>, keys: &[String]) -> Result<Vec<Key>, Failure>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    holder::inspect_all(&redis.nodes, keys, None)
        .await
        .map_err(|err| exit::redis_failure("cannot read the keys from Redis", &err))
}

/// The status as text: lines, or one JSON object on a line (with the time `at`, when given).
fn render(seen: &[Key], sentinels: &[String], json: bool, at: Option<&str>) -> String {
    match json {
        true => {
            let mut value = as_json(seen);
            if !sentinels.is_empty() {
                value["sentinels"] = json!(sentinels);
            }
            if let Some(at) = at {
                value["time"] = json!(at);
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

/// One round of a line log: its time stamp `now`, then the round's lines indented.
fn log_round(now: &str, text: &str) -> String {
    let lines: String = text.lines().map(|line| format!("  {line}\n")).collect();
    format!("{now}\n{lines}")
}

/// Prints `text`: true when printed, false when stdout's reader has left (a pipe closed
/// behind it, as `status --watch | head` closes it): nobody is left to tell, and the
/// commands of a pipe end quietly then.
fn print(text: &str) -> Result<bool, Failure> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => Ok(true),
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(err) => Err(Failure::new(
            SYSTEM,
            format!("cannot print the status: {err}"),
        )),
    }
}

/// `"orders" is held by "web-1:42" (12.3s left)` (or every shared or counted holder), plus
/// the masters holding it for a quorum, then a line per waiter:
/// `  1. "web-2:17" waiting 3.2s (lease 4.1s left)`.
fn as_lines(key: &Key) -> String {
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
    if !key.queue_readable {
        text.push_str(QUEUE_NOT_READABLE);
    }
    for (node, queue) in key.queues.iter().enumerate() {
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

/// The line under a key whose queue the ACL refuses this user.
const QUEUE_NOT_READABLE: &str = "  queue not readable by this user: its ACL covers the key, not \
     the queue names that begin with it (see the servers guide)\n";

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

/// `{"keys": [{"key", "state", "mode", "limit", "metadata", "ttl_ms", "held_on", "nodes",
/// "holders", "waiters", "writer_waiting_ms", "queue_readable"}]}`: `metadata` is an
/// exclusive holder's, `ttl_ms` the longest left of any holder, `holders` every holder on
/// every server, `writer_waiting_ms` what is left of a writer's mark (null: none),
/// `queue_readable` false when the ACL refused this user the key's queue.
fn as_json(seen: &[Key]) -> serde_json::Value {
    let keys: Vec<_> = seen
        .iter()
        .map(|key| {
            let waiters: Vec<_> = key
                .queues
                .iter()
                .enumerate()
                .flat_map(|(node, queue)| queue.iter().map(move |w| waiter_json(w, node)))
                .collect();
            let holders: Vec<_> = key
                .nodes
                .iter()
                .enumerate()
                .flat_map(|(node, seen)| {
                    let holders = match seen {
                        Node::Held { holders, .. } => holders.as_slice(),
                        _ => &[],
                    };
                    holders.iter().map(move |holder| {
                        json!({
                            "metadata": holder.metadata,
                            "ttl_ms": holder.ttl.map(millis),
                            "node": node,
                        })
                    })
                })
                .collect();
            let limit = match key.mode() {
                Some(Mode::Permit { limit }) => Some(limit),
                _ => None,
            };
            json!({
                "key": key.name,
                "state": key.state().name(),
                "mode": key.mode().map(holder::mode_name),
                "limit": limit,
                "metadata": key.metadata(),
                "ttl_ms": key.ttl().map(millis),
                "held_on": key.held_on(),
                "queue_readable": key.queue_readable,
                "nodes": key.nodes.len(),
                "holders": holders,
                "waiters": waiters,
                "writer_waiting_ms": key.writer_waiting.map(millis),
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
    use crate::holder::Holder;

    fn key(mode: Mode, holders: &[(&str, u64)]) -> Key {
        let holders = holders
            .iter()
            .map(|(metadata, ms)| Holder {
                metadata: (*metadata).to_owned(),
                ttl: Some(Duration::from_millis(*ms)),
                ours: false,
            })
            .collect();
        Key {
            name: "k".to_owned(),
            nodes: vec![Node::Held { mode, holders }],
            queues: vec![Vec::new()],
            writer_waiting: None,
            queue_readable: true,
        }
    }

    #[test]
    fn json_shows_metadata_and_time_left() {
        let text = as_json(&[key(Mode::Exclusive, &[("web-1:42", 1500)])]).to_string();
        assert_eq!(
            text,
            r#"{"keys":[{"held_on":1,"holders":[{"metadata":"web-1:42","node":0,"ttl_ms":1500}],"key":"k","limit":null,"metadata":"web-1:42","mode":"exclusive","nodes":1,"queue_readable":true,"state":"held","ttl_ms":1500,"waiters":[],"writer_waiting_ms":null}]}"#
        );
    }

    #[test]
    fn json_lists_every_holder_of_a_counted_key() {
        let text = as_json(&[key(Mode::Permit { limit: 3 }, &[("a", 1500), ("b", 900)])]);
        let text = text.to_string();
        assert_eq!(
            text,
            r#"{"keys":[{"held_on":1,"holders":[{"metadata":"a","node":0,"ttl_ms":1500},{"metadata":"b","node":0,"ttl_ms":900}],"key":"k","limit":3,"metadata":null,"mode":"permits","nodes":1,"queue_readable":true,"state":"held","ttl_ms":1500,"waiters":[],"writer_waiting_ms":null}]}"#
        );
    }

    #[test]
    fn a_line_log_stamps_each_round() {
        let round = log_round("2026-11-29T12:00:00Z", "\"k\" is free\n");
        let lines: Vec<&str> = round.lines().collect();
        assert_eq!(lines.len(), 2, "{round}");
        assert!(lines[0].ends_with('Z'), "{round}");
        assert_eq!(lines[1], "  \"k\" is free");
    }
}
