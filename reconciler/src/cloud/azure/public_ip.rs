//! Azure public IPs that follow egress IPs (docs/public-ips.md, docs/clouds/azure.md): a public
//! IP sits on the ip-configuration holding the egress IP (`publicIPAddress.id`), which a move
//! deletes on one NIC and creates on another, so it is associated again after every move.
//!
//! The calls: a GET of the public IP resource (its tags, and `ipConfiguration.id`: where it sits),
//! and NIC PUTs like the egress IPs' own (the whole NIC with `If-Match: <etag>` as just read, the
//! operation followed to its end), so an engine update between our read and our write is never
//! overwritten: the PUT answers 412, a retryable conflict. The edits waiting on one NIC go in one
//! PUT ([`super::nic_edits`]); a PUT ARM refuses for a reason other than a transient one is made
//! again edit by edit, so the refusal reaches only the binding it is about. Azure refuses a
//! public IP on two ip-configurations, so one sitting elsewhere is taken off there first; undoing
//! clears it only on the ip-configuration we set. ARM checks `publicIPAddresses/join/action` on the public IP for
//! every NIC PUT that carries it (a linked access check), and a refusal names the action.

use std::net::IpAddr;

use azure_core::Url;
use azure_mgmt_network::package_2024_03::models::{
    NetworkInterface, NetworkInterfaceIpConfiguration, PublicIpAddress,
};
use cloudnet_shared::Platform;
use cloudnet_shared::public_ip::{MARKER_PLAIN, MARKER_VALUE, PublicId};

use async_trait::async_trait;

use super::{AzureProvider, NETWORK_API_VERSION, SeenNic, lock, nic};
use crate::cloud::public_ip::{
    Association, PublicAddress, PublicIpError, PublicIps, require_marker,
};
use crate::cloud::{CloudError, ErrorKind};

/// How messages name the cloud.
const CLOUD: &str = "Azure";
/// The public IP read (`PublicIPAddresses_Get`).
const GET_PUBLIC_IP: &str = "PublicIPAddresses_Get";
/// The NIC read and write.
const GET_NIC: &str = "NetworkInterfaces_Get";
const PUT_NIC: &str = "NetworkInterfaces_CreateOrUpdate";
/// The permissions a refusal may name, the public IP's own first: ARM's linked access refusal
/// names the NIC write it allowed beside the join it refused.
const PERMISSIONS: [&str; 4] = [
    "Microsoft.Network/publicIPAddresses/join/action",
    "Microsoft.Network/publicIPAddresses/read",
    "Microsoft.Network/networkInterfaces/write",
    "Microsoft.Network/networkInterfaces/read",
];

/// The public-address error for `error` of call `action` on public IP `id`: an authorization
/// refusal names the permission, an unknown public IP is not found, the rest keeps ARM's
/// classification.
fn classified(action: &'static str, id: &str, error: CloudError) -> PublicIpError {
    // ARM's codes `AuthorizationFailed` and `LinkedAuthorizationFailed`, as `errors::classify`
    // writes them.
    let refused = error.message.contains("AuthorizationFailed (403)");
    match PERMISSIONS.into_iter().find(|p| error.message.contains(p)) {
        Some(permission) if refused => PublicIpError::MissingPermission {
            cloud: CLOUD,
            action,
            permission,
        },
        _ if action == GET_PUBLIC_IP && error.kind == ErrorKind::NotFound => {
            PublicIpError::NotFound {
                cloud: CLOUD,
                id: id.to_owned(),
            }
        }
        _ => PublicIpError::Cloud(error),
    }
}

/// Whether two ARM ids name the same resource (ARM ids are case-insensitive).
fn same(a: &str, b: &str) -> bool {
    a.trim_end_matches('/')
        .eq_ignore_ascii_case(b.trim_end_matches('/'))
}

/// Whether `interface` is a resource id (`/subscriptions/...`, the key in any case, as ARM
/// accepts it) rather than a NIC name.
fn is_resource_id(interface: &str) -> bool {
    const PREFIX: &str = "/subscriptions/";
    interface
        .get(..PREFIX.len())
        .is_some_and(|head| head.eq_ignore_ascii_case(PREFIX))
}

/// The NIC id and configuration name of an ip-configuration id
/// (`<nic id>/ipConfigurations/<name>`).
fn split_config_id(id: &str) -> Option<(&str, &str)> {
    let at = id.to_ascii_lowercase().rfind("/ipconfigurations/")?;
    let name = &id[at + "/ipConfigurations/".len()..];
    (!name.is_empty() && !name.contains('/')).then_some((&id[..at], name))
}

