//! The Kubernetes API permissions the reconciler's code uses, kept beside the code so that a new
//! call shows up here: `e2e-kind/tests/reconciler/rbac.rs` compares these lists with what the
//! shipped roles grant the ServiceAccount, as the real apiserver reports it, and fails on a
//! permission missing or extra: [`PERMISSIONS`] with `manifests/reconciler/base/rbac.yaml`, and
//! each front end's own with its component's role (granted only where it is enabled).

/// Where a permission is needed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// Cluster-scoped resources.
    Cluster,
    /// The controller's own namespace (`CONTROLLER_NAMESPACE`): the Lease, Secret and ConfigMap.
    ControllerNamespace,
    /// The namespace Events go to, [`crate::events::EVENT_NAMESPACE`].
    Events,
}

/// What the code does with one resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Permission {
    /// Where.
    pub scope: Scope,
    /// API group (`""` for core).
    pub group: &'static str,
    /// Resource, with `/subresource` when one.
    pub resource: &'static str,
    /// The verbs used.
    pub verbs: &'static [&'static str],
    /// The code only touches objects it names (a constant or a flag; lists and watches select
    /// them by `metadata.name`), so a role can grant these verbs for those names only.
    pub by_name: bool,
    /// Without it the reconciler works the same, less conveniently, and says so once in its log:
    /// OpenShift's network operator does not grant it (`e2e-kind/cno/rbac.yaml`).
    pub optional: bool,
}

/// Every permission the reconciler uses.
pub const PERMISSIONS: &[Permission] = &[
    // Watch caches (controller/mod.rs) and the egress-ipconfig annotation's merge patch
    // (controller/nodes.rs).
    Permission {
        scope: Scope::Cluster,
        group: "",
        resource: "nodes",
        verbs: &["list", "watch", "patch"],
        by_name: false,
        optional: false,
    },
    // Watch cache; the finalizer by merge patch; a re-read after a conflict.
    Permission {
        scope: Scope::Cluster,
        group: "cloud.network.openshift.io",
        resource: "cloudprivateipconfigs",
        verbs: &["get", "list", "watch", "patch"],
        by_name: false,
        optional: false,
    },
    Permission {
        scope: Scope::Cluster,
        group: "cloud.network.openshift.io",
        resource: "cloudprivateipconfigs/status",
        verbs: &["patch"],
        by_name: false,
        optional: false,
    },
    // The EgressPublicIP controller (controller/public/), while the opt-in CRD is installed:
    // its presence (a list of one), the watch cache, and the finalizer added and removed by
    // JSON patch (kube-runtime's finalizer helper; a status write cannot carry it, and
    // `egresspublicips/finalizers` authorizes nothing here). The webhook keeps spec immutable,
    // so this patch can change nothing an admin wrote. OpenShift's operator grants none of it:
    // without it public addresses are not managed, and nothing else changes.
    Permission {
        scope: Scope::Cluster,
        group: "cloudnet.io",
        resource: "egresspublicips",
        verbs: &["list", "watch", "patch"],
        by_name: false,
        optional: true,
    },
    Permission {
        scope: Scope::Cluster,
        group: "cloudnet.io",
        resource: "egresspublicips/status",
        verbs: &["patch"],
        by_name: false,
        optional: true,
    },
    // Leader election (leader/): read and replace by name.
    Permission {
        scope: Scope::ControllerNamespace,
        group: "coordination.k8s.io",
        resource: "leases",
        verbs: &["get", "list", "update"],
        by_name: true,
        optional: false,
    },
    // A standby's watch of the Lease, so that a released one is taken over at once rather than
    // at the next read (a retry period later).
    Permission {
        scope: Scope::ControllerNamespace,
        group: "coordination.k8s.io",
        resource: "leases",
        verbs: &["watch"],
        by_name: true,
        optional: true,
    },
    // The first replica ever creates the Lease; a create cannot be granted by name.
    Permission {
        scope: Scope::ControllerNamespace,
        group: "coordination.k8s.io",
        resource: "leases",
        verbs: &["create"],
        by_name: false,
        optional: false,
    },
    // Rotation watches (mount.rs), by field selector on the flags' names.
    Permission {
        scope: Scope::ControllerNamespace,
        group: "",
        resource: "secrets",
        verbs: &["list", "watch"],
        by_name: true,
        optional: false,
    },
    // The attachment ledger (engine/ledger.rs): its pages are listed when leading starts, created,
    // patched and re-read after a conflict; never deleted (emptied pages are reused). The
    // rotation watch of the cloud config ConfigMap (mount.rs) lists and watches within it.
    // Page names are not known before they are created, so none of it can be granted by name;
    // OpenShift's operator grants the upstream controller these verbs (and update) there.
    Permission {
        scope: Scope::ControllerNamespace,
        group: "",
        resource: "configmaps",
        verbs: &["get", "list", "watch", "create", "patch"],
        by_name: false,
        optional: false,
    },
    // controller/events.rs: created directly, and patched by kube's Recorder to fold a repeated warning.
    Permission {
        scope: Scope::Events,
        group: "events.k8s.io",
        resource: "events",
        verbs: &["create", "patch"],
        by_name: false,
        optional: true,
    },
];

