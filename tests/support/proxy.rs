//! A small TCP fault proxy on loopback, between a client and a redis-server started by the
//! tests: it can add latency, stall, reset every connection (a real RST, `SO_LINGER` 0), cut
//! one reply in the middle, lose one reply whole after the server ran the command, or hold
//! back the requests that mention a given text (a SUBSCRIBE to one channel) until told to
//! let them go. It counts what it did, and tests wait on those counts instead of sleeping.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The faults currently switched on, and what the proxy did so far.
#[derive(Default)]
struct Faults {
    /// Delay added before forwarding each chunk, in microseconds.
    latency_us: AtomicU64,
    /// Forward nothing while set.
    stalled: AtomicBool,
    /// Forward half of the next reply chunk, then reset the connection.
    cut_next_reply: AtomicBool,
    /// Forward none of the next reply chunk (the server ran the command), then reset.
    lose_next_reply: AtomicBool,
    /// Request chunks containing this text wait (with everything behind them on their
    /// connection) until it is cleared.
    hold: std::sync::Mutex<Option<Vec<u8>>>,
    /// Request chunks held back so far.
    held: AtomicU64,
    /// Request chunks read from clients (also while stalled).
    requests: AtomicU64,
    /// Replies cut or lost.
    replies_lost: AtomicU64,
    /// Connections reset by the proxy.
    resets: AtomicU64,
    /// Notified whenever a count changes.
    changed: Notify,
}

impl Faults {
    /// Whether `chunk` is to be held back now.
    fn holds(&self, chunk: &[u8]) -> bool {
        let hold = self.hold.lock().expect("hold");
        hold.as_ref()
            .is_some_and(|text| chunk.windows(text.len()).any(|w| w == text.as_slice()))
    }

    fn count(&self, counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_waiters();
    }
}

/// A proxy listening on a free 127.0.0.1 port, forwarding to `127.0.0.1:upstream`.
pub struct Proxy {
    port: u16,
    faults: Arc<Faults>,
    /// Bumped to reset every open connection.
    generation: watch::Sender<u64>,
    task: JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream: u16) -> Self {
        let listener = super::server::listen();
        listener.set_nonblocking(true).expect("non-blocking proxy");
        let listener = TcpListener::from_std(listener).expect("bind proxy");
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

    /// The port the proxy listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Delays every chunk in both directions by `latency`.
    pub fn set_latency(&self, latency: Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.faults.latency_us.store(micros, Ordering::SeqCst);
    }

    /// The latency added to every chunk now.
    pub fn latency(&self) -> Duration {
        Duration::from_micros(self.faults.latency_us.load(Ordering::SeqCst))
    }

    /// Stops (or resumes) forwarding in both directions; connections stay open.
    pub fn stall(&self, stalled: bool) {
        self.faults.stalled.store(stalled, Ordering::SeqCst);
    }

    /// Resets every open connection (RST on both sides: nothing in flight is delivered).
    pub fn drop_connections(&self) {
        self.generation.send_modify(|g| *g += 1);
    }

    /// Cuts the next reply in the middle and resets its connection.
    pub fn cut_next_reply(&self) {
        self.faults.cut_next_reply.store(true, Ordering::SeqCst);
    }

    /// Loses the next reply whole, after the server ran its command, and resets the
    /// client's connection: the client cannot know whether the command ran.
    pub fn lose_next_reply(&self) {
        self.faults.lose_next_reply.store(true, Ordering::SeqCst);
    }

    /// Holds back every request chunk that contains `text` (and what follows it on its
    /// connection) until [`Proxy::release_held`]; counted in [`Proxy::held`].
    pub fn hold_requests_containing(&self, text: &str) {
        *self.faults.hold.lock().expect("hold") = Some(text.as_bytes().to_vec());
    }

    /// Lets held requests go, and holds no more.
    pub fn release_held(&self) {
        *self.faults.hold.lock().expect("hold") = None;
    }

    /// Request chunks held back so far.
    pub fn held(&self) -> u64 {
        self.faults.held.load(Ordering::SeqCst)
    }

    /// Request chunks read from clients so far (also those held back by a stall).
    pub fn requests(&self) -> u64 {
        self.faults.requests.load(Ordering::SeqCst)
    }

    /// Replies cut or lost so far.
    pub fn replies_lost(&self) -> u64 {
        self.faults.replies_lost.load(Ordering::SeqCst)
    }

    /// Connections the proxy reset so far.
    pub fn resets(&self) -> u64 {
        self.faults.resets.load(Ordering::SeqCst)
    }

    /// Waits until `count()` reaches `at_least` (a test that never gets there hangs: wrap it
    /// in a timeout).
    pub async fn wait_for(&self, count: impl Fn(&Self) -> u64, at_least: u64) {
        loop {
            let changed = self.faults.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if count(self) >= at_least {
                return;
            }
            changed.await;
        }
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
    // Closing with SO_LINGER 0 sends RST: a reset, not an orderly end of stream.
    let _ = client.set_zero_linger();
    let _ = server.set_zero_linger();
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let requests = pump(client_read, server_write, faults.clone(), false);
    let replies = pump(server_read, client_write, faults.clone(), true);
    // Ends (resetting both sockets) when either side closes, a reply is cut or lost, or all
    // connections are to be reset.
    let reset = tokio::select! {
        end = requests => end == End::Reset,
        end = replies => end == End::Reset,
        _ = generation.changed() => true,
    };
    if reset {
        faults.count(&faults.resets);
    }
}

#[derive(PartialEq, Eq)]
enum End {
    Closed,
    Reset,
}

/// Forwards what `from` sends to `to`, each chunk `latency` after it was read (chunks are
/// delayed, not slowed: a burst takes the latency once, as on a long link), holding back
/// or stalling or losing chunks as the faults say.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    faults: Arc<Faults>,
    replies: bool,
) -> End {
    let (chunks, mut due) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reading = {
        let faults = faults.clone();
        async move {
            let mut buffer = vec![0u8; 64 * 1024];
            while let Ok(n) = from.read(&mut buffer).await {
                if n == 0 {
                    break;
                }
                if !replies {
                    faults.count(&faults.requests);
                    if faults.holds(&buffer[..n]) {
                        faults.count(&faults.held);
                        while faults.holds(&buffer[..n]) {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                    }
                }
                let latency = Duration::from_micros(faults.latency_us.load(Ordering::SeqCst));
                if chunks
                    .send((Instant::now() + latency, buffer[..n].to_vec()))
                    .is_err()
                {
                    break;
                }
            }
            // What was read is still forwarded; then the writing side ends.
            drop(chunks);
            std::future::pending::<()>().await;
        }
    };
    let writing = async move {
        while let Some((at, chunk)) = due.recv().await {
            // Without latency, at once (a timer rounds up to the next millisecond).
            if at > Instant::now() {
                tokio::time::sleep_until(at).await;
            }
            while faults.stalled.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            if replies && faults.lose_next_reply.swap(false, Ordering::SeqCst) {
                faults.count(&faults.replies_lost);
                return End::Reset;
            }
            if replies && faults.cut_next_reply.swap(false, Ordering::SeqCst) {
                let _ = to.write_all(&chunk[..chunk.len() / 2]).await;
                faults.count(&faults.replies_lost);
                return End::Reset;
            }
            if to.write_all(&chunk).await.is_err() {
                return End::Closed;
            }
        }
        End::Closed
    };
    tokio::select! {
        () = reading => End::Closed,
        end = writing => end,
    }
}
