//! The core behaviours on a real three-master Redis Cluster (feature `cluster`).
#![cfg(feature = "cluster")]

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use lockset::redis::cluster::ClusterClient;
use lockset::{Client, Error, InvalidInput, Jitter, Options, Retry, slot_number};
use support::cluster::Cluster;
use support::{Exclusion, ms};

async fn client(cluster: &Cluster) -> Client {
    let conn = ClusterClient::new(cluster.urls())
        .unwrap()
        .get_async_connection()
        .await
        .unwrap();
    Client::cluster(conn)
}

fn total_keys(cluster: &Cluster) -> usize {
    (0..3)
        .map(|i| cluster.cli(i, &["DBSIZE"]).trim().parse::<usize>().unwrap())
        .sum()
}

/// A cluster node's folder (its node file) goes with it: a later node on the same port
/// would otherwise start with the old node's cluster configuration, and `--cluster create`
/// refuses a node that is not empty.
#[test]
fn a_stopped_cluster_node_leaves_no_node_file_behind() {
    let node = support::RedisServer::start_cluster_node();
    let dir = node.dir().expect("a cluster node has a folder").to_owned();
    assert!(dir.join("nodes.conf").exists(), "{dir:?}");
    drop(node);
    assert!(!dir.exists(), "{dir:?} is left behind");
}

#[tokio::test]
async fn locks_work_on_every_shard() {
    let cluster = Cluster::start();
    let client = client(&cluster).await;
    // Tags that land on different masters.
    let mut owners = std::collections::BTreeSet::new();
    for tag in ["a", "b", "c", "d", "e", "f", "g", "h"] {
        let keys = [format!("{{{tag}}}:x"), format!("{{{tag}}}:y")];
        owners.insert(cluster.owner_of(cluster.keyslot(&keys[0])));
        let lock = client
            .obtain_multi(keys.clone(), ms(10_000), &Options::default())
            .await
            .unwrap();
        assert!(
            client
                .obtain(&keys[1], ms(10_000), &Options::default())
                .await
                .unwrap_err()
                .is_not_obtained()
        );
        assert!(lock.ttl().await.unwrap().unwrap() > ms(5_000));
        lock.refresh(ms(30_000), &Options::default()).await.unwrap();
        lock.release().await.unwrap();
    }
    assert_eq!(owners.len(), 3, "the tags should cover every master");
    assert_eq!(total_keys(&cluster), 0);
}

#[tokio::test]
async fn refresh_with_metadata_replaces_it_on_a_cluster() {
    let cluster = Cluster::start();
    let client = client(&cluster).await;
    let keys = ["{m}:a", "{m}:b"];
    let options = Options::default().metadata("old");
    let lock = client
        .obtain_multi(keys, ms(10_000), &options)
        .await
        .unwrap();
    lock.refresh(ms(30_000), &Options::default().metadata("new"))
        .await
        .unwrap();
    assert_eq!(lock.metadata(), "new");
    let owner = cluster.owner_of(cluster.keyslot(keys[0]));
    for key in keys {
        let stored = cluster.cli(owner, &["GET", key]);
        assert_eq!(stored.trim(), format!("22:{}new", lock.token()), "{key}");
    }
    lock.release().await.unwrap();
}

