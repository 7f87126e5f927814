//! A user whose ACL allows only the keys under one prefix (`~pre:*`, and every channel), as
//! the guide's servers chapter documents: every name lockset derives from a lock key (waiter
//! queue, waiter records) begins with that key, so the one pattern covers them. The core
//! operations as that user: obtain (one key, several, shared), wait fairly and be handed the
//! lock, give up waiting, refresh, ask the TTL, release.

use crate::support;

use std::time::Duration;

use lockset::redis::aio::ConnectionManager;
use lockset::{Client, Lock, Mode, Options, Retry};
use support::{RedisServer, ms};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How soon a queued waiter must have the lock after the release: only the hand-off can
/// give it in time (it polls every 20 s).
const HANDED_WITHIN: Duration = Duration::from_millis(1_500);

/// Starts a server with the user `locker` limited to keys `pre:*`, and two clients logged
/// in as that user.
async fn restricted() -> (
    RedisServer,
    Client<ConnectionManager>,
    Client<ConnectionManager>,
) {
    let server = RedisServer::start();
    let url = locker(&server, "~pre:* &* +@all");
    let holder = Client::connect(&url).await.unwrap();
    let waiter = Client::connect(&url).await.unwrap();
    (server, holder, waiter)
}

/// Makes (or makes again) the user `locker`, password `pw`, with `rights` (ACL rules apart
/// from the login, separated by spaces), and returns its URL.
fn locker(server: &RedisServer, rights: &str) -> String {
    let mut user = vec!["ACL", "SETUSER", "locker", "reset", "on", ">pw"];
    user.extend(rights.split(' '));
    assert!(
        support::server::cli(server.port(), &user).contains("OK"),
        "{rights}"
    );
    format!("redis://locker:pw@127.0.0.1:{}/", server.port())
}

/// How many waiters are in `key`'s queue, read as the default user.
async fn queued(server: &RedisServer, key: &str) -> usize {
    let mut conn = support::connect(server).await;
    lockset::read_queue(&mut conn, key).await.unwrap().len()
}

