//! The server's own compare-and-delete (`DELIFEQ`, `DELEX … IFEQ`) and compare-and-set
//! (`SET … IFEQ`): taken where the server has them, for a single key with nothing else to
//! do, and scripts everywhere else. Each test runs on whatever server the suite runs on
//! (`LOCKSET_REDIS_SERVER`), asks it independently what it has, and counts with `INFO
//! commandstats` which path ran: on servers with the commands and on servers without.

use crate::support;

use lockset::redis::aio::ConnectionManager;
use lockset::{Client, Error, Options, QuorumConfig, Replication, Retry};
use support::server::{Natives, natives};
use support::{Env, RedisServer, ms};
use tokio::time::Instant;

/// The commands a lock operation may run, counted on one server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Counts {
    /// The compare-and-delete the server has (0 where it has none).
    delete: u64,
    set: u64,
    /// Scripts: EVALSHA and EVAL.
    scripts: u64,
}

impl Counts {
    async fn of(env: &Env, natives: Natives) -> Self {
        Self {
            delete: match natives.delete {
                Some(command) => env.calls(command).await,
                None => 0,
            },
            set: env.calls("set").await,
            scripts: env.calls("evalsha").await + env.calls("eval").await,
        }
    }

    fn since(self, before: Self) -> Self {
        Self {
            delete: self.delete - before.delete,
            set: self.set - before.set,
            scripts: self.scripts - before.scripts,
        }
    }
}

/// Says which kind of server this run is on (visible in every run).
fn announce(test: &str, natives: Natives) {
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr(),
        "{test}: compare-and-delete {:?}, SET IFEQ {}",
        natives.delete,
        natives.set_ifeq
    );
}

#[tokio::test]
async fn a_single_key_is_refreshed_and_released_natively_where_the_server_can() {
    let env = Env::start().await;
    let natives = natives(env.server.port());
    announce("single key", natives);
    env.load_scripts().await;
    let lock = env
        .client
        .obtain("job", ms(2_000), &Options::default().metadata("m"))
        .await
        .unwrap();
    // (The obtain is one SET NX PX GET, or a script before Redis 7, on every server.)
    let before = Counts::of(&env, natives).await;
    lock.refresh(ms(60_000), &Options::default()).await.unwrap();
    let left: i64 = env.cmd(&["PTTL", "job"]).await;
    assert!(left > 30_000, "refreshed to 60 s, {left} ms left");
    assert_eq!(
        env.get("job").await.unwrap(),
        format!("22:{}m", lock.token())
    );
    lock.release().await.unwrap();
    assert!(!env.exists("job").await);

    let ran = Counts::of(&env, natives).await.since(before);
    let expected = Counts {
        delete: u64::from(natives.delete.is_some()),
        set: u64::from(natives.set_ifeq),
        scripts: u64::from(natives.delete.is_none()) + u64::from(!natives.set_ifeq),
    };
    assert_eq!(ran, expected, "{natives:?}");
}

/// A key a waiter marked must be announced on release: the native delete finds it is not
/// exactly the lock's value and changes nothing, and the script then releases and wakes
/// the waiter at once.
#[tokio::test]
async fn a_key_a_waiter_marked_is_released_by_script_which_wakes_the_waiter() {
    let env = Env::start().await;
    let natives = natives(env.server.port());
    env.load_scripts().await;
    let lock = env
        .client
        .obtain("marked", ms(30_000), &Options::default())
        .await
        .unwrap();
    let waiter = env.other_client().await;
    // It polls only every 20 s: only the announcement can wake it in time.
    let waiting = tokio::spawn(async move {
        let options = Options::default()
            .retry(Retry::linear(ms(20_000)))
            .timeout(ms(30_000));
        waiter.obtain("marked", ms(5_000), &options).await
    });
    support::eventually(ms(10_000), "the waiter marks the holder", async || {
        env.get("marked")
            .await
            .is_some_and(|value| value.starts_with('!'))
    })
    .await;
    // The waiter listens by now (it subscribes before it marks).
    let before = Counts::of(&env, natives).await;
    lock.refresh(ms(30_000), &Options::default()).await.unwrap();
    assert!(
        env.get("marked").await.unwrap().starts_with('!'),
        "a refresh keeps the mark"
    );
    let released = Instant::now();
    lock.release().await.unwrap();
    let theirs = waiting.await.unwrap().expect("woken by the release");
    assert!(released.elapsed() < ms(5_000), "{:?}", released.elapsed());

    let ran = Counts::of(&env, natives).await.since(before);
    // Each native command tried and found the mark; the scripts did the work.
    assert_eq!(ran.scripts, 2, "{ran:?}");
    assert_eq!(ran.delete, u64::from(natives.delete.is_some()), "{ran:?}");
    theirs.release().await.unwrap();
}

