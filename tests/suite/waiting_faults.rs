//! Waiting under faults and corner cases, found by trying to break the release events: every
//! waiter polls every 15 s (or slower), so only a release event can wake it fast.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use lockset::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use lockset::{Client, Options, QuorumConfig, Retry};
use support::masters::Masters;
use support::proxy::Proxy;
use support::{Env, RedisServer, client_with_events_via, client_with_timeout, eventually, ms};
use tokio::time::{Instant, timeout};

fn slow_polling() -> Options {
    Options::default()
        .retry(Retry::linear(Duration::from_secs(15)))
        .timeout(Duration::from_secs(120))
}

const WOKEN_WITHIN: Duration = Duration::from_millis(1_500);

type Waiter = tokio::task::JoinHandle<Result<lockset::Lock<ConnectionManager>, lockset::Error>>;

async fn woken(waiter: Waiter, what: &str) -> lockset::Lock<ConnectionManager> {
    let released = Instant::now();
    let lock = timeout(Duration::from_secs(90), waiter)
        .await
        .unwrap_or_else(|_| panic!("{what}: never woken"))
        .unwrap()
        .unwrap();
    let took = released.elapsed();
    assert!(took < WOKEN_WITHIN, "{what}: woken only after {took:?}");
    lock
}

async fn marked(env: &Env, key: &str) -> bool {
    env.get(key).await.is_some_and(|v| v.starts_with('!'))
}

// ---------------------------------------------------------------------------------------
// 1. notify_one hands the only wake-up to a waiter that then does not take the key.
// ---------------------------------------------------------------------------------------
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_woken_waiter_that_leaves_for_another_key_passes_its_wake_up_on() {
    let env = Env::start().await;
    let other = env.other_client().await;
    let held_a = other
        .obtain("{x}:a", ms(60_000), &Options::default())
        .await
        .unwrap();
    let _held_j = other
        .obtain("{x}:j", ms(60_000), &Options::default())
        .await
        .unwrap();
    // W1 (first in the Notify's queue) wants {x}:a and {x}:j; it blocks on {x}:a.
    let w1 = tokio::spawn({
        let c = env.client.clone();
        async move {
            c.obtain_multi(["{x}:a", "{x}:j"], ms(60_000), &slow_polling())
                .await
        }
    });
    eventually(ms(10_000), "w1 listening", async || {
        env.client.release_channels_watched() == 1 && marked(&env, "{x}:a").await
    })
    .await;
    tokio::time::sleep(ms(300)).await;
    // W2, same client, wants only {x}:a.
    let w2: Waiter = tokio::spawn({
        let c = env.client.clone();
        async move { c.obtain("{x}:a", ms(60_000), &slow_polling()).await }
    });
    tokio::time::sleep(ms(1_000)).await;
    held_a.release().await.unwrap();
    // {x}:a is free and W2 listens on its channel: W2 must get it at once.
    woken(w2, "single-key waiter after its key was released").await;
    w1.abort();
}

