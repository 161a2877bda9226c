//! Lessons distilled from the gateway-run branches that ended: the branch's
//! own model is asked, once the run is over and off every request's path,
//! what a later branch should learn from it — strategies from a completed
//! branch, pitfalls from one that failed or ran out of time or tokens.
//!
//! The queue is in the store (`branch_runs.distill`), so any replica takes
//! the work, a replica that dies holding some leaves it to another once its
//! hold lapses, and a distillation that keeps failing is given up after
//! [`MAX_ATTEMPTS`]. A branch's lessons are stored in the transaction that
//! ends its distillation, and only if it is still pending: a retry, or a
//! replica that took over a lapsed hold and finishes second, stores none,
//! so they are kept once.
//!
//! What the distiller's model calls are billed counts in the tenant's model
//! usage: booked to the branch's run (apart from the run's own calls) with
//! the attempt's end, whatever its outcome, and recorded in
//! `gen_ai.client.token.usage` with `purpose="distill"`.

use foldgate_background::{Activation, BackgroundTask, BoxFuture, Driver, StopOrder, TaskDef};
use foldgate_domain::{
    Confidence, MemoryContent, MemoryDescription, MemoryKind, MemorySource, MemoryTitle,
};
use foldgate_engine::{MemoryBank, RecordMemory};
use foldgate_store::{DistillOutcome, DistillationEnd, ModelUsage, NewMemory};

use super::*;
use crate::metrics::Purpose;

/// How often the queue is looked at.
const DISTILL_INTERVAL: Duration = Duration::from_secs(5);
/// How long a replica holds a claimed distillation: longer than its model
/// call may take, retries included.
const HOLD: Duration = Duration::from_secs(900);
/// Distillations worked in one pass, each claimed just before its work.
const BATCH: u32 = 8;
/// Attempts before a distillation is given up.
pub(crate) const MAX_ATTEMPTS: u32 = 3;
/// The most lessons taken from one branch.
const MAX_LESSONS: usize = 3;
/// The longest answer asked of the model.
const ANSWER_TOKENS: u32 = 800;
/// How much of each step the model is shown, and of the whole transcript.
const STEP_CHARS: usize = 1_500;
const TRANSCRIPT_CHARS: usize = 24_000;
/// The highest confidence a distilled lesson starts from, whatever the
/// model says: feedback has to confirm the rest.
const MAX_PRIOR: f64 = 0.9;

/// The distiller on the background driver (`memory_distill`).
struct Distill(Arc<Runner>);

impl BackgroundTask for Distill {
    fn activate(&mut self) -> BoxFuture<'_, Activation> {
        Box::pin(async move {
            match self.0.distill_pending().await {
                Ok((lessons, branches)) => {
                    Activation::ok(json!({"branches": branches, "lessons": lessons}))
                }
                Err(e) => {
                    tracing::warn!(error = %e, "distilling lessons failed; retried later");
                    Activation::failed(e, json!({}))
                }
            }
        })
    }
}

/// What the model answers.
#[derive(Debug, Deserialize)]
struct Answer {
    #[serde(default)]
    lessons: Vec<Lesson>,
}

#[derive(Debug, Deserialize)]
struct Lesson {
    title: String,
    #[serde(default)]
    description: String,
    content: String,
    #[serde(default)]
    confidence: Option<f64>,
}

impl Runner {
    /// Registers the distiller, when the memory is on.
    pub fn register_distiller(self: &Arc<Self>, driver: &mut Driver) {
        if self.service.memory().is_some() {
            let def = TaskDef::new("memory_distill", StopOrder::RUNS).period(DISTILL_INTERVAL);
            driver.register(def, Distill(Arc::clone(self)));
        }
    }

    /// Whether the lessons of a run of `tenant` are distilled when it ends.
    pub(super) fn distills(&self, tenant: &TenantId) -> bool {
        self.service.memory().is_some_and(|m| m.config().distills(tenant))
    }