#[tokio::test]
async fn keys_in_different_slots_are_refused_before_sending() {
    let cluster = Cluster::start();
    let client = client(&cluster).await;
    let err = client
        .obtain_multi(["cart", "wallet"], ms(10_000), &Options::default())
        .await
        .unwrap_err();
    let Error::InvalidInput(InvalidInput::CrossSlot { keys }) = &err else {
        panic!("expected a cross-slot error, got {err:?}");
    };
    assert_eq!(
        keys,
        &vec![
            ("cart".to_owned(), cluster.keyslot("cart")),
            ("wallet".to_owned(), cluster.keyslot("wallet")),
        ]
    );
    let message = err.to_string();
    assert!(
        message.contains("\"cart\"") && message.contains("hash tag"),
        "{message}"
    );

    // A fencing counter in another slot is refused the same way.
    let options = Options::default().fencing_key("counter");
    let err = client
        .obtain("{u1}:a", ms(10_000), &options)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::InvalidInput(InvalidInput::CrossSlot { .. })),
        "{err:?}"
    );
    // The derived counter keeps the slot.
    let lock = client
        .obtain("{u1}:a", ms(10_000), &Options::default().fencing())
        .await
        .unwrap();
    assert!(lock.fencing_token().is_some());
    lock.release().await.unwrap();
    assert_eq!(total_keys(&cluster), 1, "only the fencing counter is left");
}

#[tokio::test]
async fn slots_match_what_redis_reports() {
    let cluster = Cluster::start();
    for key in [
        "foo",
        "bar",
        "{user42}:cart",
        "{user42}:wallet",
        "a{b}c",
        "{}x",
        "x{}{y}",
        "{{a}}",
        "lock:é",
    ] {
        assert_eq!(slot_number(key), cluster.keyslot(key), "{key}");
    }
    for i in 0..200 {
        let key = format!("k{i}:{}", i * 7919);
        assert_eq!(slot_number(&key), cluster.keyslot(&key), "{key}");
    }
}

#[tokio::test]
async fn a_key_holding_a_hash_is_a_wrong_type_error_on_a_cluster() {
    let cluster = Cluster::start();
    let client = client(&cluster).await;
    let slot = cluster.keyslot("{w}:h");
    cluster.cli(cluster.owner_of(slot), &["HSET", "{w}:h", "f", "v"]);
    let err = client
        .obtain_multi(["{w}:a", "{w}:h"], ms(10_000), &Options::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::WrongType { key } if key == "{w}:h"),
        "{err:?}"
    );
    assert_eq!(total_keys(&cluster), 1);
}

#[tokio::test]
async fn a_held_lock_survives_the_migration_of_its_slot() {
    let cluster = Cluster::start();
    let client = client(&cluster).await;
    let keys = ["{moving}:a", "{moving}:b"];
    let lock = client
        .obtain_multi(keys, ms(60_000), &Options::default())
        .await
        .unwrap();
    let slot = cluster.keyslot(keys[0]);
    let from = cluster.owner_of(slot);
    let to = (from + 1) % 3;
    cluster.migrate_slot(slot, from, to);
    assert_eq!(cluster.owner_of(slot), to);

    // The client follows MOVED to the new owner.
    assert!(lock.ttl().await.unwrap().unwrap() > ms(30_000));
    lock.refresh(ms(60_000), &Options::default()).await.unwrap();
    let err = client
        .obtain(keys[1], ms(10_000), &Options::default())
        .await
        .unwrap_err();
    assert!(err.is_not_obtained(), "{err:?}");
    lock.release().await.unwrap();
    assert_eq!(total_keys(&cluster), 0);
}