// ---------------------------------------------------------------------------------------
// 2. Redlock: one release is announced by every master, each master's Events wakes one
//    waiter of the same client: a herd of up to N per release.
// ---------------------------------------------------------------------------------------
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_redlock_release_wakes_one_waiter_of_a_client_not_one_per_master() {
    const WAITERS: usize = 5;
    let m = Masters::start(QuorumConfig::default().node_timeout(ms(300))).await;
    let mut holders = Vec::new();
    for s in &m.servers {
        holders.push(Client::connect(&s.url()).await.unwrap());
    }
    let holder = Client::quorum(holders, QuorumConfig::default().node_timeout(ms(300))).unwrap();
    m.load_scripts().await;
    let held = holder
        .obtain("job", ms(60_000), &Options::default())
        .await
        .unwrap();
    tokio::time::timeout(ms(10_000), holder.background_idle())
        .await
        .expect("held on every master");
    // Every attempt that fails is followed by a retry event: a woken waiter that finds the
    // lock taken makes one. (Counting SETs on a master would also count one waiter's second
    // try there, when that master had not yet run the release it was told of by another.)
    // The winner may retry too, when it came before the release reached a majority.
    let retries: Arc<Vec<AtomicUsize>> =
        Arc::new((0..WAITERS).map(|_| AtomicUsize::new(0)).collect());
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let start = Instant::now();
    let (done, mut finished) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = Vec::new();
    for i in 0..WAITERS {
        let (counted, logged) = (retries.clone(), log.clone());
        let options = slow_polling().on_retry(move |event| {
            counted[i].fetch_add(1, Ordering::SeqCst);
            let line = format!("{:?} waiter {i}: {:?}", start.elapsed(), event.blocked);
            logged.lock().unwrap().push(line);
        });
        let (r, done) = (m.redlock.clone(), done.clone());
        waiters.push(tokio::spawn(async move {
            if r.obtain("job", ms(60_000), &options).await.is_ok() {
                let _ = done.send(i);
            }
        }));
    }
    let total = |retries: &[AtomicUsize]| -> Vec<usize> {
        retries.iter().map(|r| r.load(Ordering::SeqCst)).collect()
    };
    eventually(ms(10_000), "marked everywhere", async || {
        marked_on_every_master(&m, "job").await
    })
    .await;
    // Every waiter tried, failed and went to sleep.
    eventually(ms(10_000), "every waiter asleep", async || {
        total(&retries).iter().all(|&n| n >= 1)
    })
    .await;
    tokio::time::sleep(ms(500)).await;
    let before = total(&retries);
    let released = start.elapsed();
    held.release().await.unwrap();
    let winner = timeout(ms(10_000), finished.recv())
        .await
        .unwrap_or_else(|_| panic!("nobody woken; released at {released:?}; {log:#?}"))
        .expect("a winner");
    // A herd would show as other waiters that woke, found the lock taken, and retried.
    tokio::time::sleep(ms(1_500)).await;
    assert!(
        finished.try_recv().is_err(),
        "a second waiter obtained the lock"
    );
    for w in waiters {
        w.abort();
    }
    let after = total(&retries);
    let woken_in_vain: usize = (0..WAITERS)
        .filter(|&i| i != winner)
        .map(|i| after[i] - before[i])
        .sum();
    // One other waiter may have gone first: woken by the first master's announcement before
    // the release reached a majority, it found the lock held, and the release's next
    // announcement woke the longest-waiting waiter. A herd wakes them all.
    assert!(
        woken_in_vain <= 1,
        "one release woke {woken_in_vain} more waiters of one client; released at {released:?}; {log:#?}"
    );
}

// ---------------------------------------------------------------------------------------
// 3. Redlock with one master down (which Redlock is meant to tolerate): the waiter's
//    confirmation waits for that master's subscription for its whole polling interval.
// ---------------------------------------------------------------------------------------
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redlock_waiter_is_woken_although_one_master_is_down() {
    let mut m = Masters::start(QuorumConfig::default().node_timeout(ms(300))).await;
    m.servers[4].stop();
    let held = m
        .redlock
        .obtain("job", ms(60_000), &Options::default())
        .await
        .unwrap();
    let waiter: Waiter = tokio::spawn({
        let r = m.redlock.clone();
        async move { r.obtain("job", ms(60_000), &slow_polling()).await }
    });
    eventually(ms(10_000), "a majority marked", async || {
        m.marked(0..4, "job").await >= 3
    })
    .await;
    held.release().await.unwrap();
    woken(waiter, "redlock waiter with 4 of 5 masters up").await;
}

