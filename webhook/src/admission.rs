//! AdmissionReview in, AdmissionReview out: parsing, the call into the shared rules, and the
//! response with its denial message, warnings or JSON patch.
//!
//! # Renaming on create (SPEC §3 rule 1)
//!
//! Verified on kube-apiserver 1.36.3 (`e2e-kind/tests/webhook/admission.rs`,
//! `raw_ipv6_names_are_renamed_to_the_canonical_name_on_create`): a mutating webhook **may**
//! replace `metadata.name` on CREATE. A POST to the collection (the name is not in the URL) of
//! `fc00:f853:ccd:e793::54` with the patch `[{"op":"replace","path":"/metadata/name",…}]` is
//! stored as `fc00.f853.0ccd.e793.0000.0000.0000.0054`, the response carries the new name, the
//! validating webhooks and the CRD schema then see the canonical name, and a second raw spelling of
//! the same IP fails with `AlreadyExists` — so uniqueness by name still holds. `/mutate` therefore
//! renames raw and non-canonical IPv6 names (with an admission warning saying so). IPv4 names with
//! leading zeros and IPv4-mapped IPv6 names are not renamed: the first is ambiguous (octal?), the
//! second names another family; `/validate` refuses both with the exact name to use.
//!
//! Anything that is not an AdmissionReview with a request and a uid is answered with HTTP 400:
//! without a uid there is nothing a well-formed response could refer to. A review of the wrong
//! kind, or of an object whose `spec.node` is not a string, gets a well-formed `bad_input` denial.

use cloudnet_shared::FRONT_END_LABEL;
use cloudnet_shared::codec::{NameError, decode_name};
use cloudnet_shared::egress::{
    EGRESS_ROUTER_GROUP, EGRESS_ROUTER_KIND, EgressRouterSpec, NAD_GROUP, NAD_KIND, RouterRef,
};
use cloudnet_shared::platform::Platform;
use cloudnet_shared::rules::egress_router_cni::{egress_router_entries, router_owner};
use cloudnet_shared::rules::{
    ClusterSnapshot, Denial, MismatchedNode, ObjectView, Operation, Rule, Verdict,
    check_object_claim, review, review_egress_router, review_nad,
};
use kube::core::DynamicObject;
use kube::core::admission::{self, AdmissionRequest, AdmissionResponse, AdmissionReview};

use crate::metrics::Outcome;

/// The API group of the reviewed resource.
const GROUP: &str = "cloud.network.openshift.io";
/// The kind of the reviewed resource.
const KIND: &str = "CloudPrivateIPConfig";

/// A body that is no usable AdmissionReview; answered with HTTP 400.
#[derive(Debug, thiserror::Error)]
pub enum BadRequest {
    /// Not JSON, or not shaped like an AdmissionReview.
    #[error("the body is not an AdmissionReview: {0}")]
    NotAReview(#[from] serde_json::Error),
    /// An AdmissionReview without `request`.
    #[error("the AdmissionReview has no request")]
    NoRequest,
    /// A request without `uid`.
    #[error("the AdmissionReview request has no uid")]
    NoUid,
}

/// One parsed admission request.
#[derive(Debug)]
pub struct Request(AdmissionRequest<DynamicObject>);

/// The answer to one request, ready to be serialised.
#[derive(Debug)]
pub struct Answer {
    /// The response review.
    pub review: AdmissionReview<DynamicObject>,
    /// What happened, for metrics.
    pub outcome: Outcome,
    /// The denying rule, if any.
    pub rule: Option<Rule>,
    /// The target node's annotation carries another cloud's capacity keys.
    pub mismatch: Option<MismatchedNode>,
}

/// Parses an AdmissionReview body.
pub fn parse(body: &[u8]) -> Result<Request, BadRequest> {
    let review: AdmissionReview<DynamicObject> = serde_json::from_slice(body)?;
    let request: AdmissionRequest<DynamicObject> =
        review.try_into().map_err(|_| BadRequest::NoRequest)?;
    if request.uid.is_empty() {
        return Err(BadRequest::NoUid);
    }
    Ok(Request(request))
}

impl Request {
    /// The request's uid, for logs.
    pub fn uid(&self) -> &str {
        &self.0.uid
    }

