//! The answers of one batched read ([`crate::cloud::CloudProvider::egress_configs`]), filled in
//! as a provider's list calls come back: a VM a list cannot answer is read on its own at the end,
//! so every provider keeps "one answer per VM, in the order given" the same way.

use crate::cloud::{CloudError, CloudProvider, NodeEgress, NodeTarget, read_each};

/// One slot per VM of the batch, and the VMs left to single reads.
#[derive(Debug)]
pub struct Answers {
    slots: Vec<Option<Result<NodeEgress, CloudError>>>,
    alone: Vec<usize>,
}

impl Answers {
    /// Empty answers for a batch of `len` VMs.
    pub fn new(len: usize) -> Self {
        Self {
            slots: vec![None; len],
            alone: Vec::new(),
        }
    }

    /// VM `i`'s answer.
    pub fn set(&mut self, i: usize, answer: Result<NodeEgress, CloudError>) {
        if let Some(slot) = self.slots.get_mut(i) {
            *slot = Some(answer);
        }
    }

    /// The failure of a list call, as the answer of each VM it was to answer.
    pub fn fail(&mut self, vms: impl IntoIterator<Item = usize>, error: &CloudError) {
        for i in vms {
            self.set(i, Err(error.clone()));
        }
    }

    /// VM `i` is read on its own ([`CloudProvider::egress_config`]) at the end.
    pub fn read_alone(&mut self, i: usize) {
        self.alone.push(i);
    }

    /// Every answer in order, once the VMs left alone were read (`nodes` is the batch).
    pub async fn finish<P: CloudProvider + ?Sized>(
        mut self,
        provider: &P,
        nodes: &[NodeTarget],
    ) -> Vec<Result<NodeEgress, CloudError>> {
        let alone: Vec<NodeTarget> = self
            .alone
            .iter()
            .filter_map(|i| nodes.get(*i).cloned())
            .collect();
        let read = read_each(provider, &alone).await;
        for (i, answer) in std::mem::take(&mut self.alone).into_iter().zip(read) {
            self.set(i, answer);
        }
        self.slots
            .into_iter()
            .map(|slot| slot.unwrap_or_else(|| Err(CloudError::retryable("VM left unread"))))
            .collect()
    }
}
