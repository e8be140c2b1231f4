//! The shape of an `ask_agent` step's answer (its `output`): a subset of
//! JSON Schema (draft 2020-12) that a relay and an agent both read as
//! typed structs. The relay checks it at publish and checks each answer
//! against it at finish with the `jsonschema` crate; conditions read its
//! properties as typed fields (`steps.<id>.output.<property>`).
//!
//! The subset: a top-level `object` with `properties` (string, integer,
//! number, boolean, or an array of one of those), `required`,
//! `additionalProperties`; per property `description`, `enum`,
//! `minLength`/`maxLength` (strings), `minItems`/`maxItems` and `items`
//! (arrays). Anything else is refused at publish, by name.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::condition::Ty;

/// Most properties of an output.
pub const MAX_OUTPUT_PROPERTIES: usize = 32;
/// Most values of one `enum`.
pub const MAX_ENUM_VALUES: usize = 64;
/// Longest output schema, serialized (bytes).
pub const MAX_OUTPUT_SCHEMA_BYTES: usize = 8 * 1024;
/// Longest `description` (characters).
pub const MAX_DESCRIPTION_CHARS: usize = 500;
/// Most revisions a step may ask for, and its default.
pub const MAX_REVISE: u8 = 5;
pub const DEFAULT_REVISE: u8 = 2;
/// Most validation errors quoted back to the agent, and the longest one
/// (characters).
pub const MAX_QUOTED_ERRORS: usize = 10;
pub const MAX_ERROR_CHARS: usize = 300;
/// Names an output property may not take: the `ask_agent` output's own
/// fields, and `skipped` (every output may be `{"skipped": true}`).
pub const RESERVED_FIELDS: &[&str] = &["event_id", "status", "reply", "replies", "skipped"];

/// The tag that numbers a revision message: `["workflow-revision", "<n>"]`.
pub const REVISION_TAG: &str = "workflow-revision";
/// What separates the step's text from the rest of a revision message.
pub const REVISION_SEPARATOR: &str = "\n\n---\n";

/// The text of revision `n` (of at most `max`) of a step's message: the
/// step's own text, then [`REVISION_SEPARATOR`], the errors that refused
/// the last answer, and the shape asked for. An agent checks the step's
/// text (rendered again) is the part before the separator.
pub fn revision_text(step_text: &str, n: u32, max: u8, errors: &[&str], schema: &Value) -> String {
    let mut text = format!(
        "{step_text}{REVISION_SEPARATOR}Revision {n} of {max}: the answer does not fit the step's output.\n"
    );
    for e in errors {
        text.push_str("- ");
        text.push_str(e);
        text.push('\n');
    }
    text.push_str("Answer again with one JSON object that fits this JSON Schema:\n");
    text.push_str(&schema.to_string());
    text
}

/// An `ask_agent` step's `output`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputSchema {
    #[serde(rename = "type")]
    pub ty: ObjectType,
    pub properties: BTreeMap<String, Property>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub required: Vec<String>,
    #[serde(
        rename = "additionalProperties",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub additional_properties: Option<bool>,
}

/// The one top-level type: an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ObjectType {
    Object,
}

/// One property of an output (or the items of an array property).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Property {
    #[serde(rename = "type")]
    pub ty: PropertyType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(rename = "enum", default, skip_serializing_if = "Option::is_none")]
    pub one_of: Option<Vec<Value>>,
    #[serde(rename = "minLength", default, skip_serializing_if = "Option::is_none")]
    pub min_length: Option<u64>,
    #[serde(rename = "maxLength", default, skip_serializing_if = "Option::is_none")]
    pub max_length: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items: Option<Box<Property>>,
    #[serde(rename = "minItems", default, skip_serializing_if = "Option::is_none")]
    pub min_items: Option<u64>,
    #[serde(rename = "maxItems", default, skip_serializing_if = "Option::is_none")]
    pub max_items: Option<u64>,
}

/// A property's JSON type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PropertyType {
    String,
    Integer,
    Number,
    Boolean,
    Array,
}

impl PropertyType {
    /// Its type for conditions.
    fn ty(self) -> Ty {
        match self {
            PropertyType::String => Ty::String,
            PropertyType::Integer => Ty::Int,
            PropertyType::Number => Ty::Double,
            PropertyType::Boolean => Ty::Bool,
            PropertyType::Array => Ty::List,
        }
    }

    /// Whether `v` is a JSON value of this type.
    fn holds(self, v: &Value) -> bool {
        match self {
            PropertyType::String => v.is_string(),
            PropertyType::Integer => v.is_i64() || v.is_u64(),
            PropertyType::Number => v.is_number(),
            PropertyType::Boolean => v.is_boolean(),
            PropertyType::Array => v.is_array(),
        }
    }
}