#[tokio::test]
async fn a_refresh_with_new_metadata_and_multi_key_locks_keep_their_scripts() {
    let env = Env::start().await;
    let natives = natives(env.server.port());
    env.load_scripts().await;
    let lock = env
        .client
        .obtain("meta", ms(10_000), &Options::default().metadata("old"))
        .await
        .unwrap();
    let before = Counts::of(&env, natives).await;
    lock.refresh(ms(10_000), &Options::default().metadata("new"))
        .await
        .unwrap();
    assert_eq!(
        env.get("meta").await.unwrap(),
        format!("22:{}new", lock.token())
    );
    let multi = env
        .client
        .obtain_multi(["{m}:a", "{m}:b"], ms(10_000), &Options::default())
        .await
        .unwrap();
    multi
        .refresh(ms(10_000), &Options::default())
        .await
        .unwrap();
    multi.release().await.unwrap();

    let ran = Counts::of(&env, natives).await.since(before);
    // The rewrite, and the multi-key obtain, refresh and release: scripts only.
    assert_eq!(ran.scripts, 4, "{ran:?}");
    assert_eq!(ran.delete, 0, "{ran:?}");
    // The rewrite's, and the multi-key obtain's one per key (each with its TTL), inside
    // their scripts (commandstats counts a script's commands too).
    assert_eq!(ran.set, 3, "{ran:?}");
    // The handle keeps the metadata it was obtained with: its value is no longer exactly
    // the stored one, so the native delete leaves it to the script, which releases by token.
    lock.release().await.unwrap();
    assert!(!env.exists("meta").await);
}

/// A lock that expired and was taken by another owner is not ours: neither path deletes it.
#[tokio::test]
async fn a_lock_taken_over_is_neither_refreshed_nor_released() {
    let env = Env::start().await;
    let lock = env
        .client
        .obtain("taken", ms(30), &Options::default())
        .await
        .unwrap();
    tokio::time::sleep(ms(60)).await;
    let theirs = env
        .other_client()
        .await
        .obtain("taken", ms(10_000), &Options::default())
        .await
        .unwrap();
    let err = lock
        .refresh(ms(10_000), &Options::default())
        .await
        .unwrap_err();
    assert!(err.is_not_held() && !err.is_not_obtained(), "{err:?}");
    let err = lock.release().await.unwrap_err();
    assert!(err.is_not_held(), "{err:?}");
    assert_eq!(
        env.get("taken").await.unwrap(),
        format!("22:{}", theirs.token())
    );
    // A key that holds no string at all.
    env.cmd::<i64>(&["HSET", "hash", "f", "v"]).await;
    let lock = env
        .client
        .obtain("gone", ms(30), &Options::default())
        .await
        .unwrap();
    tokio::time::sleep(ms(60)).await;
    env.cmd::<String>(&["RENAME", "hash", "gone"]).await;
    assert!(lock.release().await.unwrap_err().is_not_held());
}

