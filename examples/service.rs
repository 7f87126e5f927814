//! A small HTTP service as a real one is written: its lock settings come from a configuration
//! file (`lockset::Config`, TOML), it connects once, whatever the topology the file names
//! (one server, Sentinel, Redlock or a cluster), every request takes the lock of what it
//! works on, and `/metrics` exports the lock metrics for Prometheus (with
//! `--features metrics`).
//!
//! - `GET /reports/ID` sends report ID under the lock `report:{ID}`: 200 when sent, 409 when
//!   another request holds it ("try later"), 503 when Redis is unavailable.
//! - `GET /metrics`: Prometheus' text format.
//!
//! Run with `cargo run --features metrics --example service`. It reads the file named by
//! `LOCKSET_CONFIG` when set; otherwise the settings below with `REDIS_URL`, or a throwaway
//! local redis-server. With `SERVICE_ADDR=127.0.0.1:8080` it serves until stopped; without,
//! it sends itself a burst of requests, prints the answers and the metrics, and exits (which
//! `tests/suite/service.rs` runs on each of the four topologies).

#[path = "../tests/support/server.rs"]
mod server;

use std::sync::Arc;
use std::time::Duration;

use lockset::{Client, Config, Error};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// The settings a deployment keeps in a file; `{url}` is filled in below.
const SETTINGS: &str = r#"
url = "{url}"
connect_timeout = "1s"
response_timeout = "2s"

[lock]
ttl = "5s"
metadata = "report-service"
retry = { backoff = "none" }
"#;

/// What the service shares between requests.
struct Service {
    client: Client,
    config: Config,
    #[cfg(feature = "metrics")]
    metrics: metrics_exporter_prometheus::PrometheusHandle,
}

impl Service {
    /// The answer to one request line: status and body.
    async fn answer(&self, path: &str) -> (u16, String) {
        if path == "/metrics" {
            return (200, self.metrics());
        }
        let Some(id) = path.strip_prefix("/reports/").filter(|id| !id.is_empty()) else {
            return (404, "no such page\n".to_owned());
        };
        let key = format!("report:{id}");
        let lock = match self
            .client
            .obtain(&key, self.config.lock.ttl, &self.config.options())
            .await
        {
            Ok(lock) => lock,
            Err(err) => return refusal(&err),
        };
        // The work the lock protects: one request at a time per report.
        tokio::time::sleep(Duration::from_millis(100)).await;
        match lock.release().await {
            Ok(()) => (200, format!("sent report {id}\n")),
            // The lock expired during the work: whoever took it may have sent it too.
            Err(err) if err.is_not_held() => (500, format!("report {id}: lock lost: {err}\n")),
            Err(err) => refusal(&err),
        }
    }

    #[cfg(feature = "metrics")]
    fn metrics(&self) -> String {
        self.metrics.render()
    }

    #[cfg(not(feature = "metrics"))]
    fn metrics(&self) -> String {
        "# build with --features metrics for lockset's metrics\n".to_owned()
    }
}

/// The status for an error: somebody else has it, Redis is down, or something to fix.
fn refusal(err: &Error) -> (u16, String) {
    if err.is_not_obtained() {
        // The message names the key's holder by its metadata: fine inside a company; a
        // public service would keep that to its logs.
        (409, format!("busy, try later: {err}\n"))
    } else if err.is_unavailable() {
        (503, format!("Redis unavailable: {err}\n"))
    } else {
        (500, format!("{err}\n"))
    }
}

/// Serves one connection: one request, one answer.
async fn serve(service: Arc<Service>, stream: TcpStream) -> std::io::Result<()> {
    let mut stream = BufReader::new(stream);
    let mut line = String::new();
    stream.read_line(&mut line).await?;
    let path = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
    let (status, body) = service.answer(&path).await;
    let head = format!(
        "HTTP/1.1 {status} {}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        if status == 200 { "OK" } else { "Error" },
        body.len()
    );
    let stream = stream.get_mut();
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await
}

/// `GET path` from the service at `addr`: the status and the body.
async fn get(addr: std::net::SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect(addr).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nhost: localhost\r\n\r\n").as_bytes())
        .await?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await?;
    let status = reply
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = reply.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    Ok((status, body.to_owned()))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    #[cfg(feature = "metrics")]
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Suffix("_seconds".to_owned()),
            &[0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0],
        )?
        .install_recorder()?;
    let (text, _server) = match std::env::var_os("LOCKSET_CONFIG") {
        Some(path) => (std::fs::read_to_string(path)?, None),
        None => {
            let (url, server) = server::url_or_start();
            (SETTINGS.replace("{url}", &url), server)
        }
    };
    let config: Config = toml::from_str(&text)?;
    // One client for the whole service, whatever topology the file names.
    let client = config.connect().await?;
    println!("connected: {client:?}");
    let service = Arc::new(Service {
        client,
        config,
        #[cfg(feature = "metrics")]
        metrics,
    });
    let serve_at = std::env::var("SERVICE_ADDR").ok();
    let listener = TcpListener::bind(serve_at.as_deref().unwrap_or("127.0.0.1:0")).await?;
    let addr = listener.local_addr()?;
    let accepting = {
        let service = service.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(service.clone(), stream));
            }
        })
    };
    if serve_at.is_some() {
        println!("serving on http://{addr}/reports/ID and http://{addr}/metrics");
        accepting.await?;
        return Ok(());
    }
    // Three requests for one report at once: at most one sends it, the others are told to
    // try later (on a Redlock quorum, obtains racing without retries can split the masters'
    // votes, and then none gets it); another report meanwhile is sent.
    let burst = ["/reports/42", "/reports/42", "/reports/42", "/reports/7"];
    let asking: Vec<_> = burst
        .iter()
        .map(|path| tokio::spawn(get(addr, path)))
        .collect();
    let mut sent = 0;
    for (path, asked) in burst.iter().zip(asking) {
        let (status, body) = asked.await??;
        sent += usize::from(status == 200);
        print!("GET {path}: {status} {body}");
    }
    let (_, page) = get(addr, "/metrics").await?;
    for line in page
        .lines()
        .filter(|l| l.starts_with("lockset_obtains_total"))
    {
        println!("{line}");
    }
    println!("{sent} of {} requests sent their report", burst.len());
    Ok(())
}