/// The public IP a configuration holds, if any.
fn public_ip_of(config: &NetworkInterfaceIpConfiguration) -> Option<&str> {
    config
        .properties
        .as_ref()?
        .public_ip_address
        .as_ref()?
        .resource
        .id
        .as_deref()
}

/// Sets (or clears, with `None`) the public IP of `config`.
fn set_public_ip(config: &mut NetworkInterfaceIpConfiguration, id: Option<&str>) {
    if let Some(properties) = config.properties.as_mut() {
        properties.public_ip_address = id.map(|id| {
            let mut public = PublicIpAddress::new();
            public.resource.id = Some(id.to_owned());
            public
        });
    }
}

fn configs_mut(nic: &mut NetworkInterface) -> &mut [NetworkInterfaceIpConfiguration] {
    nic.properties
        .as_mut()
        .map(|p| p.ip_configurations.as_mut_slice())
        .unwrap_or_default()
}

/// The marker: a tag named [`MARKER_PLAIN`] (tag names are case-insensitive in Azure) with the
/// value [`MARKER_VALUE`].
fn is_marked(public: &PublicIpAddress) -> bool {
    public
        .resource
        .tags
        .as_ref()
        .and_then(serde_json::Value::as_object)
        .is_some_and(|tags| {
            tags.iter().any(|(name, value)| {
                name.eq_ignore_ascii_case(MARKER_PLAIN) && value.as_str() == Some(MARKER_VALUE)
            })
        })
}

/// One public-IP change of one NIC.
pub(super) enum Edit {
    /// `public` onto the ip-configuration holding `private_ip`, and off the NIC's others.
    Set { public: String, private_ip: IpAddr },
    /// `public` off configuration `config` if it still holds it (and `private_ip`, when given).
    Clear {
        public: String,
        config: String,
        private_ip: Option<IpAddr>,
    },
}

/// What an edit made.
#[derive(Clone, Debug)]
pub(super) enum Done {
    /// The association `Set` made (or found).
    Set(Association),
    /// `Clear` left the public IP off the configuration.
    Cleared,
}

/// The answer to an edit.
pub(super) type EditAnswer = Result<Done, PublicIpError>;

/// An edit waiting on its NIC.
type NicEdit = super::nic_edits::Waiting<Edit, EditAnswer>;

impl Edit {
    /// The public IP it is about.
    fn public(&self) -> &str {
        match self {
            Self::Set { public, .. } | Self::Clear { public, .. } => public,
        }
    }

    /// Makes the edit in `body`, NIC `nic_id`: what it made and whether `body` changed.
    fn apply(
        &self,
        nic_id: &str,
        body: &mut NetworkInterface,
    ) -> Result<(Done, bool), PublicIpError> {
        let name = body.resource.name.clone().unwrap_or_default();
        let configs = configs_mut(body);
        match self {
            Self::Set { public, private_ip } => {
                let Some(at) = configs
                    .iter()
                    .position(|c| nic::config_address(c) == Some(*private_ip))
                else {
                    // The engine attaches before the binding acts; a move's attach may still
                    // be running.
                    return Err(CloudError::retryable(format!(
                        "{private_ip} is on no ip-configuration of network interface {name} yet"
                    ))
                    .into());
                };
                let config_name = configs[at].name.clone().unwrap_or_default();
                let made = Association {
                    id: configs[at]
                        .sub_resource
                        .id
                        .clone()
                        .unwrap_or_else(|| format!("{nic_id}/ipConfigurations/{config_name}")),
                    interface: name,
                    private_ip: Some(*private_ip),
                };
                let mut changed = false;
                for (i, config) in configs.iter_mut().enumerate() {
                    let holds = public_ip_of(config).is_some_and(|p| same(p, public));
                    if i == at && !holds {
                        set_public_ip(config, Some(public));
                        changed = true;
                    } else if i != at && holds {
                        set_public_ip(config, None);
                        changed = true;
                    }
                }
                Ok((Done::Set(made), changed))
            }
            Self::Clear {
                public,
                config,
                private_ip,
            } => {
                let target = configs.iter_mut().find(|c| {
                    c.name
                        .as_deref()
                        .is_some_and(|n| n.eq_ignore_ascii_case(config))
                        && public_ip_of(c).is_some_and(|p| same(p, public))
                        && private_ip.is_none_or(|ip| nic::config_address(c) == Some(ip))
                });
                let changed = target.is_some();
                if let Some(target) = target {
                    set_public_ip(target, None);
                }
                Ok((Done::Cleared, changed))
            }
        }
    }
}