/// Once a waiter is in `key`'s queue, releases `lock`: the waiter's obtain (`waiting`) has
/// the lock within [`HANDED_WITHIN`] of the release, and releases it.
async fn release_to_the_queued_waiter(
    server: &RedisServer,
    key: &str,
    lock: Lock<ConnectionManager>,
    waiting: JoinHandle<Result<Lock<ConnectionManager>, lockset::Error>>,
) {
    support::eventually(ms(10_000), "the waiter queues", async || {
        queued(server, key).await == 1
    })
    .await;
    let released = Instant::now();
    lock.release().await.unwrap();
    let theirs = waiting.await.unwrap().expect("handed the lock");
    let took = released.elapsed();
    assert!(took < HANDED_WITHIN, "{key}: had the keys after {took:?}");
    theirs.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_limited_to_a_key_prefix_waits_fairly_and_is_handed_the_lock() {
    let (server, holder, waiter) = restricted().await;
    let slow_polling = Options::default()
        .retry(Retry::linear(ms(20_000)))
        .timeout(ms(30_000));
    // A key without a hash tag, and two keys that share one.
    for keys in [vec!["pre:held"], vec!["pre:{t}:a", "pre:{t}:b"]] {
        let lock = holder
            .obtain_multi(keys.clone(), ms(30_000), &Options::default())
            .await
            .unwrap();
        lock.refresh(ms(30_000), &Options::default()).await.unwrap();
        assert!(lock.ttl().await.unwrap().unwrap() > ms(20_000));

        let waiting = tokio::spawn({
            let (waiter, keys, options) = (waiter.clone(), keys.clone(), slow_polling.clone());
            async move { waiter.obtain_multi(keys, ms(10_000), &options).await }
        });
        support::eventually(ms(10_000), "the waiter queues", async || {
            queued(&server, keys[0]).await == 1
        })
        .await;
        let released = Instant::now();
        lock.release().await.unwrap();
        let theirs = waiting.await.unwrap().expect("handed the lock");
        let took = released.elapsed();
        assert!(took < HANDED_WITHIN, "{keys:?}: handed after {took:?}");
        theirs
            .refresh(ms(10_000), &Options::default())
            .await
            .unwrap();
        theirs.release().await.unwrap();
        assert_eq!(queued(&server, keys[0]).await, 0);
    }
    assert_eq!(support::server::cli(server.port(), &["DBSIZE"]).trim(), "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_limited_to_a_key_prefix_gives_up_waiting_and_shares() {
    let (server, holder, waiter) = restricted().await;
    let lock = holder
        .obtain("pre:held", ms(30_000), &Options::default())
        .await
        .unwrap();
    // A fair waiter whose deadline passes: "not obtained", when due, and out of the queue.
    let options = Options::default()
        .retry(Retry::linear(ms(50)))
        .timeout(ms(500));
    let started = Instant::now();
    let err = waiter
        .obtain("pre:held", ms(10_000), &options)
        .await
        .unwrap_err();
    let took = started.elapsed();
    // On a loaded machine the deadline may pass while an attempt still waits for Redis: an
    // unknown outcome, cleaned up behind it like a deadline.
    assert!(
        err.is_deadline_exceeded() || matches!(err, lockset::Error::UnknownOutcome(_)),
        "{err:?}"
    );
    assert!(took >= ms(500) && took < ms(2_000), "{took:?}");
    support::eventually(ms(5_000), "the waiter leaves the queue", async || {
        queued(&server, "pre:held").await == 0
    })
    .await;
    lock.release().await.unwrap();

    // Readers share a key.
    let readers = [
        holder
            .obtain(("pre:read", Mode::Shared), ms(10_000), &Options::default())
            .await
            .unwrap(),
        waiter
            .obtain(("pre:read", Mode::Shared), ms(10_000), &Options::default())
            .await
            .unwrap(),
    ];
    for reader in readers {
        reader
            .refresh(ms(10_000), &Options::default())
            .await
            .unwrap();
        reader.release().await.unwrap();
    }
    assert_eq!(support::server::cli(server.port(), &["DBSIZE"]).trim(), "0");
}

/// A waiter of another user queues for a key of the restricted user's together with a key
/// outside its pattern: the restricted user's release cannot hand that key on (the server
/// refuses its script the key), but it has deleted its own: it reports success and
/// announces the release, and the waiter obtains both keys itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_succeeds_when_its_hand_off_needs_a_key_outside_the_users_pattern() {
    let (server, holder, _) = restricted().await;
    let admin = Client::connect(&server.url()).await.unwrap();
    let lock = holder
        .obtain("pre:{t}:a", ms(30_000), &Options::default())
        .await
        .unwrap();
    let waiting = tokio::spawn({
        let admin = admin.clone();
        let options = Options::default()
            .retry(Retry::linear(ms(20_000)))
            .timeout(ms(30_000));
        async move {
            admin
                .obtain_multi(["pre:{t}:a", "other:{t}:b"], ms(10_000), &options)
                .await
        }
    });
    release_to_the_queued_waiter(&server, "pre:{t}:a", lock, waiting).await;
    assert_eq!(support::server::cli(server.port(), &["DBSIZE"]).trim(), "0");
}

/// A user whose channel rights name channels one by one (`resetchannels &pre:a &pre:b`), not
/// by prefix: the server refuses the clients' own hand-off channels. Their fair waiters hear
/// their hand-offs on the key's channel instead, and the refusal pauses no other
/// subscription: a hand-off of `pre:a`, then one of `pre:b` (its channel subscribed after
/// the refusal), each reaches its waiter at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_with_channels_named_one_by_one_is_still_handed_the_lock() {
    let server = RedisServer::start();
    let url = locker(&server, "~pre:* resetchannels &pre:a &pre:b +@all");
    let holder = Client::connect(&url).await.unwrap();
    let waiter = Client::connect(&url).await.unwrap();
    let slow_polling = Options::default()
        .retry(Retry::linear(ms(20_000)))
        .timeout(ms(30_000));
    for key in ["pre:a", "pre:b"] {
        let lock = holder
            .obtain(key, ms(30_000), &Options::default())
            .await
            .unwrap();
        let waiting = tokio::spawn({
            let (waiter, options) = (waiter.clone(), slow_polling.clone());
            async move { waiter.obtain(key, ms(10_000), &options).await }
        });
        release_to_the_queued_waiter(&server, key, lock, waiting).await;
    }
    assert_eq!(support::server::cli(server.port(), &["DBSIZE"]).trim(), "0");
}

