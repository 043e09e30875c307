//! An in-process cloud for tests, the demo and the benchmark.
//!
//! It keeps the same promises a real cloud keeps (subnet membership, capacity per bucket, "already
//! attached" is fine) and checks the one promise the reconciler must keep: an IP is never attached
//! to two VMs at once, and, when the provider asks for per-node serialisation, no two mutations of
//! one VM overlap. A broken promise is recorded as a violation and logged at error level; tests
//! assert [`MemoryCloud::violations`] is empty.
//!
//! Faults can be injected per operation and VM ([`MemoryCloud::inject`]): an error, a panic, a
//! call that never answers, a call held until the test lets it go, and the "applied, reply lost"
//! pair — the change is made, then the caller gets an error or no answer at all, as when a
//! process dies or times out mid-call.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use cloudnet_shared::platform::bucket_for;
use cloudnet_shared::{Capacity, Platform};
use ipnet::{Ipv4Net, Ipv6Net};

use super::pace::{Rate, Spend, TokenBucket};
use super::{
    Change, CloudError, CloudProvider, ErrorKind, InstanceId, NodeEgress, NodeTarget, ProviderNeeds,
};

/// The providerID scheme of memory VMs: `memory:///<instance>`.
pub const PROVIDER_ID_PREFIX: &str = "memory:///";

/// The providerID of the memory VM `instance`.
pub fn provider_id(instance: &str) -> String {
    format!("{PROVIDER_ID_PREFIX}{instance}")
}

/// Most VMs one read call takes unless configured otherwise: like EC2's DescribeInstances.
pub const MAX_READ_BATCH: usize = 1000;

/// A cloud operation, as recorded in the call log and targeted by injected faults.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// [`CloudProvider::resolve`].
    Resolve,
    /// The additions of a [`CloudProvider::apply`] call (a call that adds and removes is logged
    /// as an `Attach` and a `Detach` record).
    Attach,
    /// The removals of a [`CloudProvider::apply`] call.
    Detach,
    /// [`CloudProvider::move_ips`].
    Move,
    /// One VM read: a [`CloudProvider::egress_config`] call, or one VM of an
    /// [`CloudProvider::egress_configs`] call (counted, not logged on its own; a fault on it
    /// fails that VM alone).
    EgressConfig,
    /// One [`CloudProvider::egress_configs`] call, whatever its number of VMs (logged with the
    /// VMs' instances joined by commas; a fault on it fails every VM of the call).
    EgressConfigs,
}

impl Op {
    /// Whether the operation changes the cloud.
    pub const fn is_mutation(self) -> bool {
        matches!(self, Self::Attach | Self::Detach | Self::Move)
    }
}

/// One call as the cloud saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    /// The operation.
    pub op: Op,
    /// The instance acted on (for a move, the source).
    pub instance: String,
    /// The IPs of the call, in the order given.
    pub ips: Vec<IpAddr>,
    /// Whether the engine passed its cached view of the interface ([`CloudProvider::apply`]).
    pub with_view: bool,
}

/// A memory VM's configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmSpec {
    /// Interface name reported in the egress config.
    pub interface: String,
    /// IPv4 subnet of the primary interface.
    pub ipv4_subnet: Option<Ipv4Net>,
    /// IPv6 subnet of the primary interface.
    pub ipv6_subnet: Option<Ipv6Net>,
    /// Cloud limit per bucket (counting the primary addresses, as EC2 does).
    pub capacity: Capacity,
    /// The VM's own addresses on the interface.
    pub primary: Vec<IpAddr>,
}

impl VmSpec {
    /// A VM in `10.0.0.0/8` with `capacity` shared addresses and primary address `primary`.
    pub fn ipv4(primary: IpAddr, capacity: i64) -> Self {
        Self {
            interface: "eth0".into(),
            ipv4_subnet: "10.0.0.0/8".parse().ok(),
            ipv6_subnet: "fd00::/64".parse().ok(),
            capacity: Capacity {
                ip: Some(capacity),
                ..Capacity::default()
            },
            primary: vec![primary],
        }
    }
}

#[derive(Debug)]
struct Vm {
    spec: VmSpec,
    attached: BTreeSet<IpAddr>,
    in_flight: usize,
}

/// What an injected fault does to the call it hits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FaultAction {
    /// Fail at once with this error; nothing changes.
    Fail(CloudError),
    /// Panic inside the call, after the cloud's latency; nothing changes.
    Panic,
    /// Never answer; nothing changes (the caller's deadline or death ends the call).
    Hang,
    /// Answer normally once the gate is opened: a call in flight for exactly as long as the
    /// test needs, where a latency would be a guess.
    Hold(Gate),
    /// Apply the change, then fail with this error: the reply was lost on its way back.
    ApplyThenFail(CloudError),
    /// Apply the change, then never answer: the caller dies or gives up mid-call.
    ApplyThenHang,
}