    /// One pass: claims pending distillations and works them. How many
    /// lessons were stored, from how many branches.
    async fn distill_pending(&self) -> Result<(usize, usize), FoldError> {
        let Some(memory) = self.service.memory() else { return Ok((0, 0)) };
        let store = self.service.store();
        let (mut lessons, mut branches) = (0, 0);
        for _ in 0..BATCH {
            let now = self.service.clock().now();
            let until = now + chrono::Duration::from_std(HOLD).unwrap_or_default();
            let Some(job) = store.claim_distillations(now, until, 1).await?.pop() else { break };
            branches += 1;
            let (tenant, id, attempts) = (&job.tenant, job.branch, job.attempts);
            let mut usage = ModelUsage::default();
            let result = if attempts > MAX_ATTEMPTS {
                // Claimed that often without an end: its replicas died on it.
                Err(DistillError::Abandoned(attempts))
            } else {
                self.distill(memory, tenant, id, &mut usage).await
            };
            let outcome = match &result {
                Ok(_) => DistillOutcome::Done,
                Err(e) if attempts >= MAX_ATTEMPTS => {
                    tracing::warn!(%tenant, branch_id = %id, error = %e, attempts,
                        "distilling a branch failed; given up");
                    DistillOutcome::Failed
                }
                Err(e) => {
                    tracing::info!(%tenant, branch_id = %id, error = %e, attempts,
                        "distilling a branch failed; retried later");
                    DistillOutcome::Retry
                }
            };
            let prepared = result.unwrap_or_default();
            let end = DistillationEnd { outcome, lessons: &prepared, usage, attempts };
            let stored = store.end_distillation(tenant, id, end).await?;
            for item in &stored {
                memory.kept(item);
            }
            if outcome == DistillOutcome::Done {
                tracing::info!(%tenant, branch_id = %id, lessons = stored.len(),
                    "lessons distilled from a branch");
            }
            lessons += stored.len();
            let outcome = match outcome {
                DistillOutcome::Done => "done",
                DistillOutcome::Retry => "retry",
                DistillOutcome::Failed => "failed",
            };
            memory.metrics().distillation(tenant, outcome);
        }
        Ok((lessons, branches))
    }

    /// Asks the branch's model for its lessons and makes them ready to
    /// store (scrubbed, screened); what the model call was billed is added
    /// to `usage`, even when its answer then proves unreadable.
    async fn distill(
        &self,
        memory: &MemoryBank,
        tenant: &TenantId,
        id: BranchId,
        usage: &mut ModelUsage,
    ) -> Result<Vec<NewMemory>, DistillError> {
        let store = self.service.store();
        let branch = store.branch(tenant, id).await?.ok_or(DistillError::Gone)?;
        let run = store.run(tenant, id).await?.ok_or(DistillError::Gone)?;
        let steps = store.run_steps(tenant, id).await?;
        let model = self
            .models
            .for_tenant(tenant, Some(&run.model))
            .ok_or_else(|| DistillError::NoModel(run.model.clone()))?;
        let kind = match branch.status {
            BranchStatus::Completed => MemoryKind::Strategy,
            _ => MemoryKind::Pitfall,
        };
        let prompt = distill_prompt(&branch, &steps, kind);
        let answer = model
            .complete(
                &distill_system(kind),
                &[Turn::User(prompt)],
                &[],
                ANSWER_TOKENS,
                &self.metrics,
            )
            .await?;
        usage.add(answer.input_tokens, answer.output_tokens);
        let (input, output) = (answer.input_tokens, answer.output_tokens);
        self.metrics.billed(tenant.as_str(), &model.config, input, output, Purpose::Distill);
        let lessons = parse_answer(&answer.text)?;
        let who = Principal::new(tenant.clone(), branch.owner.clone());
        let mut prepared = Vec::new();
        for lesson in lessons.into_iter().take(MAX_LESSONS) {
            let Ok(item) = record(kind, lesson, &branch, memory.config().memory_min_confidence)
            else {
                continue;
            };
            prepared.push(memory.prepare(&who, item)?);
        }
        Ok(prepared)
    }
}