/// A release runs as its holder's user, and Redis checks a script's `PUBLISH` against that
/// user's channel rights, not the waiter's. A holder whose rights name channels one by one
/// (`&pre:a`) is refused the waiter's own hand-off channel, which the waiter (another user,
/// `&*`) named: the release then tells it on the key's channel, where it listens too. (Once
/// the refusal was swallowed, and the waiter learnt of its lock only at its next renewal.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_refused_the_waiters_hand_off_channel_tells_it_on_the_keys() {
    let server = RedisServer::start();
    let url = locker(&server, "~pre:* resetchannels &pre:a +@all");
    let holder = Client::connect(&url).await.unwrap();
    let waiter = Client::connect(&server.url()).await.unwrap();
    let lock = holder
        .obtain("pre:a", ms(30_000), &Options::default())
        .await
        .unwrap();
    let waiting = tokio::spawn(async move {
        let options = Options::default()
            .retry(Retry::linear(ms(20_000)))
            .timeout(ms(30_000));
        waiter.obtain("pre:a", ms(10_000), &options).await
    });
    release_to_the_queued_waiter(&server, "pre:a", lock, waiting).await;
    assert_eq!(support::server::cli(server.port(), &["DBSIZE"]).trim(), "0");
}

/// A holder whose user may publish on no channel (`resetchannels`: Redis 7's default for a
/// new user) releases to a queued waiter of another user: the release hands the key on, and
/// its notice is refused. The waiter, asleep until its lease renewal (5 s) and past its
/// deadline (3 s), learns of its lock by one last attempt at the deadline: it has the lock
/// within the deadline plus the grace an attempt has past it, where it used to give up
/// with `DeadlineExceeded` on a lock handed to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_hand_off_notice_was_refused_takes_its_lock_at_its_deadline() {
    let server = RedisServer::start();
    let url = locker(&server, "~pre:* resetchannels +@all");
    let holder = Client::connect(&url).await.unwrap();
    let waiter = Client::connect(&server.url()).await.unwrap();
    let lock = holder
        .obtain("pre:a", ms(20_000), &Options::default())
        .await
        .unwrap();
    let deadline = ms(3_000);
    let started = Instant::now();
    let waiting = tokio::spawn(async move {
        let options = Options::default()
            .retry(Retry::linear(ms(100)))
            .timeout(deadline);
        waiter.obtain("pre:a", ms(10_000), &options).await
    });
    support::eventually(ms(2_500), "the waiter queues", async || {
        queued(&server, "pre:a").await == 1
    })
    .await;
    lock.release().await.unwrap();
    let theirs = waiting.await.unwrap().expect("the lock handed to it");
    let took = started.elapsed();
    assert!(
        took >= deadline - ms(50) && took < deadline + ms(500),
        "had the lock after {took:?}"
    );
    assert!(
        theirs.ttl().await.unwrap().is_some(),
        "the keys are its own"
    );
    theirs.release().await.unwrap();
    assert_eq!(support::server::cli(server.port(), &["DBSIZE"]).trim(), "0");
}

/// How soon an obtain refused for want of scripts must fail: it asks once and gives up,
/// without waiting for its deadline.
const REFUSED_WITHIN: Duration = Duration::from_millis(1_000);