/// What the Antrea front end (`--front-end antrea`, `frontend/antrea.rs`) uses besides
/// [`PERMISSIONS`]: granted by the component `manifests/reconciler/overlays/antrea` (the chart's
/// `reconciler.frontEnds.antrea.enabled`) only. Its Events on Egresses go where every Event goes,
/// already granted.
pub const ANTREA_PERMISSIONS: &[Permission] = &[
    // Watch caches of Antrea's objects (each slimmed to what is read).
    Permission {
        scope: Scope::Cluster,
        group: "crd.antrea.io",
        resource: "egresses",
        verbs: &["list", "watch"],
        by_name: false,
        optional: false,
    },
    Permission {
        scope: Scope::Cluster,
        group: "crd.antrea.io",
        resource: "externalippools",
        verbs: &["list", "watch"],
        by_name: false,
        optional: false,
    },
    // Its own CloudPrivateIPConfigs created and deleted (uid-preconditioned); the retarget's
    // patch, the 409's re-read and the watch are in [`PERMISSIONS`] already.
    Permission {
        scope: Scope::Cluster,
        group: "cloud.network.openshift.io",
        resource: "cloudprivateipconfigs",
        verbs: &["create", "delete"],
        by_name: false,
        optional: false,
    },
];

/// What the egress gateway front end (`--front-end egress-gateway`, `frontend/gateway/`) uses
/// besides [`PERMISSIONS`]: granted by the component
/// `manifests/reconciler/overlays/egress-gateway` (the chart's
/// `reconciler.frontEnds.egressGateway.enabled`) only. The active label comes off nodes by the
/// node patch of [`PERMISSIONS`]; its Events go where every Event goes.
pub const GATEWAY_PERMISSIONS: &[Permission] = &[
    // Its watch cache of gateways, and their status.
    Permission {
        scope: Scope::Cluster,
        group: "cloudnet.io",
        resource: "egressgateways",
        verbs: &["list", "watch"],
        by_name: false,
        optional: false,
    },
    Permission {
        scope: Scope::Cluster,
        group: "cloudnet.io",
        resource: "egressgateways/status",
        verbs: &["patch"],
        by_name: false,
        optional: false,
    },
    // Its own CloudPrivateIPConfigs created and deleted, as the Antrea front end's.
    Permission {
        scope: Scope::Cluster,
        group: "cloud.network.openshift.io",
        resource: "cloudprivateipconfigs",
        verbs: &["create", "delete"],
        by_name: false,
        optional: false,
    },
    // The node agents' heartbeat Leases (`cloudnet-node-<node>`), one watch of the namespace:
    // their names follow the nodes, so they cannot be granted by name.
    Permission {
        scope: Scope::ControllerNamespace,
        group: "coordination.k8s.io",
        resource: "leases",
        verbs: &["list", "watch"],
        by_name: false,
        optional: false,
    },
];