/// Holds the calls of a [`FaultAction::Hold`] until [`Gate::open`]; clones share it.
#[derive(Clone, Debug)]
pub struct Gate(Arc<tokio::sync::Semaphore>);

impl Default for Gate {
    fn default() -> Self {
        Self(Arc::new(tokio::sync::Semaphore::new(0)))
    }
}

impl Gate {
    /// Lets every held call, and every later one, go on.
    pub fn open(&self) {
        self.0.close();
    }

    /// Returns once the gate is open (a closed semaphore refuses every acquire at once).
    async fn passed(&self) {
        let _refused = self.0.acquire().await;
    }
}

impl PartialEq for Gate {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Gate {}

#[derive(Debug)]
struct Fault {
    op: Op,
    instance: Option<String>,
    remaining: Option<usize>,
    action: FaultAction,
}

#[derive(Debug, Default)]
struct State {
    vms: BTreeMap<String, Vm>,
    owner: HashMap<IpAddr, String>,
    calls: Vec<Call>,
    faults: Vec<Fault>,
    violations: Vec<String>,
    forgotten: Vec<InstanceId>,
}

/// Settings of a [`MemoryCloud`].
#[derive(Clone, Debug)]
pub struct MemoryConfig {
    /// How long every call takes.
    pub latency: Duration,
    /// How long a mutating call spends before it takes its write token: a real provider reads
    /// the VM first, and the lanes record the batch in the ledger (an API write) before either.
    pub before_write: Duration,
    /// Whether the cloud demands per-node serialisation (overlapping mutations are violations).
    pub serialize_per_node: bool,
    /// The largest batch the cloud accepts.
    pub max_batch: usize,
    /// The platform whose capacity model the VMs follow (`None`: the capacity keys decide).
    pub platform: Option<Platform>,
    /// Keep every call in the log (the benchmark turns this off to measure memory honestly).
    pub record_calls: bool,
    /// Create a VM with this spec for any instance [`CloudProvider::resolve`] is asked about.
    pub auto_vm: Option<VmSpec>,
    /// Pace of mutating calls, as a provider paces itself for a real cloud's rate limit.
    pub write_rate: Rate,
    /// Most VMs one [`CloudProvider::egress_configs`] call reads (1: the engine reads one VM
    /// at a time).
    pub max_read_batch: usize,
    /// Read the VM (one [`Op::EgressConfig`]) before additions not ours unless the change's
    /// view was read lately, as EC2's provider does ([`ProviderNeeds::reads_before_adding`]).
    pub reads_before_adding: bool,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            latency: Duration::ZERO,
            before_write: Duration::ZERO,
            serialize_per_node: true,
            max_batch: 50,
            platform: None,
            record_calls: true,
            auto_vm: None,
            write_rate: Rate::UNLIMITED,
            max_read_batch: MAX_READ_BATCH,
            reads_before_adding: false,
        }
    }
}

/// The in-process cloud. Cheap to clone; clones share state.
#[derive(Clone, Debug)]
pub struct MemoryCloud {
    config: MemoryConfig,
    state: Arc<Mutex<State>>,
    counters: Arc<Mutex<HashMap<Op, u64>>>,
    writes: Arc<TokenBucket>,
    mutating_calls: Arc<Mutex<u64>>,
}

impl Default for MemoryCloud {
    fn default() -> Self {
        Self::new(MemoryConfig::default())
    }
}

impl MemoryCloud {
    /// An empty cloud with `config`.
    pub fn new(config: MemoryConfig) -> Self {
        Self {
            writes: Arc::new(TokenBucket::new(config.write_rate)),
            config,
            state: Arc::default(),
            counters: Arc::default(),
            mutating_calls: Arc::default(),
        }
    }