/// A user without `EVAL`/`EVALSHA` (or a server that renamed them away) could take a single
/// key by plain `SET NX` and never release it. Every obtain, one key or several, fails with
/// [`lockset::Error::ScriptsRefused`] before anything is written; a lock whose user lost the
/// scripts after obtaining is told the same on its next script. No token in any error text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_scripts_locks_nothing_and_is_told_why() {
    let server = RedisServer::start();
    let url = locker(&server, "~* &* +@all -eval -evalsha");
    let client = Client::connect(&url).await.unwrap();
    refuses_every_obtain(&server, &client).await;

    // Scripts taken away from a user who already holds a lock: told at the next script.
    let allowed = ["ACL", "SETUSER", "locker", "+eval", "+evalsha"];
    assert!(support::server::cli(server.port(), &allowed).contains("OK"));
    let client = Client::connect(&url).await.unwrap();
    let lock = client
        .obtain("job", ms(30_000), &Options::default())
        .await
        .unwrap();
    let denied = ["ACL", "SETUSER", "locker", "-eval", "-evalsha"];
    assert!(support::server::cli(server.port(), &denied).contains("OK"));
    let err = lock.ttl().await.unwrap_err();
    assert!(err.is_scripts_refused(), "{err:?}");
    assert!(!err.to_string().contains(lock.token()), "{err}");
    // The same client's next obtain asks again, and writes nothing (it had found scripts
    // allowed before: a single key would otherwise go by plain SET NX).
    let err = client
        .obtain("second", ms(30_000), &Options::default())
        .await
        .unwrap_err();
    assert!(err.is_scripts_refused(), "{err:?}");
    assert_eq!(
        support::server::cli(server.port(), &["EXISTS", "second"]).trim(),
        "0"
    );
    // And once the operator grants them again, the same client locks at once.
    assert!(support::server::cli(server.port(), &allowed).contains("OK"));
    client
        .obtain("second", ms(30_000), &Options::default())
        .await
        .expect("scripts granted again: the refusal is not kept");
}

/// A Redlock quorum of three masters, two of which refuse the scripts: the obtain stops at
/// once with an error that says so (not "unavailable", not retried until the deadline), and
/// writes nothing on the master that would have run them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_whose_majority_refuses_scripts_says_so_at_once() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let mut nodes = Vec::new();
    for (i, server) in servers.iter().enumerate() {
        let url = if i < 2 {
            locker(server, "~* &* +@all -eval -evalsha")
        } else {
            server.url()
        };
        nodes.push(Client::connect(&url).await.unwrap());
    }
    let quorum = Client::quorum(nodes, lockset::QuorumConfig::default()).unwrap();
    let options = Options::default().timeout(ms(3_000));
    let start = Instant::now();
    let err = quorum
        .obtain("job", ms(30_000), &options)
        .await
        .unwrap_err();
    let took = start.elapsed();
    assert!(err.is_scripts_refused(), "{err:?}");
    assert!(!err.is_unavailable() && !err.is_not_obtained(), "{err:?}");
    assert!(took < REFUSED_WITHIN, "refused after {took:?}");
    tokio::time::timeout(ms(5_000), quorum.background_idle())
        .await
        .expect("background work ends");
    for server in &servers {
        assert_eq!(support::server::cli(server.port(), &["DBSIZE"]).trim(), "0");
    }
}

/// The same with `EVALSHA` renamed away in the server's configuration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_scripts_renamed_away_locks_nothing() {
    let server = RedisServer::start_with(None, &["--rename-command", "EVALSHA", "EVALSHA-x"]);
    let client = Client::connect(&server.url()).await.unwrap();
    refuses_every_obtain(&server, &client).await;
}

/// Obtains of one key and of several each fail with `ScriptsRefused`, in time, and leave
/// no key behind.
async fn refuses_every_obtain(server: &RedisServer, client: &Client<ConnectionManager>) {
    for keys in [vec!["job"], vec!["a", "b"]] {
        let start = Instant::now();
        let err = client
            .obtain_multi(keys.clone(), ms(30_000), &Options::default())
            .await
            .unwrap_err();
        let took = start.elapsed();
        assert!(err.is_scripts_refused(), "{keys:?}: {err:?}");
        assert!(!err.is_unavailable() && !err.is_not_obtained(), "{err:?}");
        assert!(took < REFUSED_WITHIN, "{keys:?}: refused after {took:?}");
        assert_eq!(support::server::cli(server.port(), &["DBSIZE"]).trim(), "0");
    }
}

