//! The certificates of the extra CA bundles (the cluster's trusted bundle, a custom CA), parsed
//! once here for every HTTP client that takes DER certificates (Azure's and GCP's reqwest).

use rustls::pki_types::CertificateDer;

use crate::outbound::trust::{self, TrustError};

/// Every certificate of `bundles`, each bundle checked as [`trust::certificates`] checks it.
pub fn certificates(bundles: &[Vec<u8>]) -> Result<Vec<CertificateDer<'static>>, TrustError> {
    let mut out = Vec::new();
    for (i, pem) in bundles.iter().enumerate() {
        out.extend(trust::certificates(&format!("CA bundle {}", i + 1), pem)?);
    }
    Ok(out)
}