    /// How many mutating calls were made (a call that adds and removes counts once).
    pub fn mutating_calls(&self) -> u64 {
        *self
            .mutating_calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panicking test thread must not hide later violations behind a poisoned lock.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Creates (or replaces) the VM `instance`.
    pub fn add_vm(&self, instance: &str, spec: VmSpec) {
        let mut state = self.state();
        state.vms.insert(
            instance.to_owned(),
            Vm {
                spec,
                attached: BTreeSet::new(),
                in_flight: 0,
            },
        );
    }

    /// The secondary IPs attached to `instance`.
    pub fn attached_to(&self, instance: &str) -> BTreeSet<IpAddr> {
        self.state()
            .vms
            .get(instance)
            .map(|vm| vm.attached.clone())
            .unwrap_or_default()
    }

    /// The instance `ip` is attached to, if any.
    pub fn owner_of(&self, ip: IpAddr) -> Option<String> {
        self.state().owner.get(&ip).cloned()
    }

    /// Every attached IP and its instance.
    pub fn all_attached(&self) -> BTreeMap<IpAddr, String> {
        self.state()
            .owner
            .iter()
            .map(|(ip, vm)| (*ip, vm.clone()))
            .collect()
    }

    /// Removes `ip` from `instance` behind the reconciler's back (drift).
    pub fn remove_out_of_band(&self, instance: &str, ip: IpAddr) {
        let mut state = self.state();
        if let Some(vm) = state.vms.get_mut(instance) {
            vm.attached.remove(&ip);
        }
        if state.owner.get(&ip).map(String::as_str) == Some(instance) {
            state.owner.remove(&ip);
        }
    }

    /// Puts `ip` on `instance` behind the reconciler's back: another controller or tool, or a
    /// call held in a network that lands now.
    pub fn add_out_of_band(&self, instance: &str, ip: IpAddr) {
        let mut state = self.state();
        if let Some(vm) = state.vms.get_mut(instance) {
            vm.attached.insert(ip);
            state.owner.insert(ip, instance.to_owned());
        }
    }

    /// Makes the next `times` calls of `op` (on `instance`, or on any VM) fail with `error`.
    pub fn fail_next(&self, op: Op, instance: Option<&str>, times: usize, error: CloudError) {
        self.inject(op, instance, Some(times), FaultAction::Fail(error));
    }

    /// Makes every call of `op` on `instance` fail with `error` until [`Self::clear_faults`].
    pub fn fail_always(&self, op: Op, instance: &str, error: CloudError) {
        self.inject(op, Some(instance), None, FaultAction::Fail(error));
    }

    /// Holds the next call of `op` on `instance` until the gate returned is opened.
    pub fn hold_next(&self, op: Op, instance: &str) -> Gate {
        let gate = Gate::default();
        self.inject(op, Some(instance), Some(1), FaultAction::Hold(gate.clone()));
        gate
    }

    /// Makes calls of `op` (on `instance`, or on any VM) do `action` instead of answering
    /// normally: the next `times` calls, or every call until [`Self::clear_faults`] (`None`).
    /// Faults fire in the order injected, one per call.
    pub fn inject(
        &self,
        op: Op,
        instance: Option<&str>,
        times: Option<usize>,
        action: FaultAction,
    ) {
        self.state().faults.push(Fault {
            op,
            instance: instance.map(str::to_owned),
            remaining: times,
            action,
        });
    }

    /// How many more calls the counted faults will hit (faults without a count are left out).
    pub fn faults_left(&self) -> usize {
        self.state().faults.iter().filter_map(|f| f.remaining).sum()
    }

    /// Removes every injected fault.
    pub fn clear_faults(&self) {
        self.state().faults.clear();
    }

    /// The calls so far, oldest first.
    pub fn calls(&self) -> Vec<Call> {
        self.state().calls.clone()
    }

    /// The VMs the engine told this cloud to forget ([`CloudProvider::forget_vm`]), in order.
    pub fn forgotten(&self) -> Vec<InstanceId> {
        self.state().forgotten.clone()
    }

    /// How many calls of `op` were made (counted even when the log is off).
    pub fn call_count(&self, op: Op) -> u64 {
        self.counters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&op)
            .copied()
            .unwrap_or(0)
    }

    /// Every broken promise seen so far: an IP on two VMs, or overlapping mutations of one VM.
    pub fn violations(&self) -> Vec<String> {
        self.state().violations.clone()
    }

    fn violation(state: &mut State, message: String) {
        tracing::error!(%message, "memory cloud invariant violated");
        state.violations.push(message);
    }

    /// Logs the call (one record per kind of `records`), takes an injected fault if one matches
    /// one of them, and marks the VM busy. A `Fail` fault is returned as the error; any other
    /// fault is for the caller to act out.
    fn begin(
        &self,
        records: &[(Op, &[IpAddr])],
        instance: &str,
        with_view: bool,
    ) -> Result<Option<FaultAction>, CloudError> {
        let mutation = records.iter().any(|(op, _)| op.is_mutation());
        {
            let mut counters = self.counters.lock().unwrap_or_else(PoisonError::into_inner);
            for (op, _) in records {
                *counters.entry(*op).or_default() += 1;
            }
        }
        if mutation {
            *self
                .mutating_calls
                .lock()
                .unwrap_or_else(PoisonError::into_inner) += 1;
        }
        let mut state = self.state();
        if self.config.record_calls {
            for (op, ips) in records {
                state.calls.push(Call {
                    op: *op,
                    instance: instance.to_owned(),
                    ips: ips.to_vec(),
                    with_view,
                });
            }
        }
        let action = Self::take_fault(&mut state, |op, vm| {
            records.iter().any(|(r, _)| *r == op) && vm.is_none_or(|i| i == instance)
        });
        if let Some(FaultAction::Fail(error)) = action {
            return Err(error);
        }
        if !state.vms.contains_key(instance) {
            return Err(missing(instance));
        }
        if mutation {
            let serialize = self.config.serialize_per_node;
            let overlapping = state.vms.get_mut(instance).map(|vm| {
                vm.in_flight += 1;
                vm.in_flight
            });
            if serialize && overlapping.is_some_and(|n| n > 1) {
                Self::violation(
                    &mut state,
                    format!("two mutations of instance {instance} overlap"),
                );
            }
        }
        Ok(action)
    }

