//! The step kinds of a workflow, one file each: a kind's definition (its
//! fields as published), its checks at publish, and its output as a typed
//! struct. The fields conditions may read (`steps.<id>.output.<field>`)
//! are derived from that struct's JSON Schema, never listed by hand.
//!
//! [`step_kinds!`](crate::step_kinds) is the one list of kinds: this
//! module builds [`Step`] and [`Action`] from it, and the relay builds its
//! run interpreter's dispatch and its per-kind modules from it too, so a
//! new kind is one line there, one file here and one file in
//! relay/src/workflow/.

use std::borrow::Cow;
use std::sync::OnceLock;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{DefinitionError, OutputSchema};
use crate::condition::{StepShape, Ty};
use crate::template::Template;

/// Calls `$then!` with every step kind as `file: Type`, in wire order
/// (`file` is the kind's action name and the name of its files, here and
/// in the relay). The one list of step kinds.
#[macro_export]
macro_rules! step_kinds {
    ($then:ident) => {
        $then! {
            send_message: SendMessage,
            ask_agent: AskAgent,
            delay: Delay,
            request_approval: RequestApproval,
            call_webhook: CallWebhook,
        }
    };
}

/// What every step kind provides.
pub trait StepKind {
    /// What the step's output holds when it ended (the run's trace keeps it
    /// as JSON; conditions and templates read it as `steps.<id>.output`).
    type Output: Serialize + JsonSchema;

    fn id(&self) -> &str;

    /// Its `if` condition (CEL), if it has one.
    fn condition(&self) -> Option<&str>;

    /// The text template of the kind 9 the step posts, if it posts one.
    fn text(&self) -> Option<&str>;

    /// The template of a message the step posts to agents, with whether it
    /// replies in thread. The agent verifies a delivery's message against
    /// it and refuses a delivery whose step has none.
    fn message(&self) -> Option<(&str, bool)>;

    /// Its checks at publish beyond its JSON's (bounds, templates, URLs),
    /// each error naming its field.
    fn check(&self, at: &Checking<'_>) -> Result<(), DefinitionError>;

    /// The shape its agents' answers must have, when it asks for one
    /// (its properties join the output's fields).
    fn output(&self) -> Option<&OutputSchema> {
        None
    }

    /// The priority of the deliveries it makes (higher is claimed first).
    fn priority(&self) -> i8 {
        super::DEFAULT_PRIORITY
    }
}

/// What a step's checks at publish may look at.
pub struct Checking<'a> {
    /// The step's id.
    pub step: &'a str,
    /// The ids of the steps before it (what templates may name).
    pub earlier: &'a [&'a str],
    /// Its text template, parsed (for a step with a text).
    pub template: Option<&'a Template>,
}

impl Checking<'_> {
    /// The error for `field` of this step.
    pub fn field(&self, field: &'static str, why: impl Into<String>) -> DefinitionError {
        DefinitionError::StepField {
            step: self.step.to_string(),
            field,
            why: why.into(),
        }
    }

    /// Checks an optional whole number of seconds in `field` against its range.
    pub fn seconds(
        &self,
        field: &'static str,
        value: Option<u64>,
        range: std::ops::RangeInclusive<u64>,
    ) -> Result<(), DefinitionError> {
        match value {
            Some(t) if !range.contains(&t) => {
                let (lo, hi) = range.into_inner();
                Err(self.field(field, format!("{t} is not from {lo} to {hi}")))
            }
            _ => Ok(()),
        }
    }
}

/// The fields of an output type and their types for conditions, read from
/// its JSON Schema: `integer` is an int, `number` a double, `string`,
/// `boolean`, `array` and `object` themselves; a field that may be null,
/// or of any JSON value, is dyn (checked when the condition runs).
pub fn fields_of<O: JsonSchema>() -> Vec<(String, Ty)> {
    let schema = schemars::generate::SchemaSettings::draft2020_12()
        .with(|s| s.inline_subschemas = true)
        .into_generator()
        .into_root_schema_for::<O>();
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return Vec::new();
    };
    properties
        .iter()
        .map(|(name, property)| (name.clone(), ty_of(property)))
        .collect()
}

/// The condition type of one property's schema.
fn ty_of(schema: &Value) -> Ty {
    match schema.get("type").and_then(Value::as_str) {
        Some("integer") => Ty::Int,
        Some("number") => Ty::Double,
        Some("string") => Ty::String,
        Some("boolean") => Ty::Bool,
        Some("array") => Ty::List,
        Some("object") => Ty::Map,
        _ => Ty::Dyn,
    }
}

macro_rules! define_steps {
    ($($file:ident: $Kind:ident,)*) => {
        $(mod $file; pub use $file::*;)*

        /// One step. Every step may carry `"if"`, a condition (CEL) that
        /// skips it when false.
        #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(tag = "action", rename_all = "snake_case")]
        pub enum Step {
            $($Kind($Kind),)*
        }

        /// The wire name of a step's action.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum Action {
            $($Kind,)*
        }

        impl Action {
            /// Every action, in wire order.
            pub const ALL: &'static [Action] = &[$(Action::$Kind,)*];

            pub fn as_str(self) -> &'static str {
                match self {
                    $(Action::$Kind => stringify!($file),)*
                }
            }

            /// The fields of this action's output, for conditions (derived
            /// from its output type once per process).
            pub fn output_fields(self) -> &'static [(String, Ty)] {
                static FIELDS: OnceLock<Vec<Vec<(String, Ty)>>> = OnceLock::new();
                let all = FIELDS.get_or_init(|| {
                    vec![$(fields_of::<<$Kind as StepKind>::Output>(),)*]
                });
                &all[self as usize]
            }
        }

        impl Step {
            /// The kind's own definition, for what every kind provides.
            fn kind(&self) -> &dyn Kind {
                match self {
                    $(Step::$Kind(s) => s,)*
                }
            }

            pub fn action(&self) -> Action {
                match self {
                    $(Step::$Kind(_) => Action::$Kind,)*
                }
            }
        }
    };
}

