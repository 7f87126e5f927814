//! Watching locks: the spans and events `tracing` gets, the retry callback, and no token in
//! any of them. A binary of its own: `tracing` caches per call site whether anybody listens,
//! process-wide, and the suite's other tests, running beside these on threads without a
//! subscriber, would have it cached as "nobody" before a capture starts.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use lockset::{Blocked, Error, Options, Retry};
use support::proxy::Proxy;
use support::{Env, RedisServer, client_with_timeout, eventually, ms};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::Registry;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt as _};

/// A span as it closed: its name and every field recorded on it.
#[derive(Clone, Debug)]
struct ClosedSpan {
    name: &'static str,
    fields: HashMap<String, String>,
}

/// An event: level, target, message and fields.
#[derive(Clone, Debug)]
struct Logged {
    level: Level,
    target: String,
    fields: HashMap<String, String>,
}

impl Logged {
    fn message(&self) -> &str {
        self.fields.get("message").map_or("", String::as_str)
    }
}

/// Everything the library told `tracing`, captured.
#[derive(Default)]
struct Captured {
    open: HashMap<u64, ClosedSpan>,
    spans: Vec<ClosedSpan>,
    events: Vec<Logged>,
}

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Captured>>);

impl Capture {
    fn spans(&self, name: &str) -> Vec<ClosedSpan> {
        let captured = self.0.lock().unwrap();
        captured
            .spans
            .iter()
            .filter(|span| span.name == name)
            .cloned()
            .collect()
    }

    fn events(&self) -> Vec<Logged> {
        self.0.lock().unwrap().events.clone()
    }

    /// Every field of every span and event, as one text.
    fn all_text(&self) -> String {
        let captured = self.0.lock().unwrap();
        let spans = captured.spans.iter().chain(captured.open.values());
        let mut text = String::new();
        for fields in spans
            .map(|s| &s.fields)
            .chain(captured.events.iter().map(|e| &e.fields))
        {
            for (name, value) in fields {
                text.push_str(&format!("{name}={value}\n"));
            }
        }
        text
    }
}

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: Subscriber> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        let mut span = ClosedSpan {
            name: attrs.metadata().name(),
            fields: HashMap::new(),
        };
        attrs.record(&mut Fields(&mut span.fields));
        self.0.lock().unwrap().open.insert(id.into_u64(), span);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        if let Some(span) = self.0.lock().unwrap().open.get_mut(&id.into_u64()) {
            values.record(&mut Fields(&mut span.fields));
        }
    }

    fn on_close(&self, id: Id, _: Context<'_, S>) {
        let mut captured = self.0.lock().unwrap();
        if let Some(span) = captured.open.remove(&id.into_u64()) {
            captured.spans.push(span);
        }
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut logged = Logged {
            level: *event.metadata().level(),
            target: event.metadata().target().to_owned(),
            fields: HashMap::new(),
        };
        event.record(&mut Fields(&mut logged.fields));
        self.0.lock().unwrap().events.push(logged);
    }
}

/// Captures what this thread's code tells `tracing` while the guard lives (the tests run on
/// a current-thread runtime, so background tasks are captured too).
fn capture() -> (Capture, tracing::subscriber::DefaultGuard) {
    let capture = Capture::default();
    let subscriber = Registry::default().with(capture.clone());
    let guard = tracing::subscriber::set_default(subscriber);
    (capture, guard)
}

#[tokio::test]
async fn every_operation_has_a_span_with_its_keys_attempts_and_outcome() {
    let env = Env::start().await;
    let (capture, _guard) = capture();
    let lock = env
        .client
        .obtain_multi(["order:1", "order:2"], ms(5_000), &Options::default())
        .await
        .unwrap();
    assert!(lock.ttl().await.unwrap().is_some());
    lock.refresh(ms(5_000), &Options::default()).await.unwrap();
    lock.release().await.unwrap();

    // The metrics' words (a TTL query has no metric: `ok`).
    for (name, outcome) in [
        ("lockset.obtain", "obtained"),
        ("lockset.ttl", "ok"),
        ("lockset.refresh", "refreshed"),
        ("lockset.release", "released"),
    ] {
        let spans = capture.spans(name);
        assert_eq!(spans.len(), 1, "{name}: {spans:?}");
        let fields = &spans[0].fields;
        assert_eq!(fields["keys"], "2", "{name}: {fields:?}");
        assert_eq!(fields["key"], "order:1", "{name}: {fields:?}");
        assert_eq!(fields["attempts"], "1", "{name}: {fields:?}");
        assert_eq!(fields["outcome"], outcome, "{name}: {fields:?}");
        assert!(fields["waited_ms"].parse::<u64>().is_ok(), "{fields:?}");
    }
}

