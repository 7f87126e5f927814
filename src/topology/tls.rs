//! TLS settings for `rediss://` connections (feature `tls`, rustls): which certificate
//! authorities to trust, and the client certificate for mutual TLS.
//!
//! A `rediss://` URL alone trusts the system's roots (with the `tls` feature: redis-rs's
//! tokio + rustls support). A [`Tls`] replaces them with a private CA, adds a client
//! certificate, or both, for every connection a client makes: lock operations, release
//! events, and under Sentinel the sentinels (those given as `rediss://`) and the data nodes.
//!
//! **Invariant.** Every certificate and key is read and parsed when the settings are made,
//! so a missing file or a PEM without a certificate is an
//! [`InvalidInput::Tls`] before anything is sent, never a connection that fails later.

use std::fmt;
use std::path::Path;

use redis::{ClientTlsConfig, IntoConnectionInfo, TlsCertificates};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::Result;
use crate::model::invalid::InvalidInput;

/// TLS settings for `rediss://` servers: the certificate authorities to trust (the system's
/// roots unless given), and a client certificate for servers that ask for one
/// (`tls-auth-clients yes`). Use with
/// [`Client::connect_with_tls`](crate::Client::connect_with_tls) or
/// [`SentinelConfig::tls`](crate::SentinelConfig::tls).
///
/// See the guide: [TLS and logins](crate::guide::servers#tls-and-logins).
///
/// ```no_run
/// # async fn demo() -> Result<(), lockset::Error> {
/// use lockset::{Client, Tls};
///
/// let tls = Tls::new()
///     .ca_file("/etc/redis/ca.pem")?
///     .client_cert_files("/etc/lockset/client.pem", "/etc/lockset/client.key")?;
/// let client = Client::connect_with_tls("rediss://redis.internal:6380/", &tls).await?;
/// # Ok(())
/// # }
/// ```
///
/// `Debug` says which settings are given, never what the key is.
#[derive(Clone, Default)]
pub struct Tls {
    /// The certificate authorities to trust (PEM), instead of the system's roots.
    ca: Option<Vec<u8>>,
    /// The client's certificate chain and private key (PEM).
    client: Option<(Vec<u8>, Vec<u8>)>,
}

impl Tls {
    /// The system's trusted roots and no client certificate: what a `rediss://` URL gets
    /// without settings.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts the certificate authorities in `pem` (one or more PEM certificates) instead
    /// of the system's roots.
    ///
    /// # Errors
    ///
    /// [`InvalidInput::Tls`] when `pem` holds no certificate.
    pub fn ca_pem(self, pem: impl Into<Vec<u8>>) -> Result<Self> {
        let pem = pem.into();
        certificates(&pem, "the CA")?;
        Ok(Self {
            ca: Some(pem),
            ..self
        })
    }

    /// Trusts the certificate authorities in the PEM file at `path` instead of the system's
    /// roots.
    ///
    /// # Errors
    ///
    /// [`InvalidInput::Tls`] when the file cannot be read or holds no certificate.
    pub fn ca_file(self, path: impl AsRef<Path>) -> Result<Self> {
        self.ca_pem(read(path.as_ref(), "CA certificate")?)
    }

    /// Presents the certificate chain `cert` with its private key `key` (both PEM) to
    /// servers that ask for a client certificate.
    ///
    /// # Errors
    ///
    /// [`InvalidInput::Tls`] when `cert` holds no certificate or `key` no private key.
    pub fn client_cert_pem(
        self,
        cert: impl Into<Vec<u8>>,
        key: impl Into<Vec<u8>>,
    ) -> Result<Self> {
        let (cert, key) = (cert.into(), key.into());
        certificates(&cert, "the client certificate")?;
        PrivateKeyDer::from_pem_slice(&key).map_err(|err| InvalidInput::Tls {
            reason: format!("no private key in the client key: {err}"),
        })?;
        Ok(Self {
            client: Some((cert, key)),
            ..self
        })
    }

