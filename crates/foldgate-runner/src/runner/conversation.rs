//! A run's conversation: replayed from its steps, and the texts the model is given.

use super::*;

impl Conversation {
    /// The conversation as the written steps left it.
    pub(super) fn replay(branch: &Branch, steps: &[RunStep]) -> Self {
        let mut talk = Self { turns: vec![Turn::User(task_text(branch))], ..Self::default() };
        for step in steps {
            match step.kind {
                StepKind::Model => {
                    if talk.final_text.take().is_some() {
                        // A final answer followed by another call: the
                        // finding was too long and the model was asked to
                        // shorten it.
                        talk.compress_asked = true;
                        talk.turns.push(Turn::User(compress_text(branch.return_tier)));
                    }
                    let body: ModelBody = serde_json::from_str(&step.body)
                        .unwrap_or(ModelBody { text: String::new(), calls: Vec::new() });
                    talk.apply(body);
                }
                StepKind::Tool => {
                    if let Ok(body) = serde_json::from_str::<ToolBody>(&step.body) {
                        talk.answer(body);
                    } else {
                        talk.seq += 1;
                    }
                }
            }
        }
        talk
    }

    pub(super) fn apply(&mut self, body: ModelBody) {
        self.seq += 1;
        self.model_calls += 1;
        if !body.text.trim().is_empty() {
            self.last_text.clone_from(&body.text);
        }
        if body.calls.is_empty() {
            self.final_text = Some(body.text.clone());
        }
        self.pending.clone_from(&body.calls);
        self.turns.push(Turn::Assistant { text: body.text, calls: body.calls });
    }

    pub(super) fn answer(&mut self, body: ToolBody) {
        self.seq += 1;
        self.pending.retain(|c| c.id != body.call_id);
        self.turns.push(Turn::ToolResult { call_id: body.call_id, content: body.content });
    }
}

pub(super) fn task_text(branch: &Branch) -> String {
    if branch.prompt.is_empty() {
        format!("Task: {}", branch.description)
    } else {
        format!("Task: {}\n\n{}", branch.description, branch.prompt)
    }
}

/// The gateway's system text for a run.
pub(super) fn system_text(tier: ReturnTier) -> String {
    format!(
        "You are working on one sub-task on behalf of another agent, which sees none of your work \
         except your final answer. Use the tools you are given to investigate. When you are done, \
         answer with the finding alone: what the other agent needs to go on, in at most {} tokens, \
         with no preamble. If the task cannot be done, say what you found and what stopped you.",
        tier.max_tokens()
    )
}

pub(super) fn compress_text(tier: ReturnTier) -> String {
    format!(
        "Your answer is longer than the {} tokens allowed. Rewrite it as the finding alone, in at \
         most {} tokens.",
        tier.max_tokens(),
        tier.max_tokens()
    )
}

pub(super) fn spec(tool: &UpstreamTool) -> ToolSpec {
    ToolSpec {
        name: tool.tool.name.to_string(),
        description: tool.tool.description.as_deref().unwrap_or_default().to_owned(),
        input_schema: Value::Object((*tool.tool.input_schema).clone()),
    }
}

pub(super) fn specs_json(specs: &[ToolSpec]) -> Value {
    Value::Array(
        specs
            .iter()
            .map(|s| json!({"name": s.name, "description": s.description, "parameters": s.input_schema}))
            .collect(),
    )
}

/// What a model reads of a tool result: its text items, anything else as
/// JSON; the structured content when there is no content.
pub(super) fn result_text(result: &Value) -> String {
    let items = result.get("content").and_then(Value::as_array).cloned().unwrap_or_default();
    let texts: Vec<String> = items
        .iter()
        .map(|item| match item.get("type").and_then(Value::as_str) {
            Some("text") => item.get("text").and_then(Value::as_str).unwrap_or_default().to_owned(),
            _ => item.to_string(),
        })
        .collect();
    if texts.is_empty() {
        return result.get("structuredContent").map(Value::to_string).unwrap_or_default();
    }
    texts.join("\n")
}
