//! Each cloud provider against its cloud: moto behind the fault proxy, the ARM and GCE fakes
//! checked against their published schemas, real Keystone and Neutron; and the fault proxy itself.
//!
//! One test binary for the tier: each file below is a module; they share nothing but the binary.

mod aws_batching;
mod aws_credentials;
mod aws_elastic_ip;
mod aws_provider;
mod azure_provider;
mod azure_public_ip;
mod batched_reads;
mod driver;
mod faultproxy_faults;
mod gcp_batching;
mod gcp_provider;
mod gcp_rules;
mod openstack_floating_ip;
mod openstack_provider;
mod openstack_token;
