//! The serving certificate's expiry is read from the loaded pair, exported as a metric, and
//! flagged for a warning well before it happens.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use cloudnet_certs::{CertificateAuthority, LeafRequest, Usage};
use cloudnet_webhook::metrics::Metrics;
use cloudnet_webhook::tls::{CertPaths, CertStore, EXPIRY_WARNING, expires_soon};

#[test]
fn the_loaded_certificates_expiry_is_exported_as_a_metric() {
    let ca = CertificateAuthority::generate("expiry-ca", time::Duration::days(30)).unwrap();
    let leaf = ca
        .issue(&LeafRequest {
            common_name: "webhook",
            organizations: &[],
            alt_names: &["127.0.0.1"],
            usage: Usage::Server,
            validity: time::Duration::days(3),
        })
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let paths = CertPaths {
        cert: dir.path().join("tls.crt"),
        key: dir.path().join("tls.key"),
    };
    std::fs::write(&paths.cert, &leaf.cert_pem).unwrap();
    std::fs::write(&paths.key, &leaf.key_pem).unwrap();
    let store = Arc::new(CertStore::load(paths).unwrap());
    let expected = (time::OffsetDateTime::now_utc() + time::Duration::days(3)).unix_timestamp();
    let not_after = store.not_after().unwrap();
    assert!(
        (not_after - expected).abs() < 600,
        "{not_after} vs {expected}"
    );

    let metrics = Metrics::new();
    metrics.set_certificate_expiry(not_after);
    let text = metrics.encode().unwrap();
    assert!(
        text.contains(&format!(
            "cloudnet_webhook_certificate_expiry_timestamp_seconds {not_after}"
        )),
        "{text}"
    );
}

#[test]
fn expiry_within_fourteen_days_is_flagged() {
    let day = 86_400;
    assert_eq!(EXPIRY_WARNING.as_secs(), 14 * day as u64);
    for (now, not_after, soon) in [
        (0, 30 * day, false),
        (0, 14 * day + 1, false),
        (0, 14 * day, true),
        (0, day, true),
        (10 * day, 5 * day, true),
    ] {
        assert_eq!(expires_soon(now, not_after), soon, "{now} {not_after}");
    }
}
