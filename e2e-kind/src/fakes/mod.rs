//! The clouds and network pieces the tests and benchmarks run against: moto, real Keystone and
//! Neutron, the GCE and ARM fakes (checked against their published schemas), the fault proxy in
//! front of them, a forward proxy, a TCP forwarder that can cut a connection, and a fault proxy in
//! front of kube-apiserver.

pub mod apifaults;
#[cfg(feature = "azure")]
pub mod arm;
pub mod faultproxy;
pub mod form;
pub mod forwardproxy;
#[cfg(feature = "gcp")]
pub mod gce;
pub mod moto;
pub mod openstack;
pub mod serve;
pub mod tcpcut;
