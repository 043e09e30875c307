//! ServiceAccount tokens as a token minter issues them, each bound to a Secret of its own so
//! that deleting the Secret revokes the token.

use anyhow::{Context, Result};
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

/// A token of ServiceAccount `namespace/account`, valid `expiration_seconds` (kube-apiserver
/// issues no less than 600), for the API server's own audience, bound to Secret `holder`, created
/// now in `namespace`: deleting the Secret revokes the token.
pub async fn bound_token(
    admin: &Client,
    namespace: &str,
    account: &str,
    holder: &str,
    expiration_seconds: i64,
) -> Result<String> {
    let secret = Api::<Secret>::namespaced(admin.clone(), namespace)
        .create(
            &PostParams::default(),
            &Secret {
                metadata: ObjectMeta {
                    name: Some(holder.into()),
                    ..ObjectMeta::default()
                },
                ..Secret::default()
            },
        )
        .await
        .with_context(|| format!("creating Secret {namespace}/{holder}"))?;
    let request = TokenRequest {
        // No audiences: the API server's own, which is what it accepts.
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(expiration_seconds),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Secret".into()),
                name: Some(holder.into()),
                uid: secret.metadata.uid,
            }),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let answer = Api::<ServiceAccount>::namespaced(admin.clone(), namespace)
        .create_token_request(account, &PostParams::default(), &request)
        .await
        .with_context(|| format!("requesting a token of {namespace}/{account}"))?;
    answer
        .status
        .and_then(|status| status.token)
        .context("the TokenRequest returned no token")
}