    /// Takes the first injected fault with calls left that `hits` (given its operation and
    /// instance, `None` for any), counting the call against it.
    fn take_fault(
        state: &mut State,
        hits: impl Fn(Op, Option<&str>) -> bool,
    ) -> Option<FaultAction> {
        let index = state
            .faults
            .iter()
            .position(|f| hits(f.op, f.instance.as_deref()) && f.remaining != Some(0))?;
        let fault = &mut state.faults[index];
        if let Some(n) = fault.remaining.as_mut() {
            *n -= 1;
        }
        Some(fault.action.clone())
    }

    fn count(&self, op: Op, n: u64) {
        *self
            .counters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(op)
            .or_default() += n;
    }

    /// Logs and counts one list read of `instances` and takes the faults that hit it: one for
    /// the whole call, and one per VM.
    fn begin_list(&self, instances: &[&str]) -> (Option<FaultAction>, Vec<Option<FaultAction>>) {
        self.count(Op::EgressConfigs, 1);
        self.count(Op::EgressConfig, instances.len() as u64);
        let mut state = self.state();
        if self.config.record_calls {
            state.calls.push(Call {
                op: Op::EgressConfigs,
                instance: instances.join(","),
                ips: Vec::new(),
                with_view: false,
            });
        }
        let whole = Self::take_fault(&mut state, |op, vm| {
            op == Op::EgressConfigs && vm.is_none_or(|vm| instances.contains(&vm))
        });
        let each = instances
            .iter()
            .map(|instance| {
                Self::take_fault(&mut state, |op, vm| {
                    op == Op::EgressConfig && vm.is_none_or(|vm| vm == *instance)
                })
            })
            .collect();
        (whole, each)
    }

    fn end(state: &mut State, mutation: bool, instance: &str) {
        if mutation && let Some(vm) = state.vms.get_mut(instance) {
            vm.in_flight = vm.in_flight.saturating_sub(1);
        }
    }

    async fn latency(&self) {
        if !self.config.latency.is_zero() {
            tokio::time::sleep(self.config.latency).await;
        }
    }

    fn check_attach(
        &self,
        state: &State,
        instance: &str,
        ip: IpAddr,
        attached: &BTreeSet<IpAddr>,
    ) -> Result<(), CloudError> {
        let Some(vm) = state.vms.get(instance) else {
            return Err(missing(instance));
        };
        let in_subnet = match ip {
            IpAddr::V4(v4) => vm.spec.ipv4_subnet.is_some_and(|n| n.contains(&v4)),
            IpAddr::V6(v6) => vm.spec.ipv6_subnet.is_some_and(|n| n.contains(&v6)),
        };
        if !in_subnet {
            return Err(CloudError::permanent(format!(
                "{ip} is not in a subnet of instance {instance}"
            )));
        }
        let bucket = bucket_for(self.config.platform, ip, &vm.spec.capacity);
        if let Some(limit) = vm.spec.capacity.get(bucket) {
            let used = vm
                .spec
                .primary
                .iter()
                .chain(attached.iter())
                .filter(|a| bucket_for(self.config.platform, **a, &vm.spec.capacity) == bucket)
                .count();
            if i64::try_from(used).unwrap_or(i64::MAX) >= limit {
                return Err(CloudError::permanent(format!(
                    "instance {instance} has no room for {ip}: {used} of {limit} addresses in use"
                )));
            }
        }
        Ok(())
    }

    /// Makes `change` on `instance`, all or nothing, as a cloud refuses a whole request.
    fn apply_now(
        &self,
        state: &mut State,
        instance: &str,
        change: &Change,
    ) -> Result<(), CloudError> {
        // The driver's rule, as every real provider applies it: nothing foreign taken over.
        if let Some(view) = self.view(state, instance) {
            super::driver::foreign(&view, change)?;
        }
        let mut room = state
            .vms
            .get(instance)
            .map(|vm| vm.attached.clone())
            .unwrap_or_default();
        for ip in &change.remove {
            room.remove(ip);
        }
        for &ip in &change.add {
            match state.owner.get(&ip) {
                Some(owner) if owner == instance => continue,
                Some(owner) if !change.remove.contains(&ip) => {
                    let message =
                        format!("{ip} attached to {instance} while still attached to {owner}");
                    Self::violation(state, message);
                    return Err(CloudError::permanent(format!(
                        "{ip} is in use by another instance"
                    )));
                }
                _ => {}
            }
            self.check_attach(state, instance, ip, &room)?;
            room.insert(ip);
        }
        for ip in &change.remove {
            if let Some(vm) = state.vms.get_mut(instance) {
                vm.attached.remove(ip);
            }
            if state.owner.get(ip).map(String::as_str) == Some(instance) {
                state.owner.remove(ip);
            }
        }
        for &ip in &change.add {
            state.owner.insert(ip, instance.to_owned());
            if let Some(vm) = state.vms.get_mut(instance) {
                vm.attached.insert(ip);
            }
        }
        Ok(())
    }