/// The same, with the release slow to reach two masters: the release announced by the fast
/// ones wakes the waiter too early, and its attempt meets two masters that still hold the
/// lock and one that fails (out of memory: it refuses every write at once). That is a quorum
/// error, not "held"; the waiter must still be woken again by the slow masters'
/// announcements, not sleep until its next poll (15 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redlock_waiter_woken_too_early_with_a_master_failing_is_woken_again() {
    let servers: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
    let refused = support::server::cli(servers[4].port(), &["CONFIG", "SET", "maxmemory", "1"]);
    assert_eq!(refused.trim(), "OK");
    // The holder reaches masters 0 and 2 through proxies, which slow its release there.
    let proxies = [
        Proxy::start(servers[0].port()).await,
        Proxy::start(servers[2].port()).await,
    ];
    let config = QuorumConfig::default().node_timeout(ms(5_000));
    let mut holders = Vec::new();
    let mut waiters = Vec::new();
    for (i, server) in servers.iter().enumerate() {
        let url = match i {
            0 => proxies[0].url(),
            2 => proxies[1].url(),
            _ => server.url(),
        };
        holders.push(client_with_timeout(&url, ms(5_000)).await);
        let events = lockset::redis::Client::open(server.url()).unwrap();
        let waiter = client_with_timeout(&server.url(), ms(5_000)).await;
        waiters.push(waiter.with_release_events(events).unwrap());
    }
    let holder = Client::quorum(holders, config).unwrap();
    let waiting = Client::quorum(waiters, config).unwrap();
    let held = holder
        .obtain("job", ms(60_000), &Options::default())
        .await
        .unwrap();
    let waiter: Waiter =
        tokio::spawn(async move { waiting.obtain("job", ms(60_000), &slow_polling()).await });
    // Marked (so its release announces) on three of the four masters that hold it: a slow
    // one and a fast one among them. An attempt decides once three masters refused.
    eventually(ms(10_000), "marked on three masters", async || {
        let marked = servers[..4]
            .iter()
            .filter(|server| support::server::cli(server.port(), &["GET", "job"]).starts_with('!'));
        marked.count() >= 3
    })
    .await;
    for proxy in &proxies {
        proxy.set_latency(ms(300));
    }
    // Returns once master 0 or 2 deleted it too (three of five): by then both did.
    held.release().await.unwrap();
    woken(
        waiter,
        "redlock waiter woken too early, with a master failing",
    )
    .await;
}

// ---------------------------------------------------------------------------------------
// 4. Two failed subscriptions (here: two SUBSCRIBEs that time out during a 3 s slowdown)
//    replace the pub/sub connection, dropping every healthy subscription without waking
//    anybody: a waiter that was listening fine misses the next release.
// ---------------------------------------------------------------------------------------
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replacing_the_listener_does_not_deafen_waiters_that_were_listening() {
    let env = Env::start().await;
    let proxy = Proxy::start(env.server.port()).await;
    let client = client_with_events_via(&env.server, &proxy.url()).await;
    let other = env.other_client().await;
    let held = other
        .obtain("job", ms(60_000), &Options::default())
        .await
        .unwrap();
    let _x = other
        .obtain("x", ms(60_000), &Options::default())
        .await
        .unwrap();
    let _y = other
        .obtain("y", ms(60_000), &Options::default())
        .await
        .unwrap();
    let w1: Waiter = tokio::spawn({
        let c = client.clone();
        async move { c.obtain("job", ms(60_000), &slow_polling()).await }
    });
    eventually(ms(10_000), "w1 listening", async || {
        client.release_channels_watched() == 1 && marked(&env, "job").await
    })
    .await;
    // A 3 s slowdown of the pub/sub connection while two other waiters subscribe.
    proxy.set_latency(ms(3_000));
    let short = Options::default()
        .retry(Retry::linear(ms(15_000)))
        .timeout(ms(4_000));
    let wx = tokio::spawn({
        let (c, o) = (client.clone(), short.clone());
        async move { c.obtain("x", ms(1_000), &o).await }
    });
    // (CONTROL=1: only one failed subscription, so no replacement: then w1 is woken.)
    let key_y = if std::env::var("CONTROL").is_ok() {
        "x"
    } else {
        "y"
    };
    let wy = tokio::spawn({
        let (c, o) = (client.clone(), short.clone());
        async move { c.obtain(key_y, ms(1_000), &o).await }
    });
    let _ = wx.await;
    let _ = wy.await;
    proxy.set_latency(Duration::ZERO);
    tokio::time::sleep(ms(1_000)).await;
    held.release().await.unwrap();
    woken(w1, "a waiter whose subscription was healthy").await;
}

