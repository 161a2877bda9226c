//! Lessons kept from agents' returns (`extract_memory: true` on
//! `branch_return`), in the background and durably.
//!
//! The return queues the lesson in the statement that ends the branch (see
//! [`foldgate_store::Finish::extract`]), so a return that fails or is rolled
//! back queues nothing, and a second return of the branch cannot queue it
//! again. The `memory_extract` task of any replica claims pending entries
//! with a hold ([`HOLD`]), makes each lesson exactly as a return describes
//! it (a strategy when the branch completed, a pitfall when not), scrubs and
//! screens it, and stores it in the transaction that ends the entry, only if
//! the entry is still pending: a lesson is stored once, whichever replica
//! gets there first, even when a hold lapsed and another replica took the
//! entry over. An entry that keeps failing is given up after
//! [`MAX_ATTEMPTS`] (counted in `foldgate.memory.extractions`).

use foldgate_background::Activator;
use foldgate_domain::{Branch, BranchStatus, Principal};
use foldgate_store::Extraction;

use super::{MemoryBank, RecordMemory};
use crate::FoldError;

/// How long a replica holds the extractions it claimed: each is a scrub
/// and an insert, milliseconds; a failed one is tried again after it.
const HOLD: chrono::Duration = chrono::Duration::seconds(60);
/// Extractions claimed at once.
pub(super) const BATCH: u32 = 32;
/// Attempts before an extraction is given up.
pub const MAX_ATTEMPTS: u32 = 3;

/// What one pass of the extractor did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExtractPass {
    /// Entries claimed.
    pub claimed: usize,
    /// Lessons stored.
    pub kept: usize,
    /// Entries left for another attempt.
    pub retried: usize,
    /// Entries given up.
    pub failed: usize,
}

/// How one claimed entry ended.
enum Ended {
    Kept,
    /// Another replica stored it first.
    Taken,
    Retry,
    Failed,
}

impl MemoryBank {
    /// Whether a return of `branch` ending `status` with `message` (scrubbed)
    /// makes a lesson: what `branch_return` queues, and answers with
    /// `memory_extracted`. An empty message does not.
    pub fn extracts(&self, branch: &Branch, status: BranchStatus, message: &str) -> bool {
        self.config.enabled
            && RecordMemory::from_return(
                status,
                &branch.description,
                message,
                branch.session_id.clone(),
                branch.id,
            )
            .is_ok()
    }

    /// A return queued a lesson: wakes the extractor of this replica.
    pub fn extraction_queued(&self) {
        self.extract_wake.activate();
    }

    /// What wakes the extractor: its trigger on the driver.
    pub fn extract_activator(&self) -> Activator {
        self.extract_wake.clone()
    }

    /// One pass: claims up to [`BATCH`] pending extractions, held for
    /// [`HOLD`], and ends each. A store failure ends the pass; what it
    /// left claimed is taken again once its hold lapses.
    pub async fn extract_pending(&self) -> Result<ExtractPass, FoldError> {
        let now = self.clock.now();
        let claimed = self.store.claim_extractions(now, now + HOLD, BATCH).await?;
        let mut pass = ExtractPass { claimed: claimed.len(), ..ExtractPass::default() };
        for job in claimed {
            let (counted, outcome) = match self.extract(&job).await? {
                Ended::Kept => (&mut pass.kept, "done"),
                Ended::Taken => continue,
                Ended::Retry => (&mut pass.retried, "retry"),
                Ended::Failed => (&mut pass.failed, "failed"),
            };
            *counted += 1;
            self.metrics.extraction(&job.tenant, outcome);
        }
        Ok(pass)
    }

    /// Makes, scrubs, screens and stores one claimed lesson.
    async fn extract(&self, job: &Extraction) -> Result<Ended, FoldError> {
        let (tenant, branch_id, attempts) = (&job.tenant, job.branch, job.attempts);
        if attempts > MAX_ATTEMPTS {
            // Claimed that often without an end: its replicas died on it.
            tracing::warn!(%tenant, %branch_id, attempts,
                "keeping a return as a lesson never finished; given up");
            return self.give_up(job).await;
        }
        let who = Principal::new(tenant.clone(), job.owner.clone());
        let candidate = RecordMemory::from_return(
            job.status,
            &job.description,
            &job.message,
            job.session.clone(),
            job.branch,
        );
        let lesson = match candidate {
            Ok(candidate) => self.prepare(&who, candidate),
            Err(e) => {
                // The same text made a lesson when it was queued; it never will now.
                tracing::warn!(%tenant, %branch_id, error = %e,
                    "a queued return no longer makes a lesson; given up");
                return self.give_up(job).await;
            }
        };
        match lesson {
            Ok(new) => {
                match self.store.end_extraction(tenant, branch_id, attempts, Some(&new)).await? {
                    Some(stored) => {
                        self.kept(&stored);
                        Ok(Ended::Kept)
                    }
                    None => Ok(Ended::Taken),
                }
            }
            Err(e) if attempts >= MAX_ATTEMPTS => {
                tracing::warn!(%tenant, %branch_id, attempts, error = %e,
                    "keeping a return as a lesson failed; given up");
                self.give_up(job).await
            }
            Err(e) => {
                tracing::info!(%tenant, %branch_id, attempts, error = %e,
                    "keeping a return as a lesson failed; retried once its hold lapses");
                Ok(Ended::Retry)
            }
        }
    }

    async fn give_up(&self, job: &Extraction) -> Result<Ended, FoldError> {
        self.store.end_extraction(&job.tenant, job.branch, job.attempts, None).await?;
        Ok(Ended::Failed)
    }
}