    /// The view of `instance`'s interface now.
    fn view(&self, state: &State, instance: &str) -> Option<NodeEgress> {
        let vm = state.vms.get(instance)?;
        Some(NodeEgress {
            interface: vm.spec.interface.clone(),
            ipv4_subnet: vm.spec.ipv4_subnet,
            ipv6_subnet: vm.spec.ipv6_subnet,
            capacity: vm.spec.capacity,
            addresses: vm
                .spec
                .primary
                .iter()
                .chain(vm.attached.iter())
                .copied()
                .collect(),
            primary: vm.spec.primary.clone(),
        })
    }

    /// Takes a matching fault for a read-only call; the read itself is done by the caller.
    async fn begin_read(&self, op: Op, instance: &str) -> Result<(), CloudError> {
        let fault = self.begin(&[(op, &[])], instance, false)?;
        self.latency().await;
        act_out_before(fault.as_ref(), op, instance).await;
        match fault {
            Some(FaultAction::ApplyThenFail(error)) => Err(error),
            Some(FaultAction::ApplyThenHang) => std::future::pending().await,
            _ => Ok(()),
        }
    }
}

/// The answer for a VM that does not exist.
fn missing(instance: &str) -> CloudError {
    CloudError::not_found(format!("instance {instance} does not exist"))
}

/// Acts out the faults that strike before a call changes anything: a panic, or no answer.
async fn act_out_before(fault: Option<&FaultAction>, op: Op, instance: &str) {
    match fault {
        // A provider bug, as the engine would meet it: the call's future panics.
        #[allow(clippy::panic)]
        Some(FaultAction::Panic) => panic!("injected panic in {op:?} of instance {instance}"),
        Some(FaultAction::Hang) => std::future::pending().await,
        Some(FaultAction::Hold(gate)) => gate.passed().await,
        _ => {}
    }
}

/// Ends a call that was dropped mid-flight (its caller was aborted): the change never happens,
/// and the VM must not stay marked busy, or the next call would look like an overlap.
struct InFlight<'a> {
    cloud: &'a MemoryCloud,
    instance: &'a str,
    ended: bool,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.ended {
            MemoryCloud::end(&mut self.cloud.state(), true, self.instance);
        }
    }
}

#[async_trait]
impl CloudProvider for MemoryCloud {
    fn forget_vm(&self, instance: &InstanceId) {
        self.state().forgotten.push(instance.clone());
    }

    fn needs(&self) -> ProviderNeeds {
        ProviderNeeds {
            name: "memory",
            serialize_per_node: self.config.serialize_per_node,
            max_batch: self.config.max_batch,
            native_move: false,
            max_read_batch: self.config.max_read_batch,
            platform: self.config.platform,
            reads_before_adding: self.config.reads_before_adding,
        }
    }

    async fn resolve(&self, node_name: &str, provider_id: &str) -> Result<NodeTarget, CloudError> {
        let Some(instance) = provider_id.strip_prefix(PROVIDER_ID_PREFIX) else {
            return Err(CloudError::permanent(format!(
                "providerID {provider_id:?} of node {node_name} is not of the form {PROVIDER_ID_PREFIX}<instance>"
            )));
        };
        if let Some(spec) = &self.config.auto_vm {
            let mut state = self.state();
            if !state.vms.contains_key(instance) {
                state.vms.insert(
                    instance.to_owned(),
                    Vm {
                        spec: spec.clone(),
                        attached: BTreeSet::new(),
                        in_flight: 0,
                    },
                );
            }
        }
        Ok(NodeTarget::new(node_name, provider_id, instance.to_owned()))
    }