impl AzureProvider {
    /// The NIC `interface` names: a NIC resource id as it is, a NIC name (the engine's view of a
    /// VM's interface) by the NICs this provider has read. Refused when no NIC read so far has
    /// that name, or more than one has (two resource groups).
    fn nic_id_of(&self, interface: &str) -> Result<String, CloudError> {
        if is_resource_id(interface) {
            return Ok(interface.to_owned());
        }
        let mut found: Vec<String> = Vec::new();
        let seen_ids = lock(&self.nics)
            .values()
            .filter(|seen| {
                seen.nic
                    .resource
                    .name
                    .as_deref()
                    .is_some_and(|name| name.eq_ignore_ascii_case(interface))
            })
            .map(|seen| seen.id.clone())
            .collect::<Vec<_>>();
        let primary_ids = lock(&self.vm_nics)
            .values()
            .filter(|id| {
                id.rsplit('/')
                    .next()
                    .is_some_and(|name| name.eq_ignore_ascii_case(interface))
            })
            .cloned()
            .collect::<Vec<_>>();
        for id in seen_ids.into_iter().chain(primary_ids) {
            if !found.iter().any(|f| same(f, &id)) {
                found.push(id);
            }
        }
        match found.as_slice() {
            [one] => Ok(one.clone()),
            [] => Err(CloudError::retryable(format!(
                "network interface {interface} has not been read yet"
            ))),
            _ => Err(CloudError::permanent(format!(
                "network interface {interface}: {} NICs of that name ({}); give the NIC's resource id",
                found.len(),
                found.join(", ")
            ))),
        }
    }

    /// `after` (NIC `id` as a PUT of ours left it) becomes what the engine's next change starts
    /// from, so its `If-Match` is current instead of costing a 412.
    fn refresh(&self, id: &str, after: &NetworkInterface) {
        for seen in lock(&self.nics).values_mut() {
            if same(&seen.id, id) {
                seen.nic = after.clone();
            }
        }
    }

    /// Makes `edit` on NIC `nic_id`, in one PUT with the other edits waiting on that NIC.
    async fn edit_nic(&self, nic_id: &str, edit: Edit) -> Result<Done, PublicIpError> {
        let (ticket, answer) = self.nic_edits.queue(nic_id, edit);
        {
            let _turn = ticket.turn().await;
            if ticket.any_waiting() {
                // Read first: edits that arrive during the read go in this PUT too.
                let read = self.get_nic(nic_id).await;
                let batch = ticket.take();
                self.write_edits(nic_id, read, batch, true).await;
            }
        }
        drop(ticket);
        answer.await.unwrap_or_else(|_| {
            Err(CloudError::retryable(format!(
                "the edit of network interface {nic_id} ended before it was written"
            ))
            .into())
        })
    }

    /// Writes `batch` over NIC `nic_id` as `read` found it, in one PUT, and answers each edit;
    /// with `split`, a refused PUT of several edits is made again one edit at a time.
    async fn write_edits(
        &self,
        nic_id: &str,
        read: Result<NetworkInterface, CloudError>,
        batch: Vec<NicEdit>,
        split: bool,
    ) {
        let nic = match read {
            Ok(nic) => nic,
            Err(e) => {
                for (edit, reply) in batch {
                    let answer = match edit {
                        // The NIC went, and the association with it.
                        Edit::Clear { .. } if e.kind == ErrorKind::NotFound => Ok(Done::Cleared),
                        _ => Err(classified(GET_NIC, edit.public(), e.clone())),
                    };
                    let _ = reply.send(answer);
                }
                return;
            }
        };
        let seen = SeenNic {
            id: nic_id.to_owned(),
            nic,
        };
        let mut body = seen.nic.clone();
        let mut made = Vec::with_capacity(batch.len());
        for (edit, reply) in batch {
            match edit.apply(&seen.id, &mut body) {
                Ok((done, changed)) => made.push((edit, reply, done, changed)),
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            }
        }
        let changing = made.iter().filter(|(.., changed)| *changed).count();
        if changing == 0 {
            for (_, reply, done, _) in made {
                let _ = reply.send(Ok(done));
            }
            return;
        }
        match self.put_nic(&seen, &body).await {
            Ok(after) => {
                self.refresh(&seen.id, &after);
                for (_, reply, done, _) in made {
                    let _ = reply.send(Ok(done));
                }
            }
            Err(e) if split && changing > 1 && !PublicIpError::Cloud(e.clone()).is_transient() => {
                // One edit's refusal (a missing join permission, a public IP in use) must not
                // fail the others, nor be reported on them. An edit that changed nothing stands
                // as it was found: the refused PUT changed nothing either.
                for (edit, reply, done, changed) in made {
                    if !changed {
                        let _ = reply.send(Ok(done));
                        continue;
                    }
                    let read = self.get_nic(nic_id).await;
                    Box::pin(self.write_edits(nic_id, read, vec![(edit, reply)], false)).await;
                }
            }
            Err(e) => {
                for (edit, reply, ..) in made {
                    let _ = reply.send(Err(classified(PUT_NIC, edit.public(), e.clone())));
                }
            }
        }
    }