    /// The object name the request is about.
    pub fn name(&self) -> &str {
        self.0
            .object
            .as_ref()
            .and_then(|o| o.metadata.name.as_deref())
            .unwrap_or(&self.0.name)
    }

    /// The operation, in the shared rules' terms.
    pub fn operation(&self) -> Operation {
        match self.0.operation {
            admission::Operation::Create => Operation::Create,
            admission::Operation::Update => Operation::Update,
            admission::Operation::Delete => Operation::Delete,
            admission::Operation::Connect => Operation::Connect,
        }
    }

    /// Whether this is a dry run.
    pub fn dry_run(&self) -> bool {
        self.0.dry_run
    }

    /// The object's namespace (empty for cluster-scoped objects).
    pub fn namespace(&self) -> &str {
        self.0.namespace.as_deref().unwrap_or_default()
    }

    /// The request as kube-rs parsed it.
    pub(crate) fn inner(&self) -> &AdmissionRequest<DynamicObject> {
        &self.0
    }

    pub(crate) fn other_kind(&self, group: &str, kind: &str, resource: &str) -> Option<String> {
        let sent = &self.0.kind;
        (sent.group != group || sent.kind != kind).then(|| {
            format!(
                "this endpoint reviews {kind}.{group} only, but was sent a {}.{}; limit the webhook configuration's rules to {resource}",
                sent.kind, sent.group
            )
        })
    }