    async fn apply(
        &self,
        node: &NodeTarget,
        change: &Change,
        known: Option<&NodeEgress>,
    ) -> Result<Option<NodeEgress>, CloudError> {
        let instance = node.instance.0.as_str();
        if change.len() > self.config.max_batch {
            return Err(CloudError::permanent(format!(
                "batch of {} exceeds the limit of {}",
                change.len(),
                self.config.max_batch
            )));
        }
        if self.config.reads_before_adding && change.needs_fresh_view() {
            self.begin_read(Op::EgressConfig, instance).await?;
        }
        // Refused before any write, as the driver refuses for every real provider: no call.
        if let Some(view) = self.view(&self.state(), instance) {
            super::driver::foreign(&view, change)?;
        }
        if !self.config.before_write.is_zero() {
            tokio::time::sleep(self.config.before_write).await;
        }
        self.writes.acquire().await;
        let mut records: Vec<(Op, &[IpAddr])> = Vec::new();
        if !change.add.is_empty() {
            records.push((Op::Attach, &change.add));
        }
        if !change.remove.is_empty() {
            records.push((Op::Detach, &change.remove));
        }
        let op = records.first().map_or(Op::Detach, |r| r.0);
        let fault = match self.begin(&records, instance, known.is_some()) {
            // A VM that is gone holds none of the IPs a pure removal takes off.
            Err(e) if e.kind == ErrorKind::NotFound && change.add.is_empty() => return Ok(None),
            other => other?,
        };
        let mut in_flight = InFlight {
            cloud: self,
            instance,
            ended: false,
        };
        self.latency().await;
        act_out_before(fault.as_ref(), op, instance).await;
        let outcome = {
            let mut state = self.state();
            Self::end(&mut state, true, instance);
            in_flight.ended = true;
            self.apply_now(&mut state, instance, change)
                .map(|()| self.view(&state, instance))
        };
        match fault {
            Some(FaultAction::ApplyThenFail(error)) => Err(error),
            Some(FaultAction::ApplyThenHang) => std::future::pending().await,
            _ => outcome,
        }
    }

    async fn write_budget(&self, spend: Spend) {
        self.writes.until_available(spend).await;
    }

    async fn egress_config(&self, node: &NodeTarget) -> Result<NodeEgress, CloudError> {
        let instance = node.instance.0.as_str();
        self.begin_read(Op::EgressConfig, instance).await?;
        self.view(&self.state(), instance)
            .ok_or_else(|| missing(instance))
    }

