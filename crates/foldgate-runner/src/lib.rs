//! Gateway-run branches (`branch_run`): foldgate works inside the branch
//! itself, on a model the operator configured, in a context it builds from
//! the branch's description and prompt alone, with the caller's upstream
//! tools, and hands back only the scrubbed finding. This is folding for any
//! client: nothing of the sub-task but the finding enters the caller's
//! context.
//!
//! [`model`] speaks to the providers; [`Runner`] runs the tool loop,
//! durably, one step at a time.

mod metrics;
pub mod model;
mod outcome;
mod runner;

pub use metrics::RunMetrics;
pub use model::{Model, ModelConfig, ModelHealth, ModelOrigin, Models, Provider};
pub use outcome::{RunOutcome, Usage};
pub use runner::{Grant, RunBranch, Runner, RunnerConfig};