    fn wrong_kind(&self) -> Option<String> {
        let kind = &self.0.kind;
        (kind.group != GROUP || kind.kind != KIND).then(|| {
            format!(
                "this webhook reviews {KIND}.{GROUP} only, but was sent a {}.{}; limit the webhook configuration's rules to cloudprivateipconfigs",
                kind.kind, kind.group
            )
        })
    }
}

/// Runs the admission rules (the `/validate` endpoint). `gateways_known`: the EgressGateway
/// watch has listed, so a create of a gateway's IP can be told apart (otherwise that check is
/// skipped with a warning).
pub fn validate(
    request: &Request,
    cluster: &ClusterSnapshot,
    platform: Option<Platform>,
    gateways_known: bool,
) -> Answer {
    let req = &request.0;
    if let Some(message) = request.wrong_kind() {
        return deny(req, Rule::BadInput, message, Vec::new());
    }
    if req.sub_resource.is_some() {
        // Status and other subresources carry no name or spec change the rules care about, and
        // refusing a status write would block the reconciler.
        return allow(req, Vec::new());
    }
    let new = match req.object.as_ref().map(view).transpose() {
        Ok(new) => new,
        Err(message) => return deny(req, Rule::BadInput, message, Vec::new()),
    };
    // An old object whose spec is unreadable cannot match the new one, which is what we want:
    // the change is then reviewed in full.
    let old = req.old_object.as_ref().and_then(|o| view(o).ok());
    let mut verdict = review(request.operation(), new, old, cluster, platform);
    if let Some(new) = new
        && verdict.allowed()
        && request.operation() == Operation::Create
    {
        if gateways_known {
            let front_end = req
                .object
                .as_ref()
                .and_then(|o| o.metadata.labels.as_ref()?.get(FRONT_END_LABEL))
                .map(String::as_str);
            verdict.denial =
                check_object_claim(request.operation(), new.name, front_end, cluster).err();
        } else {
            verdict.warnings.push(format!(
                "the webhook has not listed the EgressGateways yet, so whether one claims {} was not checked; the reconciler reports a clash with a gateway's IP in its Events",
                new.name
            ));
        }
    }
    let mut answer = match verdict.denial {
        Some(denial) => deny(req, denial.rule, denial.message, verdict.warnings),
        None => allow(req, verdict.warnings),
    };
    answer.mismatch = verdict.mismatch;
    answer
}

/// The `/validate-egressrouter` endpoint: the EgressRouter rules and the address conflicts.
pub fn validate_egress_router(request: &Request, cluster: &ClusterSnapshot) -> Answer {
    let req = &request.0;
    if let Some(message) =
        request.other_kind(EGRESS_ROUTER_GROUP, EGRESS_ROUTER_KIND, "egressrouters")
    {
        return deny(req, Rule::BadInput, message, Vec::new());
    }
    if req.sub_resource.is_some() {
        return allow(req, Vec::new());
    }
    let object = RouterRef::egress_router(request.namespace(), request.name());
    let new = match req
        .object
        .as_ref()
        .map(|o| router_spec(&object, o))
        .transpose()
    {
        Ok(new) => new,
        Err(message) => return deny(req, Rule::BadInput, message, Vec::new()),
    };
    let old = req
        .old_object
        .as_ref()
        .and_then(|o| router_spec(&object, o).ok());
    let verdict = review_egress_router(
        request.operation(),
        &object,
        new.as_ref(),
        old.as_ref(),
        cluster,
    );
    answer(req, verdict)
}

/// For the `/validate-nad` endpoint: `Some` (allowed) when the NetworkAttachmentDefinition's
/// config is no egress-router configuration, which needs neither the caches nor the rules.
pub fn unrelated_nad(request: &Request) -> Option<Answer> {
    let req = &request.0;
    if request.other_kind(NAD_GROUP, NAD_KIND, "").is_some() {
        return None;
    }
    let ours = req.sub_resource.is_none()
        && matches!(request.operation(), Operation::Create | Operation::Update)
        && nad_config(req.object.as_ref()).is_some_and(|c| egress_router_entries(c).is_some());
    (!ours).then(|| allow(req, Vec::new()))
}

/// The `/validate-nad` endpoint: the egress-router CNI rules and the address conflicts.
pub fn validate_nad(
    request: &Request,
    cluster: &ClusterSnapshot,
    platform: Option<Platform>,
) -> Answer {
    let req = &request.0;
    if let Some(message) = request.other_kind(NAD_GROUP, NAD_KIND, "network-attachment-definitions")
    {
        return deny(req, Rule::BadInput, message, Vec::new());
    }
    if req.sub_resource.is_some() {
        return allow(req, Vec::new());
    }
    let (namespace, name) = (request.namespace(), request.name());
    let object = RouterRef::nad(namespace, name);
    let owners = req
        .object
        .as_ref()
        .and_then(|o| o.metadata.owner_references.as_deref())
        .unwrap_or_default();
    let owner = router_owner(namespace, name, owners);
    let verdict = review_nad(
        request.operation(),
        &object,
        &owner,
        nad_config(req.object.as_ref()),
        nad_config(req.old_object.as_ref()),
        cluster,
        platform,
    );
    answer(req, verdict)
}

fn nad_config(object: Option<&DynamicObject>) -> Option<&str> {
    object?.data.get("spec")?.get("config")?.as_str()
}

fn router_spec(object: &RouterRef, data: &DynamicObject) -> Result<EgressRouterSpec, String> {
    match data.data.get("spec") {
        None | Some(serde_json::Value::Null) => Ok(EgressRouterSpec::default()),
        Some(spec) => serde_json::from_value(spec.clone()).map_err(|error| {
            format!(
                "the spec of {object} is not an EgressRouter spec ({error}); follow the network.operator.openshift.io/v1 schema (install its CRD to have the API server check it)"
            )
        }),
    }
}

/// The review of one object of the kind `(group, kind, plural)` by its spec: another kind, or an
/// object `read` cannot read (its message says why), is refused as bad input; a status write
/// carries no spec change and passes; otherwise `review` decides from the object after and
/// before (an unreadable old object is `None`: the change is then reviewed in full).
pub(crate) fn review_spec<T>(
    request: &Request,
    (group, kind, plural): (&str, &str, &str),
    read: impl Fn(&DynamicObject) -> Result<T, String>,
    review: impl FnOnce(Operation, &str, Option<&T>, Option<&T>) -> Verdict,
) -> Answer {
    let req = request.inner();
    if let Some(message) = request.other_kind(group, kind, plural) {
        return deny(req, Rule::BadInput, message, Vec::new());
    }
    if req.sub_resource.is_some() {
        return answer(req, Verdict::allow());
    }
    let new = match req.object.as_ref().map(&read).transpose() {
        Ok(new) => new,
        Err(message) => return deny(req, Rule::BadInput, message, Vec::new()),
    };
    let old = req.old_object.as_ref().and_then(|o| read(o).ok());
    let verdict = review(
        request.operation(),
        request.name(),
        new.as_ref(),
        old.as_ref(),
    );
    answer(req, verdict)
}

pub(crate) fn answer(req: &AdmissionRequest<DynamicObject>, verdict: Verdict) -> Answer {
    match verdict.denial {
        Some(denial) => deny(req, denial.rule, denial.message, verdict.warnings),
        None => allow(req, verdict.warnings),
    }
}

/// The `/mutate` endpoint: renames a raw or non-canonical IPv6 name on create.
pub fn mutate(request: &Request) -> Answer {
    let req = &request.0;
    if request.wrong_kind().is_some()
        || req.sub_resource.is_some()
        || request.operation() != Operation::Create
    {
        // Denials are the validating endpoint's job; answering the same question twice would
        // only duplicate messages.
        return allow(req, Vec::new());
    }
    let Some(canonical) = rename_target(request.name()) else {
        return allow(req, Vec::new());
    };
    rename(req, request.name(), &canonical)
}

/// The canonical name to rename to: only for IPv6 written raw or non-canonically. An IPv4 name
/// with leading zeros is ambiguous (octal or decimal?) and an IPv4-mapped name means another
/// family, so those are left to the validating endpoint to refuse with the name to use.
fn rename_target(name: &str) -> Option<String> {
    match decode_name(name) {
        Err(NameError::RawIpv6 { canonical, .. }) => Some(canonical),
        Err(NameError::NonCanonical { canonical, .. })
            if decode_name(&canonical).is_ok_and(|ip| ip.is_ipv6()) =>
        {
            Some(canonical)
        }
        _ => None,
    }
}

fn rename(req: &AdmissionRequest<DynamicObject>, from: &str, to: &str) -> Answer {
    let patch = json_patch::Patch(vec![json_patch::PatchOperation::Replace(
        json_patch::ReplaceOperation {
            path: json_patch::jsonptr::PointerBuf::from_tokens(["metadata", "name"]),
            value: serde_json::Value::String(to.to_owned()),
        },
    )]);
    let warning = format!("renamed {from:?} to its canonical name {to:?}");
    match AdmissionResponse::from(req).with_patch(patch) {
        Ok(mut response) => {
            response.warnings = Some(vec![warning]);
            Answer {
                review: response.into_review(),
                outcome: Outcome::Patched,
                rule: None,
                mismatch: None,
            }
        }
        // Serialising a two-string patch cannot fail; if it ever did, the validating endpoint
        // still refuses the name with the one to use.
        Err(_) => allow(req, Vec::new()),
    }
}

fn view(object: &DynamicObject) -> Result<ObjectView<'_>, String> {
    let name = object.metadata.name.as_deref().unwrap_or_default();
    let spec_node = match object.data.get("spec").and_then(|spec| spec.get("node")) {
        None | Some(serde_json::Value::Null) => "",
        Some(serde_json::Value::String(node)) => node,
        Some(other) => {
            return Err(format!(
                "spec.node of {name:?} must be a node name (a string), not {other}; set spec.node to the target node's name"
            ));
        }
    };
    Ok(ObjectView { name, spec_node })
}

fn allow(req: &AdmissionRequest<DynamicObject>, warnings: Vec<String>) -> Answer {
    let mut response = AdmissionResponse::from(req);
    if !warnings.is_empty() {
        response.warnings = Some(warnings);
    }
    Answer {
        review: response.into_review(),
        outcome: Outcome::Allowed,
        rule: None,
        mismatch: None,
    }
}

pub(crate) fn deny(
    req: &AdmissionRequest<DynamicObject>,
    rule: Rule,
    message: String,
    warnings: Vec<String>,
) -> Answer {
    let message = Denial::new(rule, message).message;
    let mut response = AdmissionResponse::from(req).deny(message);
    // 403 with reason Forbidden is how kube-apiserver reports other admission refusals.
    response.result.code = 403;
    response.result.reason = "Forbidden".into();
    if !warnings.is_empty() {
        response.warnings = Some(warnings);
    }
    Answer {
        review: response.into_review(),
        outcome: Outcome::Denied,
        rule: Some(rule),
        mismatch: None,
    }
}
