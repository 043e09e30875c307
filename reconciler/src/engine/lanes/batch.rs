//! One lane's batch: the jobs it takes from the queue, the change they ask for, and how their
//! callers are answered.

use std::collections::VecDeque;
use std::net::IpAddr;

use tokio::time::Instant;

use super::Mutation;
use crate::cloud::{Change, CloudError, ErrorKind, NodeEgress};

pub(super) struct Job {
    pub(super) mutation: Mutation,
    pub(super) ip: IpAddr,
    pub(super) arrived: Instant,
    pub(super) reply: Reply,
}

/// Where one IP's answer goes: to a submitter awaiting it ([`super::Lanes::submit`]), or to a
/// reconcile that ended while its IP waits ([`super::Lanes::submit_then`]). Dropped unanswered
/// (its lane went away, or was aborted), it answers that the call was abandoned, so no one
/// waits forever.
pub(crate) struct Reply(Option<Answer>);

/// What an IP's answer is handed to.
type Answer = Box<dyn FnOnce(Result<(), CloudError>) + Send>;

impl Reply {
    /// A reply that calls `answer` with the IP's result.
    pub(crate) fn to(answer: impl FnOnce(Result<(), CloudError>) + Send + 'static) -> Self {
        Self(Some(Box::new(answer)))
    }

    /// Answers with `result`.
    pub(crate) fn send(mut self, result: Result<(), CloudError>) {
        if let Some(answer) = self.0.take() {
            answer(result);
        }
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        if let Some(answer) = self.0.take() {
            answer(Err(abandoned()));
        }
    }
}

/// Takes the next batch from `pending`: the oldest jobs up to `max`, additions and removals
/// alike; a second job for an IP already in the batch waits for the next one, so one IP's
/// detach and re-attach keep their order.
pub(super) fn take_batch<T>(
    pending: &mut VecDeque<T>,
    max: usize,
    ip_of: impl Fn(&T) -> IpAddr,
) -> Vec<T> {
    let mut batch: Vec<T> = Vec::new();
    let mut rest = VecDeque::with_capacity(pending.len());
    while let Some(job) = pending.pop_front() {
        let ip = ip_of(&job);
        let duplicate = batch.iter().any(|b| ip_of(b) == ip);
        if batch.len() < max.max(1) && !duplicate {
            batch.push(job);
        } else {
            rest.push_back(job);
        }
    }
    *pending = rest;
    batch
}

/// The change a batch asks for.
pub(super) fn change_of(batch: &[Job]) -> Change {
    let mut change = Change::default();
    for job in batch {
        match job.mutation {
            Mutation::Attach | Mutation::Adopt => change.add.push(job.ip),
            Mutation::Detach => change.remove.push(job.ip),
        }
    }
    change
}

/// The change `job` asks for alone, its addition known as ours if `ours` lists it.
pub(super) fn one(job: &Job, ours: &[IpAddr]) -> Change {
    let mut change = change_of(std::slice::from_ref(job));
    if ours.contains(&job.ip) {
        change.ours.push(job.ip);
    }
    change
}

/// Whether `view` already shows `change` made.
pub(super) fn in_effect(view: &NodeEgress, change: &Change) -> bool {
    change.add.iter().all(|ip| view.holds(*ip)) && change.remove.iter().all(|ip| !view.holds(*ip))
}

/// Whether a failed change of several IPs may be one IP's fault, and is worth splitting.
pub(super) fn worth_splitting(error: &CloudError) -> bool {
    matches!(
        error.kind,
        ErrorKind::Permanent | ErrorKind::NotFound | ErrorKind::Foreign
    )
}

/// What a change does, in words for messages: `attach`, `detach` or `attach and detach`.
pub(super) fn operation_of(change: &Change) -> &'static str {
    match (change.add.is_empty(), change.remove.is_empty()) {
        (false, true) => "attach",
        (true, false) => "detach",
        _ => "attach and detach",
    }
}

pub(super) fn deliver(batch: Vec<Job>, result: &Result<(), CloudError>) {
    for job in batch {
        job.reply.send(result.clone());
    }
}

/// The error of an IP whose lane went away before answering.
pub(super) fn abandoned() -> CloudError {
    CloudError::retryable("the cloud call for this IP was abandoned; it will be retried")
}