/// Why a distillation did not happen this time.
#[derive(Debug, thiserror::Error)]
enum DistillError {
    #[error("the branch or its run is gone")]
    Gone,
    #[error("the run's model {0:?} is no longer configured for the tenant")]
    NoModel(String),
    #[error("the model failed: {0}")]
    Model(#[from] ModelFailure),
    #[error("the model's answer is not the lessons asked for: {0}")]
    Unreadable(String),
    #[error("claimed {0} times without an end")]
    Abandoned(u32),
    #[error(transparent)]
    Fold(#[from] FoldError),
}

impl From<foldgate_store::StoreError> for DistillError {
    fn from(e: foldgate_store::StoreError) -> Self {
        Self::Fold(e.into())
    }
}

/// A lesson as the memory takes it; the model's confidence, if it gave
/// one, capped at [`MAX_PRIOR`], else the injection threshold.
fn record(
    kind: MemoryKind,
    lesson: Lesson,
    branch: &Branch,
    threshold: f64,
) -> Result<RecordMemory, foldgate_domain::InvalidInput> {
    let prior = lesson.confidence.map_or(threshold, |c| c.min(MAX_PRIOR));
    Ok(RecordMemory {
        kind,
        title: MemoryTitle::parse(&lesson.title)?,
        description: MemoryDescription::parse(&lesson.description)?,
        content: MemoryContent::parse(&lesson.content)?,
        source: MemorySource::Distilled,
        prior: Some(Confidence::clamped(prior)),
        session: Some(branch.session_id.clone()),
        branch: Some(branch.id),
    })
}

/// The lessons in the model's answer: a JSON object, perhaps fenced or
/// surrounded by prose.
fn parse_answer(text: &str) -> Result<Vec<Lesson>, DistillError> {
    let (Some(start), Some(end)) = (text.find('{'), text.rfind('}')) else {
        return Err(DistillError::Unreadable("no JSON object".into()));
    };
    let json = text.get(start..=end).unwrap_or_default();
    // The error's category and place only: its text can quote the answer.
    serde_json::from_str::<Answer>(json).map(|a| a.lessons).map_err(|e| {
        DistillError::Unreadable(format!(
            "{:?} at line {} column {}",
            e.classify(),
            e.line(),
            e.column()
        ))
    })
}

fn distill_system(kind: MemoryKind) -> String {
    let what = match kind {
        MemoryKind::Strategy => {
            "The sub-task below succeeded. Extract the strategies that made it work: reusable \
             approaches another agent could apply to a similar task."
        }
        MemoryKind::Pitfall => {
            "The sub-task below did not succeed. Extract the pitfalls: what went wrong or wasted \
             effort, and what to do instead, so that another agent avoids it."
        }
    };
    format!(
        "You distil lessons from finished sub-tasks for a team of coding agents. {what} Each \
         lesson must be concrete (commands, files, errors, tools involved) and useful beyond \
         this one task; leave out anything specific to this run alone, and never include \
         secrets, credentials or personal data. Give at most {MAX_LESSONS} lessons, or none \
         if there is nothing worth keeping. Answer with JSON only: {{\"lessons\": [{{\"title\": \
         \"at most 120 characters\", \"description\": \"one sentence on when it applies\", \
         \"content\": \"the lesson, at most 2000 characters\", \"confidence\": 0.0-1.0}}]}}"
    )
}

/// The task, what the run did, and how it ended, within
/// [`TRANSCRIPT_CHARS`].
fn distill_prompt(branch: &Branch, steps: &[RunStep], kind: MemoryKind) -> String {
    let talk = Conversation::replay(branch, steps);
    let mut text = String::new();
    for turn in talk.turns.iter().skip(1) {
        let line = match turn {
            Turn::User(text) => format!("[gateway] {text}"),
            Turn::Assistant { text, calls } => {
                let calls: Vec<String> =
                    calls.iter().map(|c| format!("{}({})", c.name, c.arguments)).collect();
                format!("[model] {text} {}", calls.join(" "))
            }
            Turn::ToolResult { content, .. } => format!("[tool result] {content}"),
        };
        text.push_str(&clip(&line, STEP_CHARS));
        text.push('\n');
    }
    let outcome = match (branch.status, branch.reason) {
        (BranchStatus::Completed, _) => "completed".to_owned(),
        (status, Some(reason)) => format!("{status} ({})", reason.as_str()),
        (status, None) => status.to_string(),
    };
    format!(
        "{}\n\nWhat the run did:\n{}\nHow it ended: {outcome}.\nIts finding: {}\n\nThe lessons \
         are {}s.",
        task_text(branch),
        clip(&text, TRANSCRIPT_CHARS),
        clip(branch.result.as_deref().unwrap_or("(none)"), STEP_CHARS),
        kind.as_str()
    )
}

/// `text`'s first `max` characters, marked when cut.
fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut clipped: String = text.chars().take(max).collect();
    clipped.push_str(" […]");
    clipped
}

#[cfg(test)]
mod distill_tests {
    use super::*;

    #[test]
    fn answers_are_read_from_fenced_or_wrapped_json() {
        let wrapped = "Here you go:\n```json\n{\"lessons\": [{\"title\": \"t\", \"content\": \
                       \"c\", \"confidence\": 0.95}]}\n```";
        let lessons = parse_answer(wrapped).unwrap();
        assert_eq!((lessons[0].title.as_str(), lessons[0].confidence), ("t", Some(0.95)));
        assert!(parse_answer("{\"lessons\": []}").unwrap().is_empty());
        assert!(matches!(parse_answer("no lessons"), Err(DistillError::Unreadable(_))));
        assert!(matches!(parse_answer("{\"lessons\": 3}"), Err(DistillError::Unreadable(_))));
    }

    #[test]
    fn clip_marks_what_it_cut() {
        assert_eq!(clip("abc", 3), "abc");
        assert_eq!(clip("abcdef", 3), "abc […]");
        assert_eq!(clip("ééé", 2), "éé […]");
    }
}
