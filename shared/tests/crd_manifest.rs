//! The checked-in CRD manifests must be exactly what the Rust types generate.

// Test code: a failed setup step should fail the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

/// One generated CRD.
struct Generated {
    /// Its manifest under `manifests/`.
    manifest: &'static str,
    /// The sources it is generated from.
    sources: &'static str,
    crd: fn() -> CustomResourceDefinition,
}

const CRDS: [Generated; 3] = [
    Generated {
        manifest: "crd/cloudprivateipconfigs.cloud.network.openshift.io.yaml",
        sources: "shared/src/resource.rs and shared/src/crd.rs",
        crd: cloudnet_shared::crd,
    },
    Generated {
        manifest: "public-ips/egresspublicips.cloudnet.io.yaml",
        sources: "shared/src/public_ip/mod.rs and shared/src/public_ip/crd.rs",
        crd: cloudnet_shared::public_ip::crd,
    },
    Generated {
        manifest: "gateways/egressgateways.cloudnet.io.yaml",
        sources: "shared/src/gateway/mod.rs and shared/src/gateway/crd.rs",
        crd: cloudnet_shared::gateway::crd,
    },
];

/// A checked-in CRD. Cargo's runtime `CARGO_MANIFEST_DIR` comes first: a test binary reused
/// from another checkout through the shared target directory carries that checkout's
/// compile-time directory.
fn manifest_path(manifest: &str) -> PathBuf {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    dir.join("../manifests").join(manifest)
}

fn render(sources: &str, crd: &CustomResourceDefinition) -> String {
    let yaml = serde_saphyr::to_string(crd).expect("the CRD serialises to YAML");
    format!(
        "# Generated from {sources}; do not edit.\n\
         # Regenerate: CLOUDNET_UPDATE_MANIFESTS=1 cargo test -p cloudnet-shared --test crd_manifest\n\
         {yaml}"
    )
}

#[test]
fn checked_in_crds_match_the_types() {
    for Generated {
        manifest,
        sources,
        crd,
    } in CRDS
    {
        let generated = render(sources, &crd());
        let path = manifest_path(manifest);
        if std::env::var_os("CLOUDNET_UPDATE_MANIFESTS").is_some() {
            std::fs::write(&path, &generated).expect("write the CRD manifest");
            continue;
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
}

#[test]
fn rendered_manifests_parse_back_to_the_same_crds() {
    for Generated { sources, crd, .. } in CRDS {
        let parsed: CustomResourceDefinition =
            serde_saphyr::from_str(&render(sources, &crd())).expect("the manifest is a CRD");
        assert_eq!(parsed, crd());
    }
}
