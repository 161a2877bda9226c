//! An item to record, as an agent, a return or the distiller gives it.

use foldgate_domain::{
    BranchId, BranchStatus, Confidence, InvalidInput, MemoryContent, MemoryDescription, MemoryKind,
    MemorySource, MemoryTitle, SessionId,
};

/// An item to record, as an agent (or the distiller) gives it.
#[derive(Debug, Clone)]
pub struct RecordMemory {
    pub kind: MemoryKind,
    pub title: MemoryTitle,
    pub description: MemoryDescription,
    pub content: MemoryContent,
    pub source: MemorySource,
    /// The confidence it starts from; `None`: the configured default for
    /// its source.
    pub prior: Option<Confidence>,
    pub session: Option<SessionId>,
    pub branch: Option<BranchId>,
}

impl RecordMemory {
    /// An agent's own lesson, from `memory_record`'s arguments.
    pub fn recorded(
        title: &str,
        content: &str,
        kind: &str,
        description: Option<&str>,
    ) -> Result<Self, InvalidInput> {
        Ok(Self {
            kind: kind.parse()?,
            title: MemoryTitle::parse(title)?,
            description: MemoryDescription::parse(description.unwrap_or_default())?,
            content: MemoryContent::parse(content)?,
            source: MemorySource::Recorded,
            prior: None,
            session: None,
            branch: None,
        })
    }

    /// A candidate lesson from a returned branch (`extract_memory`): a
    /// strategy when it completed, a pitfall when not; its description as
    /// the title, its message (scrubbed when it returned) as the content,
    /// each cut to its limit. The agent wrote both, so it is a recorded
    /// item.
    pub fn from_return(
        status: BranchStatus,
        description: &str,
        message: &str,
        session: SessionId,
        branch: BranchId,
    ) -> Result<Self, InvalidInput> {
        let kind = match status {
            BranchStatus::Completed => MemoryKind::Strategy,
            _ => MemoryKind::Pitfall,
        };
        Ok(Self {
            kind,
            title: MemoryTitle::parse(&cut(description, MemoryTitle::MAX_CHARS))?,
            description: MemoryDescription::parse("")?,
            content: MemoryContent::parse(&cut(message, MemoryContent::MAX_CHARS))?,
            source: MemorySource::Recorded,
            prior: None,
            session: Some(session),
            branch: Some(branch),
        })
    }
}

/// `text`'s first `max` characters.
fn cut(text: &str, max: usize) -> String {
    text.chars().take(max).collect()
}