    /// One call for every VM, as a list API answers: a fault on the call fails (or holds up)
    /// all of them, a fault on one VM's read fails that VM alone, and a VM that does not exist is
    /// [`ErrorKind::NotFound`] alone.
    async fn egress_configs(&self, nodes: &[NodeTarget]) -> Vec<Result<NodeEgress, CloudError>> {
        let instances: Vec<&str> = nodes.iter().map(|n| n.instance.0.as_str()).collect();
        if instances.len() > self.config.max_read_batch {
            let error = CloudError::permanent(format!(
                "a read of {} VMs exceeds the limit of {}",
                instances.len(),
                self.config.max_read_batch
            ));
            return nodes.iter().map(|_| Err(error.clone())).collect();
        }
        let (whole, each) = self.begin_list(&instances);
        if let Some(FaultAction::Fail(error)) = whole {
            return nodes.iter().map(|_| Err(error.clone())).collect();
        }
        self.latency().await;
        let what = instances.join(",");
        act_out_before(whole.as_ref(), Op::EgressConfigs, &what).await;
        for fault in &each {
            act_out_before(fault.as_ref(), Op::EgressConfig, &what).await;
        }
        if let Some(FaultAction::ApplyThenFail(error)) = whole {
            return nodes.iter().map(|_| Err(error.clone())).collect();
        }
        let hangs = |f: &Option<FaultAction>| matches!(f, Some(FaultAction::ApplyThenHang));
        if hangs(&whole) || each.iter().any(hangs) {
            return std::future::pending().await;
        }
        let state = self.state();
        instances
            .iter()
            .zip(each)
            .map(|(instance, fault)| match fault {
                Some(FaultAction::Fail(error) | FaultAction::ApplyThenFail(error)) => Err(error),
                _ => self.view(&state, instance).ok_or_else(|| missing(instance)),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::CloudProviderExt;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn cloud_with(vms: &[&str]) -> MemoryCloud {
        let cloud = MemoryCloud::new(MemoryConfig::default());
        for (i, vm) in vms.iter().enumerate() {
            cloud.add_vm(vm, VmSpec::ipv4(ip(&format!("10.1.0.{}", i + 1)), 4));
        }
        cloud
    }

    async fn target(cloud: &MemoryCloud, vm: &str) -> NodeTarget {
        cloud.resolve(vm, &provider_id(vm)).await.unwrap()
    }

    #[tokio::test]
    async fn attach_is_idempotent_for_ours_and_logged() {
        let cloud = cloud_with(&["a"]);
        let a = target(&cloud, "a").await;
        let ips = [ip("10.2.0.1"), ip("10.2.0.2")];
        let first = cloud.attach(&a, &ips).await.unwrap();
        // Found there, the addresses are done only as ours: else they are another's.
        let error = cloud.attach(&a, &ips).await.unwrap_err();
        assert_eq!(error.kind, ErrorKind::Foreign);
        let ours = Change::new(ips.to_vec(), Vec::new()).with_ours(ips.to_vec());
        let again = cloud.apply(&a, &ours, None).await.unwrap();
        assert_eq!(first, again);
        assert_eq!(cloud.attached_to("a").len(), 2);
        assert_eq!(cloud.call_count(Op::Attach), 2, "the refusal is no call");
        assert_eq!(cloud.calls()[0].ips, ips.to_vec());
        assert!(cloud.violations().is_empty());
    }

    #[tokio::test]
    async fn attaching_an_ip_owned_elsewhere_is_a_violation_and_a_failure() {
        let cloud = cloud_with(&["a", "b"]);
        let (a, b) = (target(&cloud, "a").await, target(&cloud, "b").await);
        cloud.attach(&a, &[ip("10.2.0.1")]).await.unwrap();
        let error = cloud.attach(&b, &[ip("10.2.0.1")]).await.unwrap_err();
        assert_eq!(error.kind, ErrorKind::Permanent);
        assert_eq!(cloud.owner_of(ip("10.2.0.1")).as_deref(), Some("a"));
        assert_eq!(cloud.violations().len(), 1);
    }

    #[tokio::test]
    async fn detach_of_an_absent_ip_succeeds() {
        let cloud = cloud_with(&["a"]);
        let a = target(&cloud, "a").await;
        let view = cloud.detach(&a, &[ip("10.2.0.9")]).await.unwrap().unwrap();
        assert_eq!(view.addresses, vec![ip("10.1.0.1")]);
        assert_eq!(view.primary, vec![ip("10.1.0.1")]);
        let ghost = target(&cloud, "ghost").await;
        assert_eq!(cloud.detach(&ghost, &[ip("10.2.0.9")]).await, Ok(None));
    }

    #[tokio::test]
    async fn capacity_counts_the_primary_address_and_refuses_the_whole_change() {
        let cloud = cloud_with(&["a"]);
        let a = target(&cloud, "a").await;
        let ips: Vec<IpAddr> = (1..=4).map(|i| ip(&format!("10.2.0.{i}"))).collect();
        let error = cloud.attach(&a, &ips).await.unwrap_err();
        assert_eq!(error.kind, ErrorKind::Permanent);
        assert!(cloud.attached_to("a").is_empty());
        // Removing one makes room for another in the same change.
        cloud.attach(&a, &ips[..3]).await.unwrap();
        let change = Change::new(vec![ips[3]], vec![ips[0]]);
        cloud.apply(&a, &change, None).await.unwrap();
        assert_eq!(cloud.attached_to("a"), ips[1..].iter().copied().collect());
        assert_eq!(cloud.mutating_calls(), 3);
    }

    #[tokio::test]
    async fn ip_outside_the_subnet_fails() {
        let cloud = cloud_with(&["a"]);
        let a = target(&cloud, "a").await;
        let error = cloud.attach(&a, &[ip("192.168.0.5")]).await.unwrap_err();
        assert_eq!(error.kind, ErrorKind::Permanent);
    }

    #[tokio::test]
    async fn injected_faults_fire_the_given_number_of_times() {
        let cloud = cloud_with(&["a"]);
        let a = target(&cloud, "a").await;
        cloud.fail_next(Op::Attach, None, 2, CloudError::throttled("slow down"));
        for _ in 0..2 {
            let err = cloud.attach(&a, &[ip("10.2.0.1")]).await.unwrap_err();
            assert_eq!(err.kind, ErrorKind::Throttled);
        }
        assert!(cloud.attach(&a, &[ip("10.2.0.1")]).await.is_ok());
        cloud.fail_always(Op::Detach, "a", CloudError::retryable("5xx"));
        assert!(cloud.detach(&a, &[ip("10.2.0.1")]).await.is_err());
        cloud.clear_faults();
        assert!(cloud.detach(&a, &[ip("10.2.0.1")]).await.is_ok());
    }

    #[tokio::test]
    async fn a_panic_fault_panics_without_changing_anything_or_leaving_the_vm_busy() {
        use futures::FutureExt;
        let cloud = cloud_with(&["a"]);
        let a = target(&cloud, "a").await;
        cloud.inject(Op::Attach, Some("a"), Some(1), FaultAction::Panic);
        let ips = [ip("10.2.0.1")];
        let call = std::panic::AssertUnwindSafe(cloud.attach(&a, &ips));
        assert!(call.catch_unwind().await.is_err());
        assert!(cloud.attached_to("a").is_empty());
        cloud.attach(&a, &[ip("10.2.0.2")]).await.unwrap();
        assert!(cloud.violations().is_empty(), "{:?}", cloud.violations());
    }

    #[tokio::test(start_paused = true)]
    async fn a_hang_fault_never_answers_and_changes_nothing() {
        let cloud = cloud_with(&["a"]);
        let a = target(&cloud, "a").await;
        cloud.inject(Op::Detach, None, Some(1), FaultAction::Hang);
        cloud.attach(&a, &[ip("10.2.0.1")]).await.unwrap();
        let hung = tokio::time::timeout(
            Duration::from_secs(3600),
            cloud.detach(&a, &[ip("10.2.0.1")]),
        )
        .await;
        assert!(hung.is_err(), "{hung:?}");
        assert_eq!(cloud.owner_of(ip("10.2.0.1")).as_deref(), Some("a"));
        // The abandoned call no longer counts as in flight.
        cloud.detach(&a, &[ip("10.2.0.1")]).await.unwrap();
        assert!(cloud.violations().is_empty(), "{:?}", cloud.violations());
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_call_answers_once_its_gate_opens_and_not_before() {
        let cloud = cloud_with(&["a"]);
        let a = target(&cloud, "a").await;
        cloud.attach(&a, &[ip("10.2.0.1")]).await.unwrap();
        let gate = cloud.hold_next(Op::Detach, "a");
        let ips = [ip("10.2.0.1")];
        let mut held = std::pin::pin!(cloud.detach(&a, &ips));
        let early = tokio::time::timeout(Duration::from_secs(3600), held.as_mut()).await;
        assert!(early.is_err(), "{early:?}");
        assert_eq!(cloud.owner_of(ip("10.2.0.1")).as_deref(), Some("a"));
        gate.open();
        held.await.unwrap();
        assert_eq!(cloud.owner_of(ip("10.2.0.1")), None);
        assert!(cloud.violations().is_empty(), "{:?}", cloud.violations());
    }

    #[tokio::test(start_paused = true)]
    async fn applied_reply_lost_faults_make_the_change_and_fail_or_never_answer() {
        let cloud = cloud_with(&["a"]);
        let a = target(&cloud, "a").await;
        let lost = CloudError::retryable("connection reset");
        cloud.inject(
            Op::Attach,
            None,
            Some(1),
            FaultAction::ApplyThenFail(lost.clone()),
        );
        cloud.inject(Op::Detach, None, Some(1), FaultAction::ApplyThenHang);
        assert_eq!(cloud.faults_left(), 2);
        let err = cloud.attach(&a, &[ip("10.2.0.1")]).await.unwrap_err();
        assert_eq!(err, lost);
        assert_eq!(cloud.owner_of(ip("10.2.0.1")).as_deref(), Some("a"));
        let hung = tokio::time::timeout(
            Duration::from_secs(3600),
            cloud.detach(&a, &[ip("10.2.0.1")]),
        )
        .await;
        assert!(hung.is_err(), "{hung:?}");
        assert_eq!(cloud.owner_of(ip("10.2.0.1")), None);
        assert_eq!(cloud.faults_left(), 0);
        cloud.attach(&a, &[ip("10.2.0.1")]).await.unwrap();
        assert!(cloud.violations().is_empty(), "{:?}", cloud.violations());
    }

    #[tokio::test]
    async fn overlapping_mutations_of_one_vm_are_a_violation() {
        let cloud = MemoryCloud::new(MemoryConfig {
            latency: Duration::from_millis(50),
            ..MemoryConfig::default()
        });
        cloud.add_vm("a", VmSpec::ipv4(ip("10.1.0.1"), 10));
        let a = target(&cloud, "a").await;
        let (first, second) = ([ip("10.2.0.1")], [ip("10.2.0.2")]);
        let (x, y) = tokio::join!(cloud.attach(&a, &first), cloud.attach(&a, &second));
        assert!(x.is_ok() && y.is_ok());
        assert_eq!(cloud.violations().len(), 1, "{:?}", cloud.violations());
    }

    #[tokio::test]
    async fn unknown_instance_is_not_found_and_bad_provider_id_is_refused() {
        let cloud = cloud_with(&[]);
        let ghost = target(&cloud, "ghost").await;
        let err = cloud.attach(&ghost, &[ip("10.2.0.1")]).await.unwrap_err();
        assert_eq!(err.kind, ErrorKind::NotFound);
        assert!(cloud.resolve("n", "aws:///us-east-1a/i-1").await.is_err());
    }

    #[tokio::test]
    async fn egress_config_reports_primary_and_attached_addresses() {
        let cloud = cloud_with(&["a"]);
        let a = target(&cloud, "a").await;
        cloud.attach(&a, &[ip("10.2.0.1")]).await.unwrap();
        let egress = cloud.egress_config(&a).await.unwrap();
        assert_eq!(egress.addresses, vec![ip("10.1.0.1"), ip("10.2.0.1")]);
        assert_eq!(egress.capacity.ip, Some(4));
        assert_eq!(egress.primary, vec![ip("10.1.0.1")]);
    }
}