// ---------------------------------------------------------------------------------------
// 5. Every replacement of the listener spawns one more sweeper task, which never ends.
// ---------------------------------------------------------------------------------------
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_subscriptions_do_not_leak_sweeper_tasks() {
    let env = Env::start().await;
    // Redis 7's default acl-pubsub-default resetchannels: this user may not SUBSCRIBE.
    let _: String = env
        .cmd(&["ACL", "SETUSER", "app", "on", ">pw", "~*", "+@all"])
        .await;
    let url = format!("redis://app:pw@127.0.0.1:{}/", env.server.port());
    let client = Client::connect(&url).await.unwrap();
    let _held = env
        .other_client()
        .await
        .obtain("job", ms(600_000), &Options::default())
        .await
        .unwrap();
    let opts = Options::default()
        .retry(Retry::linear(ms(20)))
        .timeout(ms(50));
    // Warm up: the first listener and its sweeper exist.
    for _ in 0..4 {
        let _ = client.obtain("job", ms(1_000), &opts).await;
    }
    tokio::time::sleep(ms(500)).await;
    let metrics = tokio::runtime::Handle::current().metrics();
    let before = metrics.num_alive_tasks();
    let connections = async || -> u64 {
        let stats: String = env.cmd(&["INFO", "stats"]).await;
        let line = stats
            .lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"))
            .unwrap();
        line.trim().parse().unwrap()
    };
    let connected = connections().await;
    for _ in 0..100 {
        let _ = client.obtain("job", ms(1_000), &opts).await;
    }
    // Let any subscribing task still running finish.
    tokio::time::sleep(ms(3_000)).await;
    let after = metrics.num_alive_tasks();
    assert!(
        after <= before + 2,
        "alive tasks grew from {before} to {after} over 100 waits"
    );
    let opened = connections().await - connected;
    assert!(opened <= 2, "{opened} new connections for 100 waits");
}

// ---------------------------------------------------------------------------------------
// 6. The pub/sub connection is down longer than redis-rs's reconnect budget (6 retries):
//    nothing ever reconnects it, and the channel still counts as subscribed, so after the
//    server is reachable again the waiter never hears a release.
// ---------------------------------------------------------------------------------------
struct Gate {
    port: u16,
    open: Arc<AtomicBool>,
    generation: tokio::sync::watch::Sender<u64>,
}

