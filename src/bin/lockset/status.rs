//! `lockset status`: who holds each key, and for how long (never the token).

use std::io::Write as _;

use lockset::redis::aio::ConnectionLike;
use serde_json::json;

use crate::cli::StatusArgs;
use crate::connect::Redis;
use crate::exit::{self, Failure, SYSTEM};
use crate::holder::{self, Key};

/// Prints the state of every key on stdout: a line each, or one JSON object.
pub(crate) async fn status<C>(redis: &Redis<C>, args: &StatusArgs) -> Result<u8, Failure>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let keys = holder::inspect_all(&redis.nodes, &args.keys)
        .await
        .map_err(|err| exit::redis_failure("cannot read the keys from Redis", &err))?;
    let text = match args.json {
        true => format!("{}\n", as_json(&keys)),
        false => keys
            .iter()
            .map(|key| format!("{}\n", as_line(key)))
            .collect(),
    };
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(|err| Failure::new(SYSTEM, format!("cannot print the status: {err}")))?;
    Ok(0)
}

/// `"orders" is held by web-1:42 (12.3s left)`, plus the masters holding it for a quorum.
fn as_line(key: &Key) -> String {
    let nodes = key.nodes.len();
    match nodes {
        1 => key.describe(),
        _ => format!(
            "{}, on {} of {nodes} masters",
            key.describe(),
            key.held_on()
        ),
    }
}

/// `{"keys": [{"key", "state", "metadata", "ttl_ms", "held_on", "nodes"}]}`.
fn as_json(keys: &[Key]) -> serde_json::Value {
    let keys: Vec<_> = keys
        .iter()
        .map(|key| {
            json!({
                "key": key.name,
                "state": key.state().name(),
                "metadata": key.metadata(),
                "ttl_ms": key.ttl().map(|ttl| u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)),
                "held_on": key.held_on(),
                "nodes": key.nodes.len(),
            })
        })
        .collect();
    json!({ "keys": keys })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

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
        let text = as_json(&[key]).to_string();
        assert_eq!(
            text,
            r#"{"keys":[{"held_on":1,"key":"k","metadata":"web-1:42","nodes":1,"state":"held","ttl_ms":1500}]}"#
        );
    }
}