// A slot *in* migration: the source serves the keys it still has, redirects the others to
// the target (ASK), and answers TRYAGAIN for a script whose keys are split between the two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_work_while_their_slot_is_migrating() {
    let cluster = Cluster::start();
    let client = client(&cluster).await;
    let held = ["{mig}:a", "{mig}:b"];
    let lock = Arc::new(
        client
            .obtain_multi(held, ms(60_000), &Options::default())
            .await
            .unwrap(),
    );
    let slot = cluster.keyslot(held[0]);
    let from = cluster.owner_of(slot);
    let to = (from + 1) % 3;
    let dbsize = |i: usize| -> usize { cluster.cli(i, &["DBSIZE"]).trim().parse().unwrap() };
    cluster.begin_migration(slot, from, to);

    // Keys the source still has: served there.
    lock.refresh(ms(60_000), &Options::default()).await.unwrap();
    // A new single-key lock in the migrating slot: the source does not have the key and
    // sends the client to the target (ASK), which creates it; its release follows ASK too.
    let fresh = client
        .obtain("{mig}:c", ms(60_000), &Options::default())
        .await
        .unwrap();
    assert_eq!(dbsize(to), 1, "the new lock lives on the importing node");
    assert!(fresh.ttl().await.unwrap().unwrap() > ms(30_000));
    fresh.release().await.unwrap();
    assert_eq!(dbsize(to), 0, "released on the importing node");

    // Split the held lock: one key moved, one not. Its refresh and a rival's obtain now get
    // TRYAGAIN until the migration ends, and so does a new multi-key lock (a node importing
    // a slot creates no two keys of it at once); then each must do the right thing.
    cluster.move_keys(from, to, &[held[0]]);
    let tried_again = || cluster.errors(from, "TRYAGAIN") + cluster.errors(to, "TRYAGAIN");
    let before = tried_again();
    let refresh = tokio::spawn({
        let lock = lock.clone();
        async move { lock.refresh(ms(60_000), &Options::default()).await }
    });
    let rival = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .obtain_multi(held, ms(30_000), &Options::default().retry(Retry::NoRetry))
                .await
        }
    });
    let other = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .obtain_multi(["{mig}:d", "{mig}:e"], ms(30_000), &Options::default())
                .await
        }
    });
    for i in 0..200 {
        if tried_again() >= before + 3 {
            break;
        }
        assert!(i < 199, "the calls were not all told to try again");
        tokio::time::sleep(ms(50)).await;
    }
    cluster.move_keys(from, to, &[held[1]]);
    cluster.end_migration(slot, to);

    refresh.await.unwrap().unwrap();
    let err = rival.await.unwrap().unwrap_err();
    assert!(err.is_not_obtained(), "{err:?}");
    other.await.unwrap().unwrap().release().await.unwrap();
    let left = lock.ttl().await.unwrap().unwrap();
    assert!(left > ms(30_000), "{left:?}");
    Arc::into_inner(lock).unwrap().release().await.unwrap();
    assert_eq!(total_keys(&cluster), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_on_a_cluster_loses_no_update() {
    let cluster = Cluster::start();
    let client = client(&cluster).await;
    let shared = Arc::new(Exclusion::default());
    let options = Options::default()
        .retry(Retry::linear(ms(2)).jitter(Jitter::Full))
        .timeout(Duration::from_secs(60));
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (client, options, shared) = (client.clone(), options.clone(), shared.clone());
            tokio::spawn(async move {
                for _ in 0..50 {
                    let lock = client
                        .obtain_multi(["{c}:a", "{c}:b"], ms(30_000), &options)
                        .await
                        .unwrap();
                    shared.critical_section().await;
                    lock.release().await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    shared.assert_exclusive(16 * 50);
}

/// Polling alone would wait 15 s between attempts.
fn slow_polling() -> Options {
    Options::default()
        .retry(Retry::linear(Duration::from_secs(15)))
        .timeout(Duration::from_secs(120))
}

/// How soon a waiter must have the lock after a release.
const WOKEN_WITHIN: Duration = Duration::from_millis(1_500);

/// Waits until the holder of `key` is marked by a waiter (its release will announce).
async fn marked(cluster: &Cluster, key: &str) {
    let owner = cluster.owner_of(cluster.keyslot(key));
    support::eventually(ms(10_000), "holder marked", async || {
        cluster.cli(owner, &["GET", key]).starts_with('!')
    })
    .await;
}

#[tokio::test]
async fn cluster_waiters_wake_on_release() {
    let cluster = Cluster::start();
    let waiting = Client::connect_cluster(cluster.urls()).await.unwrap();
    let holder = client(&cluster).await;
    for tag in ["a", "b", "c", "d"] {
        let key = format!("{{{tag}}}:job");
        let held = holder
            .obtain(&key, ms(60_000), &Options::default())
            .await
            .unwrap();
        let waiter = tokio::spawn({
            let (waiting, key) = (waiting.clone(), key.clone());
            async move { waiting.obtain(key, ms(60_000), &slow_polling()).await }
        });
        marked(&cluster, &key).await;
        held.release().await.unwrap();
        let released = tokio::time::Instant::now();
        let lock = tokio::time::timeout(Duration::from_secs(30), waiter)
            .await
            .expect("never woken")
            .unwrap()
            .unwrap();
        let took = released.elapsed();
        assert!(took < WOKEN_WITHIN, "{key}: woken after {took:?}");
        lock.release().await.unwrap();
    }
}

#[tokio::test]
async fn a_cluster_waiter_follows_its_slot_when_it_moves() {
    let cluster = Cluster::start();
    let waiting = Client::connect_cluster(cluster.urls()).await.unwrap();
    let holder = client(&cluster).await;
    let key = "{moving}:job";
    let held = holder
        .obtain(key, ms(60_000), &Options::default())
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let waiting = waiting.clone();
        async move { waiting.obtain(key, ms(60_000), &slow_polling()).await }
    });
    marked(&cluster, key).await;
    let slot = cluster.keyslot(key);
    let from = cluster.owner_of(slot);
    cluster.migrate_slot(slot, from, (from + 1) % 3);
    held.release().await.unwrap();
    let released = tokio::time::Instant::now();
    let lock = tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .expect("never woken")
        .unwrap()
        .unwrap();
    let took = released.elapsed();
    assert!(took < WOKEN_WITHIN, "woken after {took:?}");
    lock.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_shard_holds_up_neither_waiters_on_other_shards_nor_any_deadline() {
    let cluster = Cluster::start();
    let waiting = Client::connect_cluster(cluster.urls()).await.unwrap();
    let holder = client(&cluster).await;
    // Two keys on different masters.
    let stuck_key = "{a}:job";
    let stuck = cluster.owner_of(cluster.keyslot(stuck_key));
    let live_key = ["{b}:job", "{c}:job", "{d}:job", "{e}:job"]
        .into_iter()
        .find(|key| cluster.owner_of(cluster.keyslot(key)) != stuck)
        .expect("a key on another master");
    let held = holder
        .obtain(live_key, ms(60_000), &Options::default())
        .await
        .unwrap();
    let _also_held = holder
        .obtain(stuck_key, ms(60_000), &Options::default())
        .await
        .unwrap();

    // A waiter listens on the master that then stops answering.
    let bounded = slow_polling().timeout(ms(2_000));
    let stuck_waiter = tokio::spawn({
        let waiting = waiting.clone();
        async move {
            let start = tokio::time::Instant::now();
            let outcome = waiting.obtain(stuck_key, ms(60_000), &bounded).await;
            (outcome.map(drop), start.elapsed())
        }
    });
    marked(&cluster, stuck_key).await;
    cluster.nodes[stuck].pause();

    // Meanwhile another waiter of the same client listens on a healthy master, and its
    // holder releases.
    let live_waiter = tokio::spawn({
        let waiting = waiting.clone();
        async move { waiting.obtain(live_key, ms(60_000), &slow_polling()).await }
    });
    marked(&cluster, live_key).await;
    // A release on a healthy master is not held up either (a NOSCRIPT fallback that loads
    // the script on every master would wait for the stopped one).
    tokio::time::timeout(Duration::from_secs(10), held.release())
        .await
        .expect("a release on a healthy master hangs")
        .unwrap();
    let released = tokio::time::Instant::now();
    let lock = tokio::time::timeout(Duration::from_secs(30), live_waiter)
        .await
        .expect("never woken")
        .unwrap()
        .unwrap();
    let took = released.elapsed();
    assert!(took < WOKEN_WITHIN, "woken after {took:?}");

    // The waiter on the stuck master gave up by its deadline (and a little grace).
    let (outcome, waited) = tokio::time::timeout(Duration::from_secs(30), stuck_waiter)
        .await
        .expect("the stuck waiter hangs")
        .unwrap();
    assert!(outcome.is_err(), "obtained on a stopped master");
    assert!(waited < ms(2_000) + ms(1_000), "gave up after {waited:?}");
    cluster.nodes[stuck].resume();
    lock.release().await.unwrap();
}

/// A mixed lock on a cluster: its keys in one slot, readers share, and a waiting writer is
/// woken by the last reader's release (sharded pub/sub).
#[tokio::test]
async fn modes_on_a_cluster() {
    use lockset::Mode;
    let cluster = Cluster::start();
    let holder = client(&cluster).await;
    let waiting = Client::connect_cluster(cluster.urls()).await.unwrap();
    let err = holder
        .obtain_multi(
            [("{a}:x", Mode::Shared), ("{b}:y", Mode::Exclusive)],
            ms(1_000),
            &Options::default(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::InvalidInput(InvalidInput::CrossSlot { .. })),
        "{err:?}"
    );
    for tag in ["a", "b", "c", "d"] {
        let (doc, job) = (format!("{{{tag}}}:doc"), format!("{{{tag}}}:job"));
        let keys = [
            (doc.as_str(), Mode::Shared),
            (job.as_str(), Mode::Permit { limit: 2 }),
        ];
        let options = Options::default();
        let first = holder
            .obtain_multi(keys, ms(60_000), &options)
            .await
            .unwrap();
        let second = holder
            .obtain_multi(keys, ms(60_000), &options)
            .await
            .unwrap();
        let writer = tokio::spawn({
            let (waiting, doc) = (waiting.clone(), doc.clone());
            async move { waiting.obtain(doc, ms(60_000), &slow_polling()).await }
        });
        let owner = cluster.owner_of(cluster.keyslot(&doc));
        // A fair writer queues (a barging one would mark the key with "=x").
        let queue = lockset::queue_key_for(&doc).unwrap();
        support::eventually(ms(10_000), "the writer queued", async || {
            cluster.cli(owner, &["ZCARD", &queue]).trim() == "1"
        })
        .await;
        first.release().await.unwrap();
        second.release().await.unwrap();
        let released = tokio::time::Instant::now();
        let lock = tokio::time::timeout(Duration::from_secs(30), writer)
            .await
            .expect("never woken")
            .unwrap()
            .unwrap();
        let took = released.elapsed();
        assert!(took < WOKEN_WITHIN, "{doc}: woken after {took:?}");
        lock.release().await.unwrap();
    }
    assert_eq!(total_keys(&cluster), 0);
}

#[tokio::test]
async fn fair_waiters_on_a_cluster_get_the_lock_in_arrival_order() {
    let cluster = Cluster::start();
    let holder = client(&cluster).await;
    // Keys on different shards, with and without a hash tag: the queue and the hand-off
    // notice live in each key's slot.
    for key in ["{a}:job", "{b}:job", "job"] {
        let owner = cluster.owner_of(cluster.keyslot(key));
        let queue = lockset::queue_key_for(key).unwrap();
        let held = holder
            .obtain(key, ms(60_000), &Options::default())
            .await
            .unwrap();
        let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for i in 0..4 {
            let waiting = Client::connect_cluster(cluster.urls()).await.unwrap();
            let order = order.clone();
            waiters.push(tokio::spawn(async move {
                let lock = waiting.obtain(key, ms(60_000), &slow_polling()).await?;
                order.lock().unwrap().push(i);
                lock.release().await
            }));
            support::eventually(ms(10_000), "queued", async || {
                cluster.cli(owner, &["ZCARD", &queue]).trim() == (i + 1).to_string()
            })
            .await;
        }
        held.release().await.unwrap();
        for waiter in waiters {
            tokio::time::timeout(Duration::from_secs(10), waiter)
                .await
                .expect("handed on")
                .unwrap()
                .unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3], "{key}");
        assert_eq!(cluster.cli(owner, &["EXISTS", &queue]).trim(), "0");
    }
}

/// A slot in migration, one of its keys moved already, the lock key still on the source: a
/// fair waiter (the default) waits as on a stable slot and ends "not obtained" at its
/// deadline; the holder's release of the key a waiter queued for before the migration
/// reports success, and that waiter has the key soon after (handed, or woken and obtaining
/// it on the target by ASK), without a waiter's mark; its release succeeds too. Before, the
/// fair waiter failed at once with "Script attempted to access a non local key" (its queue
/// and record are not on the source) and left its mark, and the release failed after
/// deleting the key (its hand-off touched the key it had just deleted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_waiters_and_releases_work_while_their_slot_is_migrating() {
    handed_on_while_migrating("{fmig}:held", lockset::Mode::Exclusive).await;
}

/// The same with a reader's release (`modes_release.lua`) and a writer waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readers_release_hands_on_while_its_slot_is_migrating() {
    handed_on_while_migrating("{fmig}:doc", lockset::Mode::Shared).await;
}

