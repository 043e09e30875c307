//! The checked-in CRD manifest must be exactly what the Rust types generate.

// Test code: a failed setup step should fail the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use cloudnet_shared::crd;

const HEADER: &str = "# Generated from shared/src/resource.rs and shared/src/crd.rs; do not edit.\n\
# Regenerate: CLOUDNET_UPDATE_MANIFESTS=1 cargo test -p cloudnet-shared --test crd_manifest\n";

/// The checked-in CRD. Cargo's runtime `CARGO_MANIFEST_DIR` comes first: a test binary reused
/// from another checkout through the shared target directory carries that checkout's
/// compile-time directory.
fn manifest_path() -> PathBuf {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    dir.join("../manifests/crd/cloudprivateipconfigs.cloud.network.openshift.io.yaml")
}

fn render() -> String {
    let yaml = serde_saphyr::to_string(&crd()).expect("the CRD serialises to YAML");
    format!("{HEADER}{yaml}")
}

#[test]
fn checked_in_crd_matches_the_types() {
    let generated = render();
    let path = manifest_path();
    if std::env::var_os("CLOUDNET_UPDATE_MANIFESTS").is_some() {
        std::fs::write(&path, &generated).expect("write the CRD manifest");
        return;
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == generated,
        "{} has drifted from the Rust types; regenerate it with \
         `CLOUDNET_UPDATE_MANIFESTS=1 cargo test -p cloudnet-shared --test crd_manifest` \
         and review the diff",
        path.display()
    );
}

#[test]
fn rendered_manifest_parses_back_to_the_same_crd() {
    let parsed: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition =
        serde_saphyr::from_str(&render()).expect("the manifest is a CRD");
    assert_eq!(parsed, crd());
}
