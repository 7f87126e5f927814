//! TLS (feature `tls`): `rediss://` servers with certificates made at test time by a private
//! CA, for lock operations, release events, mutual TLS and Sentinel; wrong certificates are
//! clear errors at once. A server binary built without TLS skips these tests, visibly.
#![cfg(feature = "tls")]

use crate::support;

use lockset::{Client, Error, InvalidInput, Options, Replication, Retry, SentinelConfig, Tls};
use support::ms;
use support::tls::{Certs, TlsServer, skip};
use tokio::time::Instant;

fn trusting(certs: &Certs) -> Tls {
    Tls::new().ca_file(certs.path("ca.pem")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_and_release_events_work_over_tls() {
    let certs = Certs::make();
    let Some(server) = TlsServer::start(&certs, false, &[]) else {
        return skip("locks_and_release_events_work_over_tls");
    };
    let client = Client::connect_with_tls(&server.url(""), &trusting(&certs))
        .await
        .unwrap();
    let lock = client
        .obtain("tls", ms(30_000), &Options::default().metadata("over tls"))
        .await
        .unwrap();
    let waiter = Client::connect_with_tls(&server.url(""), &trusting(&certs))
        .await
        .unwrap();
    // It polls only every 20 s: only the release event, over TLS, wakes it in time.
    let waiting = tokio::spawn(async move {
        let options = Options::default()
            .retry(Retry::linear(ms(20_000)))
            .timeout(ms(30_000));
        waiter.obtain("tls", ms(5_000), &options).await
    });
    let plain = server.server.port();
    support::eventually(ms(10_000), "the waiter marks the holder", async || {
        support::server::cli(plain, &["GET", "tls"]).starts_with('!')
    })
    .await;
    lock.refresh(ms(30_000), &Options::default()).await.unwrap();
    assert!(lock.ttl().await.unwrap().is_some());
    let released = Instant::now();
    lock.release().await.unwrap();
    let theirs = waiting.await.unwrap().expect("woken over TLS");
    assert!(released.elapsed() < ms(5_000), "{:?}", released.elapsed());
    theirs.release().await.unwrap();
    // The locks went over the TLS port: the plain one served only this test's inspection.
    let clients = support::server::cli(plain, &["INFO", "stats"]);
    assert!(clients.contains("total_connections_received"), "{clients}");
}

/// A server whose certificate the client does not trust: a clear error naming the
/// certificate, at once (not after redis-rs's connection retries, about 6 s).
#[tokio::test]
async fn an_untrusted_certificate_is_refused_at_once() {
    let certs = Certs::make();
    let Some(server) = TlsServer::start(&certs, false, &[]) else {
        return skip("an_untrusted_certificate_is_refused_at_once");
    };
    let wrong_ca = Tls::new().ca_file(certs.path("other-ca.pem")).unwrap();
    for tls in [wrong_ca, Tls::new()] {
        let started = Instant::now();
        let err = Client::connect_with_tls(&server.url(""), &tls)
            .await
            .unwrap_err();
        assert!(started.elapsed() < ms(2_000), "{:?}", started.elapsed());
        let said = err.to_string();
        assert!(said.to_lowercase().contains("certificate"), "{said}");
        assert!(
            !err.is_not_obtained() && !err.is_not_held() && !err.is_unavailable(),
            "{err:?}"
        );
    }
    // A plain rediss:// URL trusts the system's roots, which know nothing of this CA.
    let err = Client::connect(&server.url("")).await.unwrap_err();
    assert!(err.to_string().contains("certificate"), "{err}");
}

#[tokio::test]
async fn bad_certificate_files_are_invalid_input() {
    let certs = Certs::make();
    let missing = Tls::new().ca_file(certs.path("nope.pem")).unwrap_err();
    assert!(
        matches!(missing, Error::InvalidInput(InvalidInput::Tls { .. })),
        "{missing:?}"
    );
    assert!(missing.to_string().contains("nope.pem"), "{missing}");
    // A key where a certificate belongs.
    let err = Tls::new().ca_file(certs.path("ca.key")).unwrap_err();
    assert!(
        matches!(err, Error::InvalidInput(InvalidInput::Tls { .. })),
        "{err:?}"
    );
    let err = Tls::new()
        .client_cert_files(certs.path("client.pem"), certs.path("client.pem"))
        .unwrap_err();
    assert!(err.to_string().contains("private key"), "{err}");
}

/// Mutual TLS: a server that asks for client certificates refuses a client without one,
/// at once, and serves one with a certificate its CA signed.
#[tokio::test]
async fn mutual_tls_needs_the_client_certificate() {
    let certs = Certs::make();
    let Some(server) = TlsServer::start(&certs, true, &[]) else {
        return skip("mutual_tls_needs_the_client_certificate");
    };
    let started = Instant::now();
    let without = Client::connect_with_tls(&server.url(""), &trusting(&certs)).await;
    assert!(without.is_err(), "connected without a client certificate");
    assert!(started.elapsed() < ms(2_000), "{:?}", started.elapsed());

    let tls = trusting(&certs)
        .client_cert_files(certs.path("client.pem"), certs.path("client.key"))
        .unwrap();
    let client = Client::connect_with_tls(&server.url(""), &tls)
        .await
        .unwrap();
    let lock = client
        .obtain("mutual", ms(10_000), &Options::default())
        .await
        .unwrap();
    lock.release().await.unwrap();
}

/// TLS and a login together: the password goes in the `rediss://` URL, for the lock
/// connection and the release events alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_over_tls() {
    let certs = Certs::make();
    let Some(server) = TlsServer::start(&certs, false, &["--requirepass", "s3cret"]) else {
        return skip("a_password_over_tls");
    };
    let client = Client::connect_with_tls(&server.url(":s3cret@"), &trusting(&certs))
        .await
        .unwrap();
    support::a_release_wakes(&client, &client, "pw").await;

    let err = Client::connect_with_tls(&server.url(":wrong@"), &trusting(&certs))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("authentication failed"), "{err}");
}

/// Sentinel over TLS: the sentinel is asked over TLS, and the primary it names is reached
/// over TLS (the lock connection and release events), all trusting the private CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_and_primary_over_tls() {
    let certs = Certs::make();
    let Some(primary) = TlsServer::start(&certs, false, &[]) else {
        return skip("sentinel_and_primary_over_tls");
    };
    let (sentinel, sentinel_tls) = primary.sentinel(&certs, "m");
    let sentinels = [format!("rediss://127.0.0.1:{sentinel_tls}/")];
    let config = SentinelConfig::new(sentinels, "m")
        .unwrap()
        .replication(Replication::none())
        .tls(trusting(&certs));
    let client = Client::connect_sentinel(config).await.unwrap();
    support::a_release_wakes(&client, &client, "s").await;
    drop(sentinel);
}