crate::step_kinds!(define_steps);

/// [`StepKind`] without its output type, so that [`Step`] can hand out any
/// kind as one object.
trait Kind {
    fn id(&self) -> &str;
    fn condition(&self) -> Option<&str>;
    fn text(&self) -> Option<&str>;
    fn message(&self) -> Option<(&str, bool)>;
    fn check(&self, at: &Checking<'_>) -> Result<(), DefinitionError>;
    fn output(&self) -> Option<&OutputSchema>;
    fn priority(&self) -> i8;
}

impl<K: StepKind> Kind for K {
    fn id(&self) -> &str {
        StepKind::id(self)
    }
    fn condition(&self) -> Option<&str> {
        StepKind::condition(self)
    }
    fn text(&self) -> Option<&str> {
        StepKind::text(self)
    }
    fn message(&self) -> Option<(&str, bool)> {
        StepKind::message(self)
    }
    fn check(&self, at: &Checking<'_>) -> Result<(), DefinitionError> {
        StepKind::check(self, at)
    }
    fn output(&self) -> Option<&OutputSchema> {
        StepKind::output(self)
    }
    fn priority(&self) -> i8 {
        StepKind::priority(self)
    }
}

impl Step {
    pub fn id(&self) -> &str {
        self.kind().id()
    }

    /// The step's condition, if it has one.
    pub fn condition(&self) -> Option<&str> {
        self.kind().condition()
    }

    /// The text template of a step that posts a kind 9.
    pub fn text(&self) -> Option<&str> {
        self.kind().text()
    }

    /// The message template of a step that posts to agents, with whether
    /// it replies in thread (see [`StepKind::message`]).
    pub fn message(&self) -> Option<(&str, bool)> {
        self.kind().message()
    }

    /// The kind's own checks at publish.
    pub fn check(&self, at: &Checking<'_>) -> Result<(), DefinitionError> {
        self.kind().check(at)
    }

    /// The shape of its agents' answers, if it asks for one.
    pub fn output(&self) -> Option<&OutputSchema> {
        self.kind().output()
    }

    /// The priority of the deliveries it makes.
    pub fn priority(&self) -> i8 {
        self.kind().priority()
    }

    /// What later steps' conditions may read of this one: its kind's
    /// output fields, and its answers' properties.
    pub fn shape(&self) -> StepShape<'_> {
        let fields = self.action().output_fields();
        StepShape {
            id: self.id(),
            fields: match self.output() {
                None => Cow::Borrowed(fields),
                Some(o) => Cow::Owned(fields.iter().cloned().chain(o.fields()).collect()),
            },
        }
    }
}

/// The method of a `call_webhook` step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum HttpMethod {
    #[default]
    Post,
    Put,
}

impl HttpMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            HttpMethod::Post => "POST",
            HttpMethod::Put => "PUT",
        }
    }
}

/// Which replies an `ask_agent` step waits for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Wait {
    /// Every delivery ends.
    #[default]
    All,
    /// One delivery is delivered (the others are then cancelled).
    Any,
}

/// What a step that did not succeed does to its run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnFailure {
    /// The run fails.
    #[default]
    Fail,
    /// The run goes on; the step's output says what happened.
    Continue,
}

/// A step's timeout in seconds: its own, or its kind's default.
pub(crate) fn seconds_or(value: Option<u64>, default: u64) -> i64 {
    i64::try_from(value.unwrap_or(default)).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The derived fields are what docs/workflows.md lists for each action.
    #[test]
    fn output_fields_come_from_the_output_types() {
        let want: &[(Action, &[(&str, Ty)])] = &[
            (
                Action::SendMessage,
                &[("event_id", Ty::String), ("text", Ty::String)],
            ),
            (
                Action::AskAgent,
                &[
                    ("event_id", Ty::String),
                    ("replies", Ty::List),
                    ("reply", Ty::String),
                    ("status", Ty::String),
                ],
            ),
            (Action::Delay, &[("until", Ty::Int)]),
            (
                Action::RequestApproval,
                &[
                    ("by", Ty::String),
                    ("decision", Ty::String),
                    ("event_id", Ty::String),
                ],
            ),
            (Action::CallWebhook, &[("body", Ty::Dyn), ("status", Ty::Int)]),
        ];
        assert_eq!(want.len(), Action::ALL.len());
        for (action, fields) in want {
            let mut got: Vec<(&str, Ty)> = action
                .output_fields()
                .iter()
                .map(|(n, t)| (n.as_str(), *t))
                .collect();
            got.sort_by_key(|(n, _)| *n);
            assert_eq!(&got, fields, "{}", action.as_str());
        }
    }

    #[test]
    fn action_names_are_their_wire_names() {
        for action in Action::ALL {
            let wire = serde_json::to_value(action).unwrap();
            assert_eq!(wire, action.as_str());
        }
    }
}