async fn handed_on_while_migrating(key: &'static str, held_as: lockset::Mode) {
    let cluster = Cluster::start();
    let holder = Client::connect_cluster(cluster.urls()).await.unwrap();
    let waiting = Client::connect_cluster(cluster.urls()).await.unwrap();
    let other = "{fmig}:other";
    let slot = cluster.keyslot(key);
    let from = cluster.owner_of(slot);
    let to = (from + 1) % 3;
    let lock = holder
        .obtain((key, held_as), ms(60_000), &Options::default())
        .await
        .unwrap();
    // A waiter queued while the slot is stable.
    let early = tokio::spawn({
        let waiting = waiting.clone();
        async move { waiting.obtain(key, ms(30_000), &slow_polling()).await }
    });
    let queue = lockset::queue_key_for(key).unwrap();
    support::eventually(ms(10_000), "the early waiter queued", async || {
        cluster.cli(from, &["ZCARD", &queue]).trim() == "1"
    })
    .await;
    cluster.cli(from, &["SET", other, "x"]);
    cluster.begin_migration(slot, from, to);
    cluster.move_keys(from, to, &[other]);

    let started = tokio::time::Instant::now();
    let options = Options::default()
        .retry(Retry::linear(ms(50)))
        .timeout(ms(1_000));
    let err = waiting.obtain(key, ms(10_000), &options).await.unwrap_err();
    let took = started.elapsed();
    // As on a stable slot: not obtained at the deadline, or, on a machine so loaded that an
    // attempt is still on its way then, an unknown outcome; never the script's error.
    assert!(
        err.is_deadline_exceeded() || matches!(err, Error::UnknownOutcome(_)),
        "{err:?}"
    );
    assert!(took >= ms(1_000) && took < ms(3_000), "{took:?}");

    let released = tokio::time::Instant::now();
    lock.release().await.unwrap();
    let theirs = tokio::time::timeout(Duration::from_secs(10), early)
        .await
        .expect("never woken")
        .unwrap()
        .unwrap();
    let took = released.elapsed();
    assert!(
        took < WOKEN_WITHIN,
        "the early waiter had the key after {took:?}"
    );
    assert!(theirs.ttl().await.unwrap().unwrap() > ms(20_000));
    let value = importing_value(&cluster, to, key).expect("the key on the target");
    assert!(value.contains(theirs.token()), "{value}");
    assert!(!value.starts_with('!'), "a waiter's mark stayed: {value}");
    theirs.release().await.unwrap();
    // What the waiters left on the source (a record until its lease ends) goes along.
    let left = cluster.cli(
        from,
        &["CLUSTER", "GETKEYSINSLOT", &slot.to_string(), "100"],
    );
    let left: Vec<&str> = left.lines().filter(|k| !k.is_empty()).collect();
    if !left.is_empty() {
        cluster.move_keys(from, to, &left);
    }
    cluster.end_migration(slot, to);
    assert_eq!(cluster.cli(to, &["EXISTS", key]).trim(), "0");
}