/// Whether `name` may name an output property: an identifier conditions
/// can read (`[A-Za-z_][A-Za-z0-9_]{0,63}`), not a reserved field.
fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    first_ok
        && name.len() <= 64
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !RESERVED_FIELDS.contains(&name)
}

impl Property {
    /// Checks one property (`items`: it is an array's items, which may not
    /// be arrays themselves).
    fn check(&self, name: &str, items: bool) -> Result<(), String> {
        let at = |why: &str| Err(format!("{name}: {why}"));
        let is = |t: PropertyType| self.ty == t;
        if items && is(PropertyType::Array) {
            return at("arrays of arrays are not supported");
        }
        if self
            .description
            .as_ref()
            .is_some_and(|d| d.chars().count() > MAX_DESCRIPTION_CHARS)
        {
            return at(&format!("description is over {MAX_DESCRIPTION_CHARS} characters"));
        }
        if (self.min_length.is_some() || self.max_length.is_some()) && !is(PropertyType::String) {
            return at("minLength and maxLength apply to strings only");
        }
        let arrays_only = self.min_items.is_some() || self.max_items.is_some() || self.items.is_some();
        if arrays_only && !is(PropertyType::Array) {
            return at("items, minItems and maxItems apply to arrays only");
        }
        if bounds_crossed(self.min_length, self.max_length) || bounds_crossed(self.min_items, self.max_items)
        {
            return at("a minimum is above its maximum");
        }
        if let Some(values) = &self.one_of {
            if values.is_empty() || values.len() > MAX_ENUM_VALUES {
                return at(&format!("enum needs 1 to {MAX_ENUM_VALUES} values"));
            }
            if is(PropertyType::Array) || values.iter().any(|v| !self.ty.holds(v)) {
                return at("every enum value must be of the property's type (not an array)");
            }
        }
        match (&self.items, is(PropertyType::Array)) {
            (Some(items), _) => items.check(&format!("{name}.items"), true),
            (None, true) => at("an array needs items (the type of its elements)"),
            (None, false) => Ok(()),
        }
    }
}

fn bounds_crossed(min: Option<u64>, max: Option<u64>) -> bool {
    matches!((min, max), (Some(lo), Some(hi)) if lo > hi)
}

impl OutputSchema {
    /// Checks the schema at publish; the error names what is wrong.
    pub fn check(&self) -> Result<(), String> {
        let n = self.properties.len();
        if n == 0 || n > MAX_OUTPUT_PROPERTIES {
            return Err(format!("needs 1 to {MAX_OUTPUT_PROPERTIES} properties"));
        }
        for (name, property) in &self.properties {
            if !valid_name(name) {
                return Err(format!(
                    "property {name:?} must be [A-Za-z_][A-Za-z0-9_]{{0,63}} and none of {}",
                    RESERVED_FIELDS.join(", ")
                ));
            }
            property.check(name, false)?;
        }
        for (i, name) in self.required.iter().enumerate() {
            if !self.properties.contains_key(name) || self.required[..i].contains(name) {
                return Err(format!(
                    "required names {name:?}, which is not a property or repeats"
                ));
            }
        }
        let json = self.to_value();
        if json.to_string().len() > MAX_OUTPUT_SCHEMA_BYTES {
            return Err(format!("is over {MAX_OUTPUT_SCHEMA_BYTES} bytes"));
        }
        jsonschema::validator_for(&json).map_err(|e| format!("is not a valid JSON Schema: {e}"))?;
        Ok(())
    }