#[tokio::test]
async fn each_retry_is_an_event_and_a_callback_naming_the_held_key() {
    let env = Env::start().await;
    let holder = env
        .client
        .obtain("report", ms(10_000), &Options::default())
        .await
        .unwrap();
    let (capture, _guard) = capture();
    let calls = Arc::new(Mutex::new(Vec::new()));
    let seen = calls.clone();
    // Barging: a fair waiter sleeps until its hand-off instead of retrying every 20 ms.
    let options = Options::default()
        .retry(Retry::linear(ms(20)))
        .timeout(ms(300))
        .fair(false)
        .on_retry(move |event| {
            let held = match event.blocked {
                Blocked::Held { key, ttl } => Some((key.to_owned(), ttl)),
                _ => None,
            };
            seen.lock()
                .unwrap()
                .push((event.attempt, held, event.delay));
        });
    let waiter = env.other_client().await;
    let err = waiter
        .obtain_multi(["invoice", "report"], ms(1_000), &options)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::DeadlineExceeded), "{err:?}");

    let calls = calls.lock().unwrap().clone();
    // Linear 20 ms within 300 ms: a retry at least every 20 ms (more on a loaded machine).
    assert!(calls.len() >= 2, "{calls:?}");
    for (i, (attempt, held, delay)) in calls.iter().enumerate() {
        assert_eq!(*attempt as usize, i + 1, "attempts count up from 1");
        let (key, ttl) = held.clone().expect("blocked by the holder");
        assert_eq!(key, "report");
        let ttl = ttl.expect("the holder's TTL is known");
        assert!(ttl > ms(8_000) && ttl <= ms(10_000), "{ttl:?}");
        assert!(*delay <= ms(20), "{delay:?}");
    }
    let retries: Vec<Logged> = capture
        .events()
        .into_iter()
        .filter(|e| e.target == "lockset::retry")
        .collect();
    assert_eq!(retries.len(), calls.len(), "{retries:?}");
    for event in &retries {
        assert_eq!(event.level, Level::DEBUG);
        assert_eq!(event.fields["held_key"], "report", "{event:?}");
        assert!(event.fields.contains_key("holder_ttl_ms"), "{event:?}");
        assert!(event.fields.contains_key("delay_ms"), "{event:?}");
    }
    let span = &capture.spans("lockset.obtain")[0];
    assert_eq!(span.fields["outcome"], "deadline");
    // Every attempt but the last was followed by a wait (the deadline may end the last wait).
    let attempts: usize = span.fields["attempts"].parse().unwrap();
    assert!(
        attempts == calls.len() || attempts == calls.len() + 1,
        "{attempts} attempts, {} retries",
        calls.len()
    );
    let waited: u64 = span.fields["waited_ms"].parse().unwrap();
    assert!(waited >= 250, "{waited}");
    holder.release().await.unwrap();
}

#[tokio::test]
async fn a_retried_error_is_an_event_and_a_callback_naming_the_error() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    let client = client_with_timeout(&proxy.url(), ms(100)).await;
    let (capture, _guard) = capture();
    let calls = Arc::new(Mutex::new(Vec::new()));
    let seen = calls.clone();
    let options = Options::default()
        .retry(Retry::linear(ms(20)))
        .timeout(ms(600))
        .on_retry(move |event| {
            let failed = match event.blocked {
                Blocked::Failed(err) => Some(err.is_unavailable()),
                _ => None,
            };
            seen.lock().unwrap().push(failed);
        });
    // Nothing answers: each attempt runs into the 100 ms response timeout.
    proxy.stall(true);
    let err = client
        .obtain("job", ms(10_000), &options)
        .await
        .unwrap_err();
    proxy.stall(false);
    assert!(err.is_unavailable(), "{err:?}");
    let calls = calls.lock().unwrap().clone();
    assert!(!calls.is_empty(), "no retry");
    assert!(
        calls.iter().all(|failed| *failed == Some(true)),
        "each retry names the error, which says Redis is unavailable: {calls:?}"
    );
    let retries: Vec<Logged> = capture
        .events()
        .into_iter()
        .filter(|e| e.target == "lockset::retry")
        .collect();
    assert_eq!(retries.len(), calls.len(), "{retries:?}");
    for event in &retries {
        assert_eq!(event.level, Level::DEBUG);
        assert!(event.fields.contains_key("err"), "{event:?}");
        assert!(!event.fields.contains_key("held_key"), "{event:?}");
    }
    assert_eq!(
        capture.spans("lockset.obtain")[0].fields["outcome"],
        "unavailable"
    );
}

#[tokio::test]
async fn a_lock_found_lost_is_a_warning_once() {
    let env = Env::start().await;
    let lock = env
        .client
        .obtain("job", ms(10_000), &Options::default())
        .await
        .unwrap();
    let (capture, _guard) = capture();
    let _: i64 = env.cmd(&["DEL", "job"]).await;
    let err = lock
        .refresh(ms(10_000), &Options::default())
        .await
        .unwrap_err();
    assert!(err.is_not_held(), "{err:?}");
    assert_eq!(lock.ttl().await.unwrap(), None);
    let lost: Vec<Logged> = capture
        .events()
        .into_iter()
        .filter(|e| e.message().starts_with("lock lost"))
        .collect();
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert_eq!(lost[0].level, Level::WARN);
    assert_eq!(lost[0].fields["key"], "job");
    assert_eq!(
        capture.spans("lockset.refresh")[0].fields["outcome"],
        "not_held"
    );
}

