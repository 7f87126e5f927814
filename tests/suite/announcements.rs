//! What a Sentinel client makes of the sentinels' `+switch-master` announcements. The
//! sentinel that leads a failover announces the switch only once it has reconfigured the
//! replicas, seconds after the other sentinels named the new primary: a client that looked
//! the primary up in between follows the new one already, and the late announcement must
//! change nothing for it (CI saw a `lockset run` started then fail with "the primary
//! changed while the obtain was on its way").

use crate::support;

use std::time::Duration;

use futures_util::StreamExt as _;
use lockset::{Client, Options, Replication};
use support::ms;
use support::sentinel::{Failover, MASTER};
use tokio::time::Instant;

/// How many times the data node at `port` was asked `ROLE`: once per lookup of the primary
/// by a client (the sentinels ask `INFO`).
fn role_calls(failover: &Failover, port: u16) -> u64 {
    let stats = failover.ask_node(port, &["INFO", "commandstats"]);
    stats
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_role:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|calls| calls.parse().ok())
        .unwrap_or(0)
}

/// How many clients of the sentinel at `port` subscribe to a channel (`PUBSUB NUMSUB` is
/// refused on a sentinel).
fn subscribers(failover: &Failover, port: u16) -> usize {
    let clients = failover.ask_sentinel(port, &["CLIENT", "LIST"]);
    clients
        .lines()
        .filter(|line| line.contains(" sub=1 "))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_announcement_of_the_primary_a_client_follows_changes_nothing() {
    // Node 1 is never promoted, node 2 is the successor.
    let failover = Failover::start_with_a_successor().await;
    failover.slow_failovers();
    let leader = failover.sentinels[0].port();
    let url = format!("redis://127.0.0.1:{leader}/");
    let mut pubsub = lockset::redis::Client::open(url)
        .unwrap()
        .get_async_pubsub()
        .await
        .unwrap();
    pubsub.subscribe("+switch-master").await.unwrap();
    let mut announcements = pubsub.into_on_message();
    // Paused, node 1 holds the leader's failover open: it waits up to 10 s to reconfigure it.
    failover.nodes[1].pause();
    let old = failover.nodes[0].port();
    failover.fail_over_on_purpose();
    let promoted = failover.wait_for_promotion(old).await;
    assert_eq!(promoted, 2);
    let primary = failover.nodes[2].port();
    // The client lists the leader first: it hears announcements from it.
    let client = Client::connect_sentinel(failover.config(Replication::none()))
        .await
        .unwrap();
    let options = Options::default();
    client
        .obtain("job", ms(10_000), &options)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let lookups = role_calls(&failover, primary);
    assert!(
        tokio::time::timeout(Duration::ZERO, announcements.next())
            .await
            .is_err(),
        "the leader announced the switch before the client looked the primary up"
    );

    // The client listens on the leader (beside this test) before the leader announces.
    let start = Instant::now();
    while subscribers(&failover, leader) < 2 {
        assert!(
            start.elapsed() < ms(10_000),
            "the client never subscribed to the leader"
        );
        tokio::time::sleep(ms(20)).await;
    }
    failover.nodes[1].resume();
    let heard = tokio::time::timeout(ms(20_000), announcements.next())
        .await
        .expect("the leader announces the switch once node 1 answers")
        .expect("subscribed");
    let said: String = heard.get_payload().unwrap();
    assert!(
        said.starts_with(&format!("{MASTER} ")) && said.ends_with(&format!(" {primary}")),
        "{said}"
    );
    // The client heard it too (same publish): obtains keep going to the same primary, none
    // undone, and nothing looks the primary up again.
    let until = Instant::now() + ms(1_000);
    while Instant::now() < until {
        let start = Instant::now();
        let lock = client.obtain("job", ms(10_000), &options).await.unwrap();
        lock.release().await.unwrap();
        assert!(start.elapsed() < ms(500), "{:?}", start.elapsed());
    }
    assert_eq!(
        role_calls(&failover, primary),
        lookups,
        "the primary was looked up again"
    );
}
