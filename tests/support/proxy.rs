//! A small TCP fault proxy on loopback, between a client and a redis-server started by the
//! tests: it can add latency, stall, drop every connection, or cut one mid-reply.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The faults currently switched on.
#[derive(Default)]
struct Faults {
    /// Delay added before forwarding each chunk, in microseconds.
    latency_us: AtomicU64,
    /// Forward nothing while set.
    stalled: AtomicBool,
    /// Forward half of the next reply chunk, then close the connection.
    cut_next_reply: AtomicBool,
}

/// A proxy listening on a free 127.0.0.1 port, forwarding to `127.0.0.1:upstream`.
pub struct Proxy {
    port: u16,
    faults: Arc<Faults>,
    /// Bumped to drop every open connection.
    generation: watch::Sender<u64>,
    task: JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let faults = Arc::new(Faults::default());
        let (generation, _) = watch::channel(0);
        let task = tokio::spawn({
            let (faults, generation) = (faults.clone(), generation.clone());
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                        continue;
                    };
                    tokio::spawn(serve(
                        client,
                        server,
                        faults.clone(),
                        generation.subscribe(),
                    ));
                }
            }
        });
        Self {
            port,
            faults,
            generation,
            task,
        }
    }

    /// The URL clients connect to.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Delays every chunk in both directions by `latency`.
    pub fn set_latency(&self, latency: Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.faults.latency_us.store(micros, Ordering::SeqCst);
    }

    /// Stops (or resumes) forwarding in both directions; connections stay open.
    pub fn stall(&self, stalled: bool) {
        self.faults.stalled.store(stalled, Ordering::SeqCst);
    }

    /// Resets every open connection.
    pub fn drop_connections(&self) {
        self.generation.send_modify(|g| *g += 1);
    }

    /// Cuts the next reply in the middle and closes its connection.
    pub fn cut_next_reply(&self) {
        self.faults.cut_next_reply.store(true, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        self.drop_connections();
    }
}

async fn serve(
    client: TcpStream,
    server: TcpStream,
    faults: Arc<Faults>,
    mut generation: watch::Receiver<u64>,
) {
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let requests = pump(client_read, server_write, faults.clone(), false);
    let replies = pump(server_read, client_write, faults, true);
    // Ends (closing both sockets) when either side closes, or when told to drop everything.
    tokio::select! {
        _ = requests => {}
        _ = replies => {}
        _ = generation.changed() => {}
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    faults: Arc<Faults>,
    replies: bool,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let Ok(n) = from.read(&mut buffer).await else {
            return;
        };
        if n == 0 {
            return;
        }
        let latency = faults.latency_us.load(Ordering::SeqCst);
        if latency > 0 {
            tokio::time::sleep(Duration::from_micros(latency)).await;
        }
        while faults.stalled.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if replies && faults.cut_next_reply.swap(false, Ordering::SeqCst) {
            let _ = to.write_all(&buffer[..n / 2]).await;
            return;
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}