    /// Configuration `config` of NIC `nic_id` as the NIC shows it: from the NIC as last seen when
    /// that has the configuration, else read now.
    async fn config_of(
        &self,
        nic_id: &str,
        config: &str,
        public: &str,
    ) -> Result<SeenConfig, PublicIpError> {
        let find = |nic: &NetworkInterface| {
            nic::configs(nic)
                .iter()
                .find(|c| {
                    c.name
                        .as_deref()
                        .is_some_and(|n| n.eq_ignore_ascii_case(config))
                })
                .map(|c| SeenConfig {
                    id: c.sub_resource.id.clone(),
                    interface: nic.resource.name.clone().unwrap_or_default(),
                    private_ip: nic::config_address(c),
                })
        };
        let cached = lock(&self.nics)
            .values()
            .find(|seen| same(&seen.id, nic_id))
            .and_then(|seen| find(&seen.nic));
        if let Some(found) = cached {
            return Ok(found);
        }
        let gone = || SeenConfig {
            id: None,
            interface: nic_id.rsplit('/').next().unwrap_or_default().to_owned(),
            private_ip: None,
        };
        match self.get_nic(nic_id).await {
            Ok(nic) => Ok(find(&nic).unwrap_or_else(gone)),
            Err(e) if e.kind == ErrorKind::NotFound => Ok(gone()),
            Err(e) => Err(classified(GET_NIC, public, e)),
        }
    }
}

/// An ip-configuration as its NIC shows it.
struct SeenConfig {
    /// Its resource id as the NIC spells it, when the NIC has it.
    id: Option<String>,
    /// The NIC's name.
    interface: String,
    /// The private IP it holds.
    private_ip: Option<IpAddr>,
}

#[async_trait]
impl PublicIps for AzureProvider {
    async fn public_address(&self, id: &str) -> Result<PublicAddress, PublicIpError> {
        // Admission admits only this shape; anything else never reaches a URL.
        let Ok(PublicId::AzurePublicIp(path)) = PublicId::parse(id) else {
            return Err(PublicIpError::NotFound {
                cloud: CLOUD,
                id: id.to_owned(),
            });
        };
        let url: Url = self.arm.url(&path, NETWORK_API_VERSION)?;
        let what = format!("public IP {}", path.rsplit('/').next().unwrap_or_default());
        let answer = self
            .get(&url, &what)
            .await
            .map_err(|e| classified(GET_PUBLIC_IP, id, e))?;
        let public: PublicIpAddress = serde_json::from_slice(&answer.body)
            .map_err(|e| CloudError::retryable(format!("GET {what}: undecodable answer: {e}")))?;
        let properties = public.properties.as_deref();
        let sits_on = properties
            .and_then(|p| p.ip_configuration.as_deref())
            .and_then(|c| c.sub_resource.id.clone());
        let association = match sits_on.as_deref().and_then(split_config_id) {
            Some((nic_id, config)) => {
                let seen = self.config_of(nic_id, config, id).await?;
                Some(Association {
                    // The configuration's id as its NIC spells it, as `associate` records it:
                    // ARM often writes the public IP's reference with another case of the
                    // resource group than the NIC's own id, and an id that changed spelling
                    // between the association and a later read would no longer be recognised
                    // as ours (nor would the status stay still).
                    id: seen.id.or_else(|| sits_on.clone()).unwrap_or_default(),
                    interface: seen.interface,
                    private_ip: seen.private_ip,
                })
            }
            None => None,
        };
        Ok(PublicAddress {
            id: public.resource.id.clone().unwrap_or_else(|| id.to_owned()),
            address: properties
                .and_then(|p| p.ip_address.as_deref())
                .and_then(|ip| ip.parse().ok()),
            marked: is_marked(&public),
            association,
        })
    }