    /// The schema as JSON (what agents receive, and what is compiled).
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("an output schema serializes")
    }

    /// The fields conditions may read, with their types.
    pub fn fields(&self) -> impl Iterator<Item = (String, Ty)> + '_ {
        self.properties.iter().map(|(name, p)| (name.clone(), p.ty.ty()))
    }

    /// Checks an answer's text: one JSON object (optionally in a
    /// ```` ```json ```` fence) valid against the schema. `Ok`: the
    /// schema's properties it holds (what the step's output gains);
    /// `Err`: what is wrong, at most [`MAX_QUOTED_ERRORS`] lines.
    pub fn check_answer(&self, text: &str) -> Result<Map<String, Value>, Vec<String>> {
        let answer = parse_answer(text).map_err(|e| vec![e])?;
        let validator = jsonschema::validator_for(&self.to_value()).map_err(|e| vec![e.to_string()])?;
        let errors: Vec<String> = validator
            .iter_errors(&answer)
            .take(MAX_QUOTED_ERRORS)
            .map(|e| {
                let path = e.instance_path().to_string();
                let at = if path.is_empty() {
                    "the answer".to_string()
                } else {
                    path
                };
                format!("{at}: {e}").chars().take(MAX_ERROR_CHARS).collect()
            })
            .collect();
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(self.fields_of(&answer))
    }

    /// The schema's properties held by a valid answer's text (an answer
    /// that does not parse gives none).
    pub fn answer_fields(&self, text: &str) -> Map<String, Value> {
        parse_answer(text).map(|a| self.fields_of(&a)).unwrap_or_default()
    }

    fn fields_of(&self, answer: &Value) -> Map<String, Value> {
        let Some(object) = answer.as_object() else {
            return Map::new();
        };
        object
            .iter()
            .filter(|(k, _)| self.properties.contains_key(*k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

/// An answer's JSON: the text, trimmed, without a surrounding
/// ```` ``` ```` fence (its first line, e.g. ```` ```json ````, dropped).
fn parse_answer(text: &str) -> Result<Value, String> {
    let mut body = text.trim();
    if let Some(fenced) = body.strip_prefix("```") {
        let inner = fenced.split_once('\n').map_or("", |(_, rest)| rest);
        body = inner.trim_end().strip_suffix("```").unwrap_or(inner).trim();
    }
    match serde_json::from_str::<Value>(body) {
        Ok(v) if v.is_object() => Ok(v),
        Ok(_) => Err("the answer must be one JSON object".into()),
        Err(e) => Err(format!("the answer is not JSON: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema(v: Value) -> Result<OutputSchema, String> {
        let s: OutputSchema = serde_json::from_value(v).map_err(|e| e.to_string())?;
        s.check().map(|()| s)
    }

    fn triage() -> OutputSchema {
        schema(json!({"type": "object",
            "properties": {"severity": {"type": "string", "enum": ["low", "high"]},
                           "score": {"type": "integer"},
                           "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3}},
            "required": ["severity"]}))
        .unwrap()
    }

    #[test]
    fn a_subset_schema_is_accepted_and_typed() {
        let fields: Vec<(String, Ty)> = triage().fields().collect();
        assert_eq!(
            fields,
            vec![
                ("score".into(), Ty::Int),
                ("severity".into(), Ty::String),
                ("tags".into(), Ty::List)
            ]
        );
    }

    #[test]
    fn what_is_outside_the_subset_is_refused_by_name() {
        let refused = |v: Value, want: &str| {
            let e = schema(v).unwrap_err();
            assert!(e.contains(want), "{e} should say {want}");
        };
        let props = |p: Value| json!({"type": "object", "properties": p});
        refused(json!({"type": "array", "properties": {}}), "unknown variant");
        refused(props(json!({})), "1 to 32 properties");
        refused(props(json!({"status": {"type": "string"}})), "none of");
        refused(props(json!({"a-b": {"type": "string"}})), "must be");
        refused(props(json!({"a": {"type": "object"}})), "unknown variant");
        refused(
            props(json!({"a": {"type": "string", "pattern": "x"}})),
            "unknown field",
        );
        refused(
            props(json!({"a": {"type": "integer", "maxLength": 3}})),
            "strings only",
        );
        refused(props(json!({"a": {"type": "array"}})), "needs items");
        refused(
            props(json!({"a": {"type": "array", "items": {"type": "array", "items": {"type": "string"}}}})),
            "arrays of arrays",
        );
        refused(props(json!({"a": {"type": "string", "enum": [1]}})), "enum value");
        refused(
            props(json!({"a": {"type": "string", "minLength": 3, "maxLength": 2}})),
            "above",
        );
        refused(
            json!({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]}),
            "not a property",
        );
    }

    #[test]
    fn answers_are_checked_against_the_schema() {
        let s = triage();
        let ok = s
            .check_answer("```json\n{\"severity\": \"high\", \"score\": 3, \"other\": 1}\n```")
            .unwrap();
        assert_eq!(Value::Object(ok), json!({"severity": "high", "score": 3}));
        let errors = s
            .check_answer(r#"{"severity": "mid", "tags": ["a", "b", "c", "d"]}"#)
            .unwrap_err();
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors.iter().any(|e| e.starts_with("/severity:")), "{errors:?}");
        assert!(errors.iter().any(|e| e.starts_with("/tags:")), "{errors:?}");
        let missing = s.check_answer("{}").unwrap_err();
        assert!(
            missing[0].starts_with("the answer:") && missing[0].contains("severity"),
            "{missing:?}"
        );
        assert!(s.check_answer("high").unwrap_err()[0].contains("not JSON"));
        assert!(s.check_answer("[1]").unwrap_err()[0].contains("one JSON object"));
        assert!(s.check_answer(r#"{"severity": "low", "score": 1.5}"#).is_err());
    }
}
