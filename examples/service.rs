//! A small service as a real one is written: its lock settings come from a configuration
//! file (`lockset::Config`, TOML here), it connects once, and several workers share the one
//! `Client`, each running a job only while it holds the job's lock, and telling "somebody
//! else is on it" apart from "Redis is down".
//!
//! Run with `cargo run --example service`. Reads the file named by `LOCKSET_CONFIG` when
//! set; otherwise uses the settings below with `REDIS_URL`, or a throwaway local
//! redis-server.

#[path = "../tests/support/server.rs"]
mod server;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use lockset::{Client, Config};

/// The settings a deployment would keep in a file; `{url}` is filled in below.
const SETTINGS: &str = r#"
url = "{url}"
connect_timeout = "1s"
response_timeout = "2s"

[lock]
ttl = "2s"
metadata = "report-service"
timeout = "300ms"
retry = { backoff = "exponential", min = "10ms", max = "100ms", jitter = "full" }
"#;

/// How often the job ran, and how many ran it at once at most.
#[derive(Default)]
struct Runs {
    total: AtomicU32,
    now: AtomicU32,
    most: AtomicU32,
}

/// The job: at most one worker anywhere runs it at a time.
async fn send_reports(worker: u32, runs: &Runs) {
    runs.total.fetch_add(1, Ordering::Relaxed);
    let now = runs.now.fetch_add(1, Ordering::SeqCst) + 1;
    runs.most.fetch_max(now, Ordering::SeqCst);
    println!("worker {worker}: sending the reports");
    tokio::time::sleep(Duration::from_millis(150)).await;
    runs.now.fetch_sub(1, Ordering::SeqCst);
}

/// One worker: every 100 ms, runs the job if it gets the lock.
async fn worker(id: u32, client: Client, config: Arc<Config>, runs: Arc<Runs>) {
    let options = config.options();
    for _ in 0..8 {
        let ran = client
            .with_lock(["reports"], config.lock.ttl, &options, |_lost| {
                send_reports(id, &runs)
            })
            .await;
        match ran {
            Ok(()) => {}
            Err(err) if err.is_not_obtained() => println!("worker {id}: another worker has it"),
            Err(err) if err.is_unavailable() => println!("worker {id}: Redis unavailable: {err}"),
            Err(err) => println!("worker {id}: giving up: {err}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = server::url_or_start();
    let text = match std::env::var_os("LOCKSET_CONFIG") {
        Some(path) => std::fs::read_to_string(path)?,
        None => SETTINGS.replace("{url}", &url),
    };
    let config: Config = toml::from_str(&text)?;
    // One client for the whole service, whatever topology the file names.
    let client = config.connect().await?;
    let config = Arc::new(config);
    let runs = Arc::new(Runs::default());
    let workers: Vec<_> = (1..=3)
        .map(|id| tokio::spawn(worker(id, client.clone(), config.clone(), runs.clone())))
        .collect();
    for worker in workers {
        worker.await?;
    }
    println!(
        "the job ran {} times, by at most {} worker(s) at once",
        runs.total.load(Ordering::Relaxed),
        runs.most.load(Ordering::Relaxed)
    );
    Ok(())
}