/// `key`'s value on node `node`, which imports its slot (asked with ASKING).
fn importing_value(cluster: &Cluster, node: usize, key: &str) -> Option<String> {
    let client = lockset::redis::Client::open(cluster.nodes[node].url()).unwrap();
    let mut conn = client.get_connection().unwrap();
    let ((), value): ((), Option<String>) = lockset::redis::pipe()
        .cmd("ASKING")
        .cmd("GET")
        .arg(key)
        .query(&mut conn)
        .unwrap();
    value
}

/// A reader joins a key that readers hold while its slot migrates (the key still on the
/// source, no queue there): the obtain looks for queued writers it must let go first, which
/// it cannot read on the source, and takes the key as on a stable slot where nobody queues.
/// Before, it failed with "Script attempted to access a non local key" (`queue_blocks`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_join_while_their_slot_is_migrating() {
    use lockset::Mode;
    let cluster = Cluster::start();
    let client = Client::connect_cluster(cluster.urls()).await.unwrap();
    let (key, other) = ("{rmig}:doc", "{rmig}:other");
    let slot = cluster.keyslot(key);
    let from = cluster.owner_of(slot);
    let to = (from + 1) % 3;
    let first = client
        .obtain((key, Mode::Shared), ms(60_000), &Options::default())
        .await
        .unwrap();
    cluster.cli(from, &["SET", other, "x"]);
    cluster.begin_migration(slot, from, to);
    cluster.move_keys(from, to, &[other]);
    let options = Options::default().timeout(ms(2_000));
    let started = tokio::time::Instant::now();
    let second = client
        .obtain((key, Mode::Shared), ms(60_000), &options)
        .await
        .unwrap();
    assert!(started.elapsed() < ms(1_000), "{:?}", started.elapsed());
    second.release().await.unwrap();
    first.release().await.unwrap();
    cluster.end_migration(slot, to);
}