    /// Presents the certificate chain in the PEM file `cert`, with the private key in the
    /// PEM file `key`, to servers that ask for a client certificate.
    ///
    /// # Errors
    ///
    /// [`InvalidInput::Tls`] when a file cannot be read, or holds no certificate or key.
    pub fn client_cert_files(self, cert: impl AsRef<Path>, key: impl AsRef<Path>) -> Result<Self> {
        let cert = read(cert.as_ref(), "client certificate")?;
        let key = read(key.as_ref(), "client key")?;
        self.client_cert_pem(cert, key)
    }

    /// A redis-rs client for `url` with these settings, for connections of your own (a
    /// `ConnectionManager` with your timeouts, say, then
    /// [`Client::new`](crate::Client::new) and
    /// [`Client::with_release_events`](crate::Client::with_release_events) with it). The
    /// URL's scheme says whether TLS is used at all: `rediss://` for TLS.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`](crate::Error::Redis) for a URL that does not parse.
    pub fn client(&self, url: impl IntoConnectionInfo) -> Result<redis::Client> {
        Ok(self.redis_client(url)?)
    }

    /// As [`Tls::client`], with redis-rs's error: a plain address gets a plain client.
    pub(crate) fn redis_client(
        &self,
        info: impl IntoConnectionInfo,
    ) -> redis::RedisResult<redis::Client> {
        let info = info.into_connection_info()?;
        if !matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }) {
            return redis::Client::open(info);
        }
        provide_crypto();
        redis::Client::build_with_tls(info, self.certificates())
    }

    /// These settings as redis-rs takes them: for a cluster client of your own
    /// (`ClusterClientBuilder::certs`), say.
    pub fn certificates(&self) -> TlsCertificates {
        TlsCertificates {
            client_tls: self.client.as_ref().map(|(cert, key)| ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
            root_cert: self.ca.clone(),
        }
    }
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field(
                "ca",
                &if self.ca.is_some() {
                    "given"
                } else {
                    "system roots"
                },
            )
            .field("client_cert", &self.client.is_some())
            .finish()
    }
}

/// Makes rustls's `ring` provider the process's default, unless one is set already: rustls
/// refuses to guess when a program's dependencies enable more than one.
pub(crate) fn provide_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Checks that `pem` holds at least one certificate.
fn certificates(pem: &[u8], what: &str) -> Result<()> {
    let parsed: Vec<_> = CertificateDer::pem_slice_iter(pem).collect();
    if parsed.is_empty() {
        return Err(InvalidInput::Tls {
            reason: format!("no PEM certificate in {what}"),
        }
        .into());
    }
    if let Some(Err(err)) = parsed.into_iter().find(std::result::Result::is_err) {
        return Err(InvalidInput::Tls {
            reason: format!("{what} does not parse: {err}"),
        }
        .into());
    }
    Ok(())
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|err| {
        InvalidInput::Tls {
            reason: format!("cannot read the {what} {}: {err}", path.display()),
        }
        .into()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_without_certificates_is_refused() {
        let err = Tls::new().ca_pem("not a certificate").unwrap_err();
        assert!(
            matches!(
                err,
                crate::error::Error::InvalidInput(InvalidInput::Tls { .. })
            ),
            "{err:?}"
        );
        let err = Tls::new()
            .ca_file("/nonexistent/ca.pem")
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent/ca.pem"), "{err}");
    }

    #[test]
    fn debug_never_shows_a_key() {
        let tls = Tls {
            ca: None,
            client: Some((b"cert".to_vec(), b"SECRET".to_vec())),
        };
        let shown = format!("{tls:?}");
        assert!(!shown.contains("SECRET"), "{shown}");
    }

    #[test]
    fn a_plain_url_gets_a_plain_client() {
        let client = Tls::new().client("redis://127.0.0.1:6379/").unwrap();
        assert!(matches!(
            client.get_connection_info().addr(),
            redis::ConnectionAddr::Tcp(..)
        ));
    }
}