/// An ACL user who may run scripts but not the native delete: the first release is refused
/// (NOPERM) and goes by script; every later one goes by script at once.
#[tokio::test]
async fn a_user_who_may_not_run_the_native_delete_releases_by_script() {
    let env = Env::start().await;
    let natives = natives(env.server.port());
    let Some(delete) = natives.delete else {
        support::skipping(
            "a_user_who_may_not_run_the_native_delete_releases_by_script",
            "the server has no native compare-and-delete",
        );
        return;
    };
    env.cmd::<String>(&[
        "ACL",
        "SETUSER",
        "app",
        "on",
        ">pw",
        "~*",
        "&*",
        "+@all",
        &format!("-{delete}"),
    ])
    .await;
    let url = format!("redis://app:pw@127.0.0.1:{}/", env.server.port());
    let client = Client::connect(&url).await.unwrap();
    for key in ["a", "b", "c"] {
        let lock = client
            .obtain(key, ms(10_000), &Options::default())
            .await
            .unwrap();
        lock.release().await.unwrap();
        assert!(!env.exists(key).await, "{key}");
    }
    let errors: String = env.cmd(&["INFO", "errorstats"]).await;
    assert!(
        errors.contains("errorstat_NOPERM:count=1\r\n"),
        "refused once, then never tried: {errors}"
    );
}

/// Replicated writes: the native refresh is followed by the wait for replicas in the same
/// request, as the script was: with the replica paused, the refresh is not acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_refresh_still_waits_for_the_replicas() {
    // In sync includes its primary listing it online.
    let (primary, replica) = support::primary_with_replica().await;
    let natives = natives(primary.port());
    // WAIT long enough for a loaded machine's replica (100 and 300 ms failed the writes
    // before the pause now and then), and replies awaited longer than that.
    let client = support::client_with_timeout(&primary.url(), ms(5_000))
        .await
        .replicated(Replication::replicas(1).timeout(ms(2_000)))
        .await
        .unwrap();
    let stats = || support::server::cli(primary.port(), &["INFO", "commandstats"]);
    let calls = |command: &str| -> u64 {
        let prefix = format!("cmdstat_{command}:calls=");
        stats()
            .lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse().unwrap())
    };
    // The scripts loaded, so that each write below is one command.
    let warm_up = client
        .obtain("w", ms(10_000), &Options::default())
        .await
        .unwrap();
    warm_up
        .refresh(ms(10_000), &Options::default())
        .await
        .unwrap();
    warm_up.release().await.unwrap();

    let waits = calls("wait");
    let lock = client
        .obtain("r", ms(10_000), &Options::default())
        .await
        .unwrap();
    let sets = calls("set");
    lock.refresh(ms(10_000), &Options::default()).await.unwrap();
    assert_eq!(
        calls("wait") - waits,
        2,
        "one WAIT behind the obtain, one behind the refresh"
    );

    replica.pause();
    let err = lock
        .refresh(ms(10_000), &Options::default())
        .await
        .unwrap_err();
    replica.resume();
    assert!(
        matches!(
            err,
            Error::NotReplicated {
                acknowledged: 0,
                required: 1
            }
        ),
        "{err:?}"
    );
    // Each refresh is a SET where the server has SET IFEQ.
    let refreshes = if natives.set_ifeq { 2 } else { 0 };
    assert_eq!(calls("set") - sets, refreshes, "{natives:?}");
    lock.release().await.unwrap();
}

/// A Redlock quorum: each master's share of a single-key lock is refreshed natively where
/// that master can, and released by script on every master (one command per master keeps a
/// waiter of the same client behind each delete; see `Store::release_by_script`).
#[tokio::test]
async fn a_quorum_refreshes_natively_and_releases_by_script() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let natives = natives(servers[0].port());
    let mut nodes: Vec<Client<ConnectionManager>> = Vec::new();
    for server in &servers {
        nodes.push(Client::connect(&server.url()).await.unwrap());
    }
    let redlock = Client::quorum(nodes, QuorumConfig::default()).unwrap();
    for _ in 0..2 {
        let lock = redlock
            .obtain("q", ms(10_000), &Options::default())
            .await
            .unwrap();
        lock.refresh(ms(10_000), &Options::default()).await.unwrap();
        lock.release().await.unwrap();
        redlock.background_idle().await;
    }
    for server in &servers {
        let stats = support::server::cli(server.port(), &["INFO", "commandstats"]);
        if let Some(delete) = natives.delete {
            assert!(!stats.contains(&format!("cmdstat_{delete}:")), "{stats}");
        }
        if natives.set_ifeq {
            // Two obtains and two refreshes.
            assert!(stats.contains("cmdstat_set:calls=4,"), "{stats}");
        }
        assert_eq!(support::server::cli(server.port(), &["DBSIZE"]).trim(), "0");
    }
}

