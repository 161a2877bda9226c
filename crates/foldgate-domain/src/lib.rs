//! The vocabulary of context folding, free of I/O.
//!
//! Everything a client sends is parsed into one of these types at the edge, so
//! that the engine and the store only ever see valid values: a [`SessionId`]
//! has the documented character set, a [`Description`] is at most 500
//! characters with control characters removed, a [`BudgetRequest`] has already
//! been capped. The branch state machine ([`BranchStatus`]) and the budget
//! arithmetic ([`Ledger`]) live here so that both store implementations agree
//! on them.

mod branch;
mod budget;
mod caller;
mod clock;
pub mod duration;
mod error;
mod ids;
mod limits;
mod memory;
mod redact;
mod run;
mod session;
mod tenant;
mod text;
mod timeout;

pub use branch::{Branch, BranchStatus, EndReason, Outcome};
pub use budget::{Allocation, BudgetPolicy, BudgetRequest, Consumption, Ledger, Tokens};
pub use caller::Caller;
pub use clock::{Clock, ManualClock, SystemClock};
pub use error::{ConfigError, ErrorCode, InvalidInput};
pub use ids::{BranchId, Principal, SessionId, Subject, TenantId};
pub use limits::{LimitKind, Limits};
pub use memory::{
    Confidence, MemoryContent, MemoryDescription, MemoryId, MemoryItem, MemoryKind, MemorySource,
    MemoryTitle, PRIOR_WEIGHT, Provenance, confidence_after,
};
pub use redact::{redact_url, redact_urls_in};
pub use run::{BranchKind, ReturnTier};
pub use session::{Session, SessionStatus};
/// `VARIANTS`: every variant of the closed sets that label metrics
/// ([`EndReason`], [`LimitKind`], and the refusal and rejection kinds of the
/// store and authentication), so that their series can start at zero.
pub use strum::VariantArray;
pub use tenant::{TenantSettings, ToolListing};
pub use text::{Description, Message, Prompt, strip_control};
pub use timeout::{TimeoutPolicy, TimeoutRequest};