/// Work under `with_lock` that stops because the lock was lost: the loss is one warning,
/// and the release that then finds nothing to release is not a second one.
#[tokio::test]
async fn a_with_lock_whose_lock_was_lost_warns_once() {
    let env = Env::start().await;
    let (capture, _guard) = capture();
    let options = Options::default().watchdog_interval(ms(50));
    let raw = env.raw.clone();
    let outcome = env
        .client
        .with_lock(["job"], ms(10_000), &options, |lost| async move {
            let mut raw = raw;
            let _: i64 = lockset::redis::cmd("DEL")
                .arg("job")
                .query_async(&mut raw)
                .await
                .unwrap();
            lost.lost().await;
            "stopped"
        })
        .await
        .unwrap();
    assert_eq!(outcome, "stopped");
    let warnings: Vec<String> = capture
        .events()
        .into_iter()
        .filter(|e| e.level == Level::WARN)
        .map(|e| e.message().to_owned())
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].starts_with("lock lost"), "{warnings:?}");
}

#[tokio::test]
async fn a_failed_watchdog_refresh_is_a_warning_and_is_ridden_out() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    let client = client_with_timeout(&proxy.url(), ms(100)).await;
    let (capture, _guard) = capture();
    let guard = client
        .obtain("job", ms(10_000), &Options::default())
        .await
        .unwrap()
        .keep_alive_every(ms(50));
    proxy.stall(true);
    eventually(ms(10_000), "a failed watchdog refresh warned", async || {
        capture
            .events()
            .iter()
            .any(|e| e.level == Level::WARN && e.message().starts_with("watchdog refresh failed"))
    })
    .await;
    let refreshes = async || refresh_calls(&server).await;
    let before = refreshes().await;
    proxy.stall(false);
    // Ridden out: the watchdog goes on refreshing (the one held back by the stall, then
    // more), the lock stays held, and nothing said it was lost.
    eventually(ms(10_000), "the watchdog refreshed again", async || {
        refreshes().await >= before + 3
    })
    .await;
    assert!(!guard.lost_signal().is_lost());
    assert!(
        !capture
            .events()
            .iter()
            .any(|e| e.message().starts_with("lock lost")),
        "{:?}",
        capture.events()
    );
    // Each of the watchdog's refreshes has a span, as a refresh by hand has.
    let outcomes: Vec<String> = capture
        .spans("lockset.refresh")
        .iter()
        .map(|span| span.fields["outcome"].clone())
        .collect();
    assert!(outcomes.iter().any(|o| o == "unavailable"), "{outcomes:?}");
    assert!(outcomes.iter().any(|o| o == "refreshed"), "{outcomes:?}");
    guard.release().await.unwrap();
}

#[tokio::test]
async fn no_token_appears_in_any_span_or_event() {
    let env = Env::start().await;
    let (capture, _guard) = capture();
    let attempts = Arc::new(AtomicU32::new(0));
    let counted = attempts.clone();
    let patient = Options::default()
        .retry(Retry::linear(ms(10)))
        .timeout(ms(100))
        .on_retry(move |_| {
            counted.fetch_add(1, Ordering::Relaxed);
        });
    let mut tokens = Vec::new();
    let custom = Options::default().token("a-very-secret-custom-token");
    let lock = env.client.obtain("a", ms(5_000), &custom).await.unwrap();
    tokens.push(lock.token().to_owned());
    // A waiter retries against it (retry events), then the lock is lost and found lost.
    let other = env.other_client().await;
    assert!(other.obtain("a", ms(5_000), &patient).await.is_err());
    let _: i64 = env.cmd(&["DEL", "a"]).await;
    assert!(lock.refresh(ms(5_000), &Options::default()).await.is_err());
    let random = env
        .client
        .obtain_multi(["b", "c"], ms(5_000), &Options::default())
        .await
        .unwrap();
    tokens.push(random.token().to_owned());
    random.ttl().await.unwrap();
    random.release().await.unwrap();
    assert!(attempts.load(Ordering::Relaxed) > 0);

    let text = capture.all_text();
    assert!(text.contains("lock lost"), "{text}");
    for token in tokens {
        assert!(!text.contains(&token), "token {token} in:\n{text}");
    }
}

#[test]
fn options_debug_shows_a_callback_without_calling_it() {
    let options = Options::default().on_retry(|_| panic!("not called by Debug"));
    let debug = format!("{options:?}");
    assert!(debug.contains("OnRetry"), "{debug}");
}

/// How many EVALSHA and SET the server ran: every refresh of a single key is one (by
/// script, or SET IFEQ where the server has it).
async fn refresh_calls(server: &RedisServer) -> u64 {
    let mut conn = support::connect(server).await;
    let info: String = lockset::redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    info.lines()
        .filter(|line| line.starts_with("cmdstat_evalsha:") || line.starts_with("cmdstat_set:"))
        .map(calls)
        .sum()
}

/// The `calls=` count of a commandstats line.
fn calls(line: &str) -> u64 {
    line.split(['=', ','])
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}
