//! Retirement: a container whose timed-out command could not be killed is removed by id, so
//! every process makes a replacement; when that removal fails too, every handle refuses it and
//! the next acquire removes it first.

use std::sync::Arc;

use crate::containers::Containers;
use crate::memory::Memories;

/// Retires instances and sweeps those whose removal failed.
#[derive(Debug)]
pub(crate) struct Retirement {
    containers: Arc<Containers>,
    memory: Arc<Memories>,
}

impl Retirement {
    pub(crate) fn new(containers: Arc<Containers>, memory: Arc<Memories>) -> Self {
        Retirement { containers, memory }
    }

    /// Retires an instance: removed by id, so every process creates a replacement; when the
    /// removal fails too, every handle refuses and the next acquire removes it first.
    pub(crate) async fn retire(&self, id: &str) {
        self.memory.retire(id);
        match self.containers.remove(id).await {
            Ok(_) => {
                // `remove` forgot the instance; keep it retired so old handles say so.
                self.memory.retire(id);
            }
            Err(failure) => {
                tracing::warn!(container = %id, %failure, "a retired sandbox could not be removed");
                self.memory.retired.mark_unremovable(id);
            }
        }
    }

    /// Removes retired instances whose removal failed before, before anything else.
    pub(crate) async fn sweep_unremovable(&self) {
        for id in self.memory.retired.unremovable() {
            if self.containers.remove(&id).await.is_ok() {
                self.memory.retired.clear_unremovable(&id);
            }
        }
    }
}