    async fn associate(
        &self,
        address: &PublicAddress,
        interface: &str,
        private_ip: IpAddr,
    ) -> Result<Association, PublicIpError> {
        require_marker(address, Platform::Azure)?;
        let nic_id = self.nic_id_of(interface)?;
        // Azure refuses a public IP on two ip-configurations: off another NIC's first (one of
        // this NIC's is cleared in the same PUT below).
        if let Some(current) = &address.association
            && let Some((other, config)) = split_config_id(&current.id)
            && !same(other, &nic_id)
        {
            self.edit_nic(
                other,
                Edit::Clear {
                    public: address.id.clone(),
                    config: config.to_owned(),
                    private_ip: None,
                },
            )
            .await?;
        }
        match self
            .edit_nic(
                &nic_id,
                Edit::Set {
                    public: address.id.clone(),
                    private_ip,
                },
            )
            .await?
        {
            Done::Set(made) => Ok(made),
            Done::Cleared => Err(CloudError::permanent(
                "a public IP's association came back as its removal".to_owned(),
            )
            .into()),
        }
    }

    async fn disassociate(&self, id: &str, association: &Association) -> Result<(), PublicIpError> {
        let Some((nic_id, config)) = split_config_id(&association.id) else {
            return Ok(());
        };
        self.edit_nic(
            nic_id,
            Edit::Clear {
                public: id.to_owned(),
                config: config.to_owned(),
                private_ip: association.private_ip,
            },
        )
        .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const NIC: &str =
        "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/networkInterfaces/n";

    #[test]
    fn an_ip_configuration_id_splits_into_nic_and_name() {
        let id = format!("{NIC}/ipConfigurations/w_10.0.0.5");
        assert_eq!(split_config_id(&id), Some((NIC, "w_10.0.0.5")));
        let upper = format!("{NIC}/IPCONFIGURATIONS/c");
        assert_eq!(split_config_id(&upper), Some((NIC, "c")));
        assert_eq!(split_config_id(NIC), None);
        assert_eq!(split_config_id(&format!("{NIC}/ipConfigurations/")), None);
        assert!(same(&NIC.to_uppercase(), NIC));
    }

    #[test]
    fn a_nic_id_in_any_case_is_an_id_and_a_name_is_not() {
        assert!(is_resource_id(NIC));
        assert!(is_resource_id(&NIC.to_uppercase()));
        assert!(!is_resource_id("n"));
        assert!(!is_resource_id("/subscriptions"));
        assert!(!is_resource_id("ß/subscriptions/s"));
    }

    #[test]
    fn the_marker_is_the_tag_with_the_value_true() {
        let tagged = |tags: serde_json::Value| {
            let mut public = PublicIpAddress::new();
            public.resource.tags = Some(tags);
            is_marked(&public)
        };
        assert!(tagged(
            serde_json::json!({ "cloudnet-egress-public-ip": "true" })
        ));
        assert!(tagged(
            serde_json::json!({ "Cloudnet-Egress-Public-IP": "true" })
        ));
        assert!(!tagged(
            serde_json::json!({ "cloudnet-egress-public-ip": "True" })
        ));
        assert!(!tagged(
            serde_json::json!({ "cloudnet-egress-public-ip": "false" })
        ));
        assert!(!tagged(serde_json::json!({})));
        assert!(!is_marked(&PublicIpAddress::new()));
    }

    #[test]
    fn a_refusal_names_the_permission_it_lacks() {
        let refusal = |code: &str, message: &str| {
            crate::cloud::azure::errors::classify(
                "PUT",
                "network interface n",
                403,
                Some(&crate::cloud::azure::errors::ArmError {
                    code: code.into(),
                    message: message.into(),
                }),
            )
        };
        let linked = refusal(
            "LinkedAuthorizationFailed",
            "The client has permission to perform action 'Microsoft.Network/networkInterfaces/write' on scope 'n'; however, it does not have permission to perform action 'Microsoft.Network/publicIPAddresses/join/action' on the linked scope(s) 'p'.",
        );
        assert_eq!(
            classified(PUT_NIC, "p", linked),
            PublicIpError::MissingPermission {
                cloud: "Azure",
                action: PUT_NIC,
                permission: "Microsoft.Network/publicIPAddresses/join/action",
            }
        );
        let read = refusal(
            "AuthorizationFailed",
            "does not have authorization to perform action 'Microsoft.Network/publicIPAddresses/read' over scope 'p'",
        );
        assert!(matches!(
            classified(GET_PUBLIC_IP, "p", read),
            PublicIpError::MissingPermission {
                permission: "Microsoft.Network/publicIPAddresses/read",
                ..
            }
        ));
        let gone = CloudError::not_found("GET public IP p: ResourceNotFound (404): gone");
        assert!(matches!(
            classified(GET_PUBLIC_IP, "p", gone.clone()),
            PublicIpError::NotFound { .. }
        ));
        assert!(matches!(
            classified(GET_NIC, "p", gone),
            PublicIpError::Cloud(_)
        ));
    }
}