/// A barging writer waits for a reader (its mark stays in the key's set); the reader leaves
/// while the slot migrates: the writer, told of the release, takes the key over the set
/// that only its mark keeps alive, as on a stable slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_barging_writer_takes_over_a_readers_set_while_its_slot_is_migrating() {
    use lockset::Mode;
    let cluster = Cluster::start();
    let holder = Client::connect_cluster(cluster.urls()).await.unwrap();
    let waiting = Client::connect_cluster(cluster.urls()).await.unwrap();
    let (key, other) = ("{wmig}:doc", "{wmig}:other");
    let slot = cluster.keyslot(key);
    let from = cluster.owner_of(slot);
    let to = (from + 1) % 3;
    let reader = holder
        .obtain((key, Mode::Shared), ms(60_000), &Options::default())
        .await
        .unwrap();
    let writer = tokio::spawn({
        let waiting = waiting.clone();
        async move {
            let options = slow_polling().fair(false);
            waiting.obtain(key, ms(30_000), &options).await
        }
    });
    support::eventually(ms(10_000), "the writer marked the set", async || {
        cluster.cli(from, &["ZSCORE", key, "=x"]).trim() != ""
    })
    .await;
    cluster.cli(from, &["SET", other, "x"]);
    cluster.begin_migration(slot, from, to);
    cluster.move_keys(from, to, &[other]);
    let released = tokio::time::Instant::now();
    reader.release().await.unwrap();
    let lock = tokio::time::timeout(Duration::from_secs(10), writer)
        .await
        .expect("never woken")
        .unwrap()
        .unwrap();
    let took = released.elapsed();
    assert!(took < WOKEN_WITHIN, "the writer had the key after {took:?}");
    lock.release().await.unwrap();
}
