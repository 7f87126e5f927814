//! TLS for tests: a private certificate authority, a server certificate for 127.0.0.1 and a
//! client certificate signed by it, and a second CA that signed nothing here, all made at
//! test time with the `openssl` command in a private folder; and redis-servers that listen
//! with them (`--tls-port`) beside their plain port.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use super::RedisServer;

/// Certificates in a private folder, removed when dropped.
pub struct Certs {
    dir: PathBuf,
}

impl Certs {
    /// Makes a CA, a server certificate for `127.0.0.1` and `localhost`, a client certificate,
    /// and another CA. Elliptic-curve keys: quick to make.
    pub fn make() -> Self {
        static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("lockset-tls-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("certificate folder");
        let certs = Self { dir };
        for ca in ["ca", "other-ca"] {
            certs.openssl(&[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-days",
                "2",
                "-subj",
                &format!("/CN=lockset test {ca}"),
                "-keyout",
                &format!("{ca}.key"),
                "-out",
                &format!("{ca}.pem"),
            ]);
        }
        certs.sign(
            "server",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
        );
        certs.sign("client", "extendedKeyUsage=clientAuth\n");
        certs
    }

    /// A key and a certificate named `name`, signed by the CA, with the extensions `ext`.
    fn sign(&self, name: &str, ext: &str) {
        let ext_file = format!("{name}.ext");
        std::fs::write(self.dir.join(&ext_file), ext).expect("extensions file");
        self.openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            &format!("/CN=lockset test {name}"),
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
        ]);
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &ext_file,
            "-out",
            &format!("{name}.pem"),
        ]);
    }

    fn openssl(&self, args: &[&str]) {
        let status = Command::new("openssl")
            .args(args)
            .current_dir(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run openssl (apt-get install -y openssl)");
        assert!(status.success(), "openssl {args:?} failed");
    }

    /// The file `name` (e.g. `ca.pem`, `client.key`).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn arg(&self, name: &str) -> String {
        self.path(name).to_string_lossy().into_owned()
    }

    /// The server options for TLS on `tls_port` with these certificates; with
    /// `client_certs`, clients must present a certificate the CA signed.
    pub fn server_args(&self, tls_port: u16, client_certs: bool) -> Vec<String> {
        let auth = if client_certs { "yes" } else { "no" };
        [
            "--tls-port",
            &tls_port.to_string(),
            "--tls-cert-file",
            &self.arg("server.pem"),
            "--tls-key-file",
            &self.arg("server.key"),
            "--tls-ca-cert-file",
            &self.arg("ca.pem"),
            "--tls-auth-clients",
            auth,
        ]
        .map(str::to_owned)
        .to_vec()
    }
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A redis-server with a plain port (for the test's own inspection) and a TLS port.
pub struct TlsServer {
    pub server: RedisServer,
    pub tls_port: u16,
}

impl TlsServer {
    /// Starts one with `certs` (and `extra` options), or `None` when the server binary was
    /// built without TLS (it refuses `--tls-port`).
    pub fn start(certs: &Certs, client_certs: bool, extra: &[&str]) -> Option<Self> {
        for _ in 0..10 {
            let tls_port = super::server::free_port();
            let mut args = certs.server_args(tls_port, client_certs);
            args.extend(extra.iter().map(|arg| (*arg).to_owned()));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            match RedisServer::try_start_with_args(&args) {
                Some(server) => return Some(Self { server, tls_port }),
                None if refuses_tls(&args) => return None,
                None => continue,
            }
        }
        panic!("no TLS server started on any of 10 free ports");
    }

    /// `rediss://[login@]127.0.0.1:<tls port>/`.
    pub fn url(&self, login: &str) -> String {
        format!("rediss://{login}127.0.0.1:{}/", self.tls_port)
    }

    /// A sentinel that watches this server, by its TLS port and over TLS, as master `name`,
    /// and listens over TLS itself: it and its TLS port.
    pub fn sentinel(&self, certs: &Certs, name: &str) -> (RedisServer, u16) {
        let tls_port = super::server::free_port();
        let mut config = format!(
            "sentinel monitor {name} 127.0.0.1 {} 1\nsentinel down-after-milliseconds {name} 1000\n\
             tls-replication yes\n",
            self.tls_port
        );
        for pair in certs.server_args(tls_port, false).chunks(2) {
            config.push_str(&format!(
                "{} {}\n",
                pair[0].trim_start_matches("--"),
                pair[1]
            ));
        }
        (RedisServer::start_sentinel(&config), tls_port)
    }
}

/// Whether the server binary refuses the TLS options `args` as such (built without TLS:
/// "Failed finding TLS support", or "Bad directive" before Redis 6), rather than failing to
/// start for another reason (its port taken).
fn refuses_tls(args: &[&str]) -> bool {
    let output = Command::new(super::server::server_binary())
        .args(["--port", "0", "--save", "", "--logfile", ""])
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            // One that starts stays up: give it a moment, then stop it.
            std::thread::sleep(std::time::Duration::from_millis(500));
            let _ = child.kill();
            child.wait_with_output()
        })
        .expect("run the server");
    // Redis 7 logs a refused directive to standard output, Redis 6.2 to standard error.
    let said = [&output.stdout, &output.stderr]
        .map(|text| String::from_utf8_lossy(text).to_lowercase())
        .concat();
    said.contains("tls support") || said.contains("bad directive")
}

/// Says that a test runs without TLS on this server (see [`super::skipping`]).
pub fn skip(test: &str) {
    super::skipping(test, "the server was built without TLS");
}