/// A user the server refuses a command one of lockset's scripts runs: the obtain ends with
/// an ACL refusal, and no key it wrote is left without an expiry. Redis keeps what a script
/// wrote before a refused command ended it: an obtain that set its keys first and gave
/// them their TTL after left them held for ever (a user without `@keyspace`, whose `PEXPIRE`
/// was refused).
#[tokio::test]
async fn a_command_refused_inside_a_script_leaves_no_key_without_an_expiry() {
    let server = RedisServer::start();
    let keys = ["pre:a", "pre:b"];
    let no_expiry = async |server: &RedisServer| {
        let mut conn = support::connect(server).await;
        let mut found = Vec::new();
        for key in keys {
            let left: i64 = lockset::redis::cmd("PTTL")
                .arg(key)
                .query_async(&mut conn)
                .await
                .unwrap();
            if left == -1 {
                found.push(key);
            }
        }
        found
    };
    // Only the string, scripting, sorted-set and hash commands: no PEXPIRE, DEL, EXISTS.
    let url = locker(
        &server,
        "~pre:* &* +@scripting +@string +@sortedset +@hash +@connection",
    );
    let client = Client::connect(&url).await.unwrap();
    let err = client
        .obtain_multi(keys, ms(10_000), &Options::default())
        .await
        .unwrap_err();
    assert!(err.is_refused_by_acl(), "{err:?}");
    assert!(no_expiry(&server).await.is_empty(), "keys left for ever");

    // Every command but PEXPIRE: the lock is taken, and its keys expire.
    let url = locker(&server, "~pre:* &* +@all -pexpire");
    let client = Client::connect(&url).await.unwrap();
    let lock = client
        .obtain_multi(keys, ms(10_000), &Options::default())
        .await
        .unwrap();
    assert!(no_expiry(&server).await.is_empty(), "keys left for ever");
    lock.release().await.unwrap();
}

/// A fencing obtain whose user the server refuses `TIME` or `GET` (or a server that renamed
/// `TIME` away): the counter's minting fails after the lock's keys were written. The obtain
/// ends with the refusal and none of its keys stays held: they used to, for the whole TTL,
/// with nobody believing it held them and nothing sent to release them.
#[tokio::test]
async fn a_fencing_obtain_refused_inside_its_script_leaves_no_key_held() {
    let server = RedisServer::start();
    for refused in ["-time", "-get"] {
        let url = locker(&server, &format!("~* &* +@all {refused}"));
        let client = Client::connect(&url).await.unwrap();
        for keys in [vec!["pre:a"], vec!["pre:{t}:a", "pre:{t}:b"]] {
            let options = Options::default().fencing();
            let err = client
                .obtain_multi(keys.clone(), ms(60_000), &options)
                .await
                .unwrap_err();
            assert!(err.is_refused_by_acl(), "{refused} {keys:?}: {err:?}");
            for key in &keys {
                let held = support::server::cli(server.port(), &["EXISTS", key]);
                assert_eq!(held.trim(), "0", "{refused}: {key} left held");
            }
        }
    }
}

/// A shared or counted key is a sorted set, which no command makes with an expiry: the
/// script adds the holder, then gives the set its TTL. A user refused `PEXPIRE` got the
/// refusal with the new set left without expiry (until lockset next read it); the set it
/// made goes now, for shared and counted keys, alone or beside an exclusive key.
#[tokio::test]
async fn a_shared_key_refused_its_expiry_is_not_left_without_one() {
    let server = RedisServer::start();
    let url = locker(&server, "~* &* +@all -pexpire");
    let client = Client::connect(&url).await.unwrap();
    let locks: [Vec<(&str, Mode)>; 3] = [
        vec![("pre:s", Mode::Shared)],
        vec![("pre:p", Mode::Permit { limit: 2 })],
        vec![("pre:{t}:x", Mode::Exclusive), ("pre:{t}:s", Mode::Shared)],
    ];
    for keys in locks {
        let err = client
            .obtain_multi(keys.clone(), ms(60_000), &Options::default())
            .await
            .unwrap_err();
        assert!(err.is_refused_by_acl(), "{keys:?}: {err:?}");
        for (key, _) in &keys {
            let left = support::server::cli(server.port(), &["PTTL", key]);
            assert_ne!(left.trim(), "-1", "{key} left without an expiry");
        }
    }
}