impl Gate {
    async fn start(upstream: u16) -> Self {
        let listener = support::server::listen();
        listener.set_nonblocking(true).unwrap();
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        let port = listener.local_addr().unwrap().port();
        let open = Arc::new(AtomicBool::new(true));
        let (generation, _) = tokio::sync::watch::channel(0u64);
        tokio::spawn({
            let (open, generation) = (open.clone(), generation.clone());
            async move {
                while let Ok((mut client, _)) = listener.accept().await {
                    if !open.load(Ordering::SeqCst) {
                        drop(client); // connection closed at once: the handshake fails
                        continue;
                    }
                    let mut drop_all = generation.subscribe();
                    tokio::spawn(async move {
                        let Ok(mut server) =
                            tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                        else {
                            return;
                        };
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                            _ = drop_all.changed() => {}
                        }
                    });
                }
            }
        });
        Self {
            port,
            open,
            generation,
        }
    }
    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
    fn close(&self) {
        self.open.store(false, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }
    fn open(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_hear_releases_again_after_a_pub_sub_outage_longer_than_the_reconnect_budget() {
    if !support::slow_scenario(
        "waiters_hear_releases_again_after_a_pub_sub_outage_longer_than_the_reconnect_budget",
        "an outage longer than the reconnect budget (15 s)",
    ) {
        return;
    }
    let env = Env::start().await;
    let gate = Gate::start(env.server.port()).await;
    let client = client_with_events_via(&env.server, &gate.url()).await;
    let other = env.other_client().await;
    let held = other
        .obtain("job", ms(120_000), &Options::default())
        .await
        .unwrap();
    let very_slow = Options::default()
        .retry(Retry::linear(Duration::from_secs(60)))
        .timeout(Duration::from_secs(300));
    let w: Waiter = tokio::spawn({
        let c = client.clone();
        async move { c.obtain("job", ms(60_000), &very_slow).await }
    });
    eventually(ms(10_000), "listening", async || {
        client.release_channels_watched() == 1 && marked(&env, "job").await
    })
    .await;
    gate.close();
    tokio::time::sleep(ms(12_000)).await; // > 6 retries with delays capped at 2 s
    gate.open();
    tokio::time::sleep(ms(3_000)).await; // the server is reachable again
    held.release().await.unwrap();
    woken(w, "after the pub/sub server became reachable again").await;
}

// ---------------------------------------------------------------------------------------
// 7. A clean-up release after an obtain with an unknown outcome (release_by_eval) deletes
//    a value a waiter marked, and announces nothing.
// ---------------------------------------------------------------------------------------
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_up_release_of_a_marked_key_wakes_the_waiter() {
    let env = Env::start().await;
    let proxy = Proxy::start(env.server.port()).await;
    let slow_conn = ConnectionManager::new_with_config(
        lockset::redis::Client::open(proxy.url()).unwrap(),
        ConnectionManagerConfig::new().set_response_timeout(Some(ms(500))),
    )
    .await
    .unwrap();
    let slow = Client::new(slow_conn);
    // Warm up first: scripts loaded, and (on Redis 6.2) SET NX GET found missing, so that
    // the obtain below is one command.
    slow.obtain("warm", ms(1_000), &Options::default())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    proxy.set_latency(ms(1_000));
    // Its SET lands at about +1 s, its reply would come at +2 s: it times out at +0.5 s and
    // cleans up by token (the clean-up lands at about +2 s).
    let start = Instant::now();
    let cut = tokio::spawn(async move {
        slow.obtain("job", ms(60_000), &Options::default().retry(Retry::NoRetry))
            .await
    });
    eventually(ms(10_000), "the timed-out obtain landed", async || {
        env.exists("job").await
    })
    .await;
    let landed = env.get("job").await.unwrap();
    let w: Waiter = tokio::spawn({
        let c = env.client.clone();
        async move { c.obtain("job", ms(60_000), &slow_polling()).await }
    });
    eventually(ms(10_000), "marked", async || marked(&env, "job").await).await;
    println!("marked at {:?}", start.elapsed());
    let err = cut.await.unwrap().unwrap_err();
    println!("timed-out obtain: {err:?} at {:?}", start.elapsed());
    // Deleted, or (a fair waiter) handed on, marked or not.
    eventually(ms(10_000), "cleaned up", async || {
        env.get("job")
            .await
            .is_none_or(|value| value.trim_start_matches('!') != landed)
    })
    .await;
    woken(w, "after the clean-up deleted the marked key").await;
}

// ---------------------------------------------------------------------------------------
// 8. Redlock under contention: waiters of several clients race for a released lock; a split
//    vote is undone with release_by_eval, which announces nothing although the losers'
//    values were marked by the others: everybody sleeps its full polling interval.
// ---------------------------------------------------------------------------------------
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_hand_overs_between_clients_never_stall_for_a_polling_interval() {
    const WAITERS: usize = 6;
    let m = Masters::start(QuorumConfig::default().node_timeout(ms(300))).await;
    let held = m
        .redlock
        .obtain("job", ms(60_000), &Options::default())
        .await
        .unwrap();
    let (done, mut finished) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..WAITERS {
        let mut nodes = Vec::new();
        for s in &m.servers {
            nodes.push(Client::connect(&s.url()).await.unwrap());
        }
        let client = Client::quorum(nodes, QuorumConfig::default().node_timeout(ms(300))).unwrap();
        let done = done.clone();
        tokio::spawn(async move {
            let lock = client
                .obtain("job", ms(60_000), &slow_polling())
                .await
                .unwrap();
            let _ = done.send(Instant::now());
            lock.release().await.unwrap();
        });
    }
    tokio::time::sleep(ms(3_000)).await;
    held.release().await.unwrap();
    let mut last = Instant::now();
    let mut gaps = Vec::new();
    for _ in 0..WAITERS {
        let at = timeout(Duration::from_secs(100), finished.recv())
            .await
            .unwrap()
            .unwrap();
        gaps.push(at.saturating_duration_since(last));
        last = at;
    }
    println!("hand-over gaps: {gaps:?}");
    assert!(
        gaps.iter().all(|g| *g < WOKEN_WITHIN),
        "a hand-over stalled: {gaps:?}"
    );
}

// ---------------------------------------------------------------------------------------
// 9. Channels that go idle while the pub/sub connection is down: the sweeper's UNSUBSCRIBE
//    fails, the channels are forgotten anyway, and redis-rs (which still tracks them)
//    resubscribes them after reconnecting: server-side subscriptions nobody will ever drop.
// ---------------------------------------------------------------------------------------
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channels_swept_during_an_outage_do_not_stay_subscribed_on_the_server() {
    if !support::slow_scenario(
        "channels_swept_during_an_outage_do_not_stay_subscribed_on_the_server",
        "an outage longer than the sweeper's idle time and the reconnects (12 s)",
    ) {
        return;
    }
    const KEYS: usize = 20;
    let env = Env::start().await;
    let gate = Gate::start(env.server.port()).await;
    let client = client_with_events_via(&env.server, &gate.url()).await;
    let other = env.other_client().await;
    let mut held = Vec::new();
    for i in 0..KEYS {
        held.push(
            other
                .obtain(format!("k{i}"), ms(120_000), &Options::default())
                .await
                .unwrap(),
        );
    }
    let opts = Options::default()
        .retry(Retry::linear(Duration::from_secs(15)))
        .timeout(ms(3_000));
    let mut waiters = Vec::new();
    for i in 0..KEYS {
        let (c, o) = (client.clone(), opts.clone());
        waiters.push(tokio::spawn(async move {
            c.obtain(format!("k{i}"), ms(1_000), &o).await
        }));
    }
    // Each key's release channel, and the client's own hand-off channel for it (the
    // waiters wait fairly).
    eventually(ms(10_000), "all subscribed", async || {
        let channels: Vec<String> = env.cmd(&["PUBSUB", "CHANNELS"]).await;
        let keys = (0..KEYS).all(|i| channels.contains(&format!("k{i}")));
        keys && channels.len() == 2 * KEYS
    })
    .await;
    gate.close(); // the pub/sub connection drops and cannot come back for a while
    for w in waiters {
        let _ = w.await; // each gives up at its 3 s deadline: its channel goes idle
    }
    tokio::time::sleep(ms(3_000)).await; // the sweeper tries to unsubscribe them now
    gate.open();
    // Something makes the connection come back: another waiter on another key.
    let _z = other
        .obtain("z", ms(120_000), &Options::default())
        .await
        .unwrap();
    let _ = client
        .obtain(
            "z",
            ms(1_000),
            &Options::default()
                .retry(Retry::linear(ms(100)))
                .timeout(ms(1_000)),
        )
        .await;
    tokio::time::sleep(ms(5_000)).await; // idle channels are swept within 1.5 s
    let channels: Vec<String> = env.cmd(&["PUBSUB", "CHANNELS"]).await;
    assert_eq!(client.release_channels_watched(), 0);
    assert!(
        channels.is_empty(),
        "still subscribed on the server, nobody waits: {channels:?}"
    );
}

// ---------------------------------------------------------------------------------------
// 10. One SUBSCRIBE lost to a momentary drop of the pub/sub connection: the waiter waits in
//     `confirm` for its whole polling interval; nothing retries the subscription although
//     redis-rs reconnects within milliseconds.
// ---------------------------------------------------------------------------------------
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscribe_lost_to_a_momentary_drop_is_retried() {
    let env = Env::start().await;
    let proxy = Proxy::start(env.server.port()).await;
    let client = client_with_events_via(&env.server, &proxy.url()).await;
    // Open the pub/sub connection first (an unrelated waiter that gives up).
    let other = env.other_client().await;
    let held = other
        .obtain("job", ms(60_000), &Options::default())
        .await
        .unwrap();
    let quick = Options::default()
        .retry(Retry::linear(ms(50)))
        .timeout(ms(300));
    let _ = client.obtain("job", ms(1_000), &quick).await;
    proxy.set_latency(ms(300));
    let w: Waiter = tokio::spawn({
        let c = client.clone();
        async move { c.obtain("job", ms(60_000), &slow_polling()).await }
    });
    tokio::time::sleep(ms(100)).await; // its SUBSCRIBE is in the proxy now
    proxy.drop_connections();
    proxy.set_latency(Duration::ZERO);
    tokio::time::sleep(ms(1_500)).await; // redis-rs has long reconnected
    held.release().await.unwrap();
    woken(w, "after a momentary drop during its SUBSCRIBE").await;
}

// ---------------------------------------------------------------------------------------
// 11. "A waiter never marks a value this library did not write": any value that starts
//     with digits and a colon is taken for ours.
// ---------------------------------------------------------------------------------------
#[tokio::test]
async fn a_waiter_never_marks_a_foreign_value_that_only_looks_like_a_lock() {
    let env = Env::start().await;
    let _: String = env.cmd(&["SET", "meeting", "10:30 room 4"]).await;
    let opts = Options::default()
        .retry(Retry::linear(ms(50)))
        .timeout(ms(300));
    let err = env
        .client
        .obtain("meeting", ms(1_000), &opts)
        .await
        .unwrap_err();
    assert!(err.is_not_obtained());
    assert_eq!(env.get("meeting").await.as_deref(), Some("10:30 room 4"));
}

// ---------------------------------------------------------------------------------------
// A Redlock release lands on the masters at different times: the first announcement wakes
// a waiter whose attempt still finds the lock on a majority; the later announcements of
// the same release must wake it again, although each release wakes one waiter.
// ---------------------------------------------------------------------------------------
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redlock_waiter_woken_too_early_is_woken_again_by_the_later_masters() {
    let m = Masters::start(QuorumConfig::default().node_timeout(ms(2_000))).await;
    let mut proxies = Vec::new();
    let mut holders = Vec::new();
    for (i, server) in m.servers.iter().enumerate() {
        let url = if i < 2 {
            server.url()
        } else {
            let proxy = Proxy::start(server.port()).await;
            let url = proxy.url();
            proxies.push(proxy);
            url
        };
        holders.push(Client::connect(&url).await.unwrap());
    }
    let holder = Client::quorum(holders, QuorumConfig::default().node_timeout(ms(2_000))).unwrap();
    m.load_scripts().await;
    let held = holder
        .obtain("job", ms(60_000), &Options::default())
        .await
        .unwrap();
    // The holder's obtain returns once a majority holds the lock; the masters behind the
    // proxies may get it later. A waiter that came first there would find the key free
    // (and undo what it set), and never mark it.
    tokio::time::timeout(ms(10_000), holder.background_idle())
        .await
        .expect("held on every master");
    let waiter = tokio::spawn({
        let r = m.redlock.clone();
        async move { r.obtain("job", ms(60_000), &slow_polling()).await }
    });
    eventually(ms(10_000), "marked everywhere", async || {
        marked_on_every_master(&m, "job").await
    })
    .await;
    // The release reaches masters 2, 3 and 4 (a majority) 150 ms after 0 and 1.
    for proxy in &proxies {
        proxy.set_latency(ms(150));
    }
    let released = Instant::now();
    held.release().await.unwrap();
    let obtained = timeout(ms(5_000), waiter)
        .await
        .expect("woken by the later masters' announcements, not by its 15 s poll")
        .unwrap()
        .unwrap();
    assert!(released.elapsed() < ms(5_000));
    obtained.release().await.unwrap();
}

/// Whether every master stores `key` with a waiter's mark.
async fn marked_on_every_master(m: &Masters, key: &str) -> bool {
    for i in 0..m.servers.len() {
        if !m.get(i, key).await.is_some_and(|v| v.starts_with('!')) {
            return false;
        }
    }
    true
}

// ---------------------------------------------------------------------------------------
// 9. A Redlock waiter that joins a channel live on *some* master (its client's other waiter
//    keeps it) must subscribe again where the subscription lapsed: else, while one master
//    stays live, nothing ever does, and a release announced only by the others goes unheard.
//    (Found by a review of `join_live`.)
// ---------------------------------------------------------------------------------------
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joining_redlock_waiter_subscribes_again_on_masters_where_it_lapsed() {
    if !support::slow_scenario(
        "a_joining_redlock_waiter_subscribes_again_on_masters_where_it_lapsed",
        "an outage longer than two failed pings 5 s apart (20 s)",
    ) {
        return;
    }
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let config = QuorumConfig::default().node_timeout(ms(1_000));
    // The waiting client hears masters 0 and 1 through gates, master 2 directly.
    let mut gates = Vec::new();
    let mut nodes = Vec::new();
    for (i, server) in servers.iter().enumerate() {
        if i < 2 {
            let gate = Gate::start(server.port()).await;
            nodes.push(client_with_events_via(server, &gate.url()).await);
            gates.push(gate);
        } else {
            nodes.push(Client::connect(&server.url()).await.unwrap());
        }
    }
    let waiting = Client::quorum(nodes, config).unwrap();
    let mut direct = Vec::new();
    for server in &servers {
        direct.push(Client::connect(&server.url()).await.unwrap());
    }
    let holder = Client::quorum(direct, config).unwrap();
    let held = holder
        .obtain("job", ms(120_000), &Options::default())
        .await
        .unwrap();
    timeout(ms(10_000), holder.background_idle())
        .await
        .expect("held on every master");
    let very_slow = || {
        Options::default()
            .retry(Retry::linear(Duration::from_secs(60)))
            .timeout(Duration::from_secs(300))
    };
    let spawn_waiter = || -> Waiter {
        let (client, options) = (waiting.clone(), very_slow());
        tokio::spawn(async move { client.obtain("job", ms(60_000), &options).await })
    };
    let subscribers = async |i: usize| -> i64 {
        let mut conn = support::connect(&servers[i]).await;
        let (_, n): (String, i64) = lockset::redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(lockset::release_channel("job"))
            .query_async(&mut conn)
            .await
            .unwrap();
        n
    };
    // The first waiter subscribes while masters 0 and 1 cannot be reached for pub/sub, for
    // longer than it takes the client to give up on that connection and replace it (two
    // failed pings, 5 s apart, after redis-rs's reconnect budget).
    for gate in &gates {
        gate.close();
    }
    let first = spawn_waiter();
    eventually(ms(10_000), "listening on master 2", async || {
        subscribers(2).await == 1
    })
    .await;
    tokio::time::sleep(ms(20_000)).await;
    for gate in &gates {
        gate.open();
    }
    // A second waiter of the same client joins the channel (live on master 2): it must
    // subscribe again where nobody listens.
    let second = spawn_waiter();
    // Generous: under load the replaced connections take a while to come back.
    eventually(ms(40_000), "listening on every master again", async || {
        subscribers(0).await == 1 && subscribers(1).await == 1
    })
    .await;
    // Master 2 lost the key (a minority: the lock holds); only masters 0 and 1 announce.
    let mut conn = support::connect(&servers[2]).await;
    let _: i64 = lockset::redis::cmd("DEL")
        .arg("job")
        .query_async(&mut conn)
        .await
        .unwrap();
    held.release().await.unwrap();
    let (lock, _, _) = timeout(
        ms(10_000),
        futures_util::future::select_all([first, second]),
    )
    .await
    .expect("no waiter woken by the release");
    lock.unwrap().unwrap();
}

/// A Redlock waiter for a key set, blocked by its second key: it must listen on that key's
/// channel (the quorum names the key that blocked), and be woken by its release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redlock_set_waiter_blocked_by_its_second_key_is_woken_by_its_release() {
    let m = Masters::start(QuorumConfig::default().node_timeout(ms(1_000))).await;
    let held = m
        .redlock
        .obtain("{s}:b", ms(60_000), &Options::default())
        .await
        .unwrap();
    let waiting = m.redlock.clone();
    let waiter: Waiter = tokio::spawn(async move {
        waiting
            .obtain_multi(["{s}:a", "{s}:b"], ms(60_000), &slow_polling())
            .await
    });
    eventually(ms(10_000), "the holder marked on a majority", async || {
        m.marked(0..5, "{s}:b").await >= 3
    })
    .await;
    held.release().await.unwrap();
    woken(waiter, "redlock set waiter blocked by its second key").await;
}