/// A cluster: the native commands go to the node that serves the key, as the scripts do.
#[cfg(feature = "cluster")]
#[tokio::test]
async fn a_cluster_goes_natively_on_the_keys_node() {
    let cluster = support::cluster::Cluster::start();
    let natives = natives(cluster.nodes[0].port());
    let client = Client::connect_cluster(cluster.urls()).await.unwrap();
    let calls = |command: &str| -> u64 {
        (0..3)
            .map(|i| {
                let stats = cluster.cli(i, &["INFO", "commandstats"]);
                let prefix = format!("cmdstat_{command}:calls=");
                stats
                    .lines()
                    .find_map(|line| line.strip_prefix(&prefix))
                    .and_then(|rest| rest.split(',').next())
                    .map_or(0, |n| n.parse().unwrap())
            })
            .sum()
    };
    let scripts = || calls("evalsha") + calls("eval");
    let keys = ["{a}", "{b}", "{c}", "{d}"];
    let mut locks = Vec::new();
    for key in keys {
        let lock = client.obtain(key, ms(10_000), &Options::default()).await;
        locks.push(lock.unwrap());
    }
    let sets = calls("set");
    // Obtains may run scripts (before Redis 7, SET has no NX with GET; the first obtain
    // asks whether the cluster runs this client's scripts); refreshes and releases must
    // need none where the server has the native commands.
    let asked = scripts();
    for lock in locks {
        lock.refresh(ms(10_000), &Options::default()).await.unwrap();
        lock.release().await.unwrap();
    }
    for key in keys {
        let owner = cluster.owner_of(cluster.keyslot(key));
        assert_eq!(cluster.cli(owner, &["EXISTS", key]).trim(), "0");
    }
    if let Some(delete) = natives.delete {
        assert_eq!(calls(delete), 4);
    }
    let refreshes = if natives.set_ifeq { 4 } else { 0 };
    assert_eq!(calls("set") - sets, refreshes, "{natives:?}");
    if natives.delete.is_some() && natives.set_ifeq {
        assert_eq!(scripts() - asked, 0);
    }
}

/// A release by the waiter's own client wakes that waiter as soon as the release is queued,
/// and skips the release's announcement: so the release must be one command, with the
/// waiter's next attempt behind it. A native delete that finds the waiter's mark deletes
/// nothing and leaves the script to follow (as does asking the server what it has, before
/// a first release): the woken waiter's attempt went between them, found the lock held, and
/// slept until its next poll (15 s), fenced and multi-key waiters every time on Valkey 9.1,
/// on Redis 7.0 at a client's first release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_of_the_releasing_client_is_woken_at_once() {
    let env = Env::start().await;
    let polling = Options::default()
        .fair(false)
        .retry(Retry::linear(ms(15_000)))
        .timeout(ms(60_000));
    let cases: [(&str, Options, &[&str]); 3] = [
        ("multi-key", polling.clone(), &["job", "other"]),
        ("fenced", polling.clone().fencing(), &["job"]),
        ("plain", polling, &["job"]),
    ];
    for (what, options, keys) in cases {
        let client = support::client_with_events_via(&env.server, &env.server.url()).await;
        let held = client
            .obtain("job", ms(60_000), &Options::default())
            .await
            .unwrap();
        let waiting = tokio::spawn({
            let (client, keys) = (client.clone(), keys.to_vec());
            async move { client.obtain_multi(keys, ms(10_000), &options).await }
        });
        support::eventually(ms(10_000), "the waiter listens", async || {
            client.release_channels_watched() > 0
        })
        .await;
        let released = Instant::now();
        held.release().await.unwrap();
        let lock = tokio::time::timeout(ms(30_000), waiting)
            .await
            .expect("obtained in 30 s")
            .unwrap()
            .unwrap();
        let took = released.elapsed();
        assert!(took < ms(1_500), "{what} waiter woken only after {took:?}");
        lock.release().await.unwrap();
    }
}
