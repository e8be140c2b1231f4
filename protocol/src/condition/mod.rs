//! Step conditions (`"if"`): CEL expressions over `trigger` and `steps`,
//! parsed and evaluated by the `cel` crate (cel-rust), checked here at
//! publish against what a run can hold.
//!
//! The crate parses and evaluates; it has no type checker. So publish
//! walks the crate's syntax tree once with the types a run's context has
//! (`trigger.text` is a string, `steps.<id>.output.replies` a list, and
//! so on): an unknown name, a field an earlier step's output never has, a
//! step that is not earlier, a function the evaluator does not provide, a
//! comparison of a string with a number, or a result that cannot be a
//! bool is refused with its position, before any run exists. What comes
//! from trigger data (`trigger.body.*`) is dynamic and checked when the
//! condition runs: an error there fails the run (`condition_error`).
//!
//! Bounds: the source is at most [`MAX_CONDITION_BYTES`]; the parser
//! nests at most 96 levels (the crate's default); comprehensions
//! (`exists`, `all`, `map`, `filter`, ...) do not nest and chain at most
//! [`MAX_CHAINED_COMPREHENSIONS`] deep. Evaluation has a budget of its own
//! (`budget`): the bytes of the values it makes and the operations that
//! make them, counted as they are made, so that no condition, whatever
//! the run's context holds, grows a value beyond [`MAX_EVAL_BYTES`].

use cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue};
use cel::{Context, Program};
use serde_json::Value;

mod budget;
mod inputs;
pub use budget::{MAX_EVAL_BYTES, MAX_EVAL_STEPS};
pub use inputs::{MAX_INPUTS, MAX_INPUT_BYTES};

/// Longest condition accepted.
pub const MAX_CONDITION_BYTES: usize = 2048;

/// Most comprehensions in a chain, each iterating over what the one
/// before it made (`l.filter(…).map(…)`).
pub const MAX_CHAINED_COMPREHENSIONS: u32 = 2;

/// The static type of a value of a run's context, as far as publish knows
/// it; `Dyn` is anything (trigger data, list elements).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ty {
    Bool,
    Int,
    Uint,
    Double,
    String,
    Bytes,
    List,
    Map,
    Null,
    Type,
    Dyn,
}

impl Ty {
    fn name(self) -> &'static str {
        match self {
            Ty::Bool => "bool",
            Ty::Int => "int",
            Ty::Uint => "uint",
            Ty::Double => "double",
            Ty::String => "string",
            Ty::Bytes => "bytes",
            Ty::List => "list",
            Ty::Map => "map",
            Ty::Null => "null",
            Ty::Type => "type",
            Ty::Dyn => "dyn",
        }
    }

    fn numeric(self) -> bool {
        matches!(self, Ty::Int | Ty::Uint | Ty::Double)
    }

    /// Whether a value of this type may stand where `want` is asked.
    fn fits(self, want: Ty) -> bool {
        self == want || self == Ty::Dyn || want == Ty::Dyn
    }
}

/// An earlier step a condition may name: its id and the fields of its
/// output with their types (every output may also be `{"skipped": true}`).
#[derive(Debug, Clone)]
pub struct StepShape<'a> {
    pub id: &'a str,
    pub fields: std::borrow::Cow<'static, [(String, Ty)]>,
}

/// Why a condition is refused at publish, and where (1-based).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} (line {line}, column {column})")]
pub struct ConditionError {
    pub message: String,
    pub line: u32,
    pub column: u32,
}

/// A compiled, checked condition.
#[derive(Debug)]
pub struct Condition {
    /// The program's tree with every operation counted (see `budget`).
    counted: IdedExpr,
    /// The context paths it reads, in source order (see `inputs`).
    paths: Vec<Vec<String>>,
}

impl Condition {
    /// Parses and checks `src`; `earlier` are the steps it may name.
    pub fn compile(src: &str, earlier: &[StepShape<'_>]) -> Result<Condition, ConditionError> {
        if src.len() > MAX_CONDITION_BYTES {
            return Err(ConditionError {
                message: format!("the condition is longer than {MAX_CONDITION_BYTES} bytes"),
                line: 1,
                column: 1,
            });
        }
        let program = Program::compile(src).map_err(|e| {
            let first = e.errors.first();
            let (line, column) = first.map_or((1, 1), |p| p.pos);
            ConditionError {
                message: first.map_or_else(|| e.to_string(), |p| p.msg.clone()),
                line: u32::try_from(line).unwrap_or(1),
                column: u32::try_from(column).unwrap_or(0) + 1,
            }
        })?;
        let checker = Checker {
            earlier,
            scope: Vec::new(),
            comprehension_depth: 0,
        };
        let root = program.expression();
        let ty = checker
            .ty(root)
            .map_err(|(id, message)| at(src, &program, id, message))?;
        if !ty.fits(Ty::Bool) {
            let message = format!("the condition must be a bool, not {}", ty.name());
            return Err(at(src, &program, root.id, message));
        }
        let counted = budget::counted(program.expression());
        let paths = inputs::paths_of(program.expression());
        Ok(Condition { counted, paths })
    }

    /// What it reads of a run's context (`trigger.*`, `steps.<id>.output.*`),
    /// each path with its value there: why it was true or false.
    pub fn inputs(&self, ctx: &Value) -> Vec<crate::api::ConditionInput> {
        inputs::values_in(&self.paths, ctx)
    }

    /// Evaluates against a run's context `{"trigger": …, "steps": {id: {"output": …}}}`.
    /// `Err` is the evaluator's message (the run fails with `condition_error`);
    /// an evaluation over its budget of bytes and operations is `too large`.
    pub fn eval(&self, ctx: &Value) -> Result<bool, String> {
        let mut c = Context::default();
        for name in ["trigger", "steps"] {
            c.add_variable(name, &ctx[name])
                .map_err(|e| format!("{name}: {e}"))?;
        }
        let spent = std::sync::Arc::new(budget::Spent::default());
        budget::install(&mut c, spent.clone());
        let result = cel::Value::resolve(&self.counted, &c);
        if spent.over() {
            return Err(format!(
                "too large: the evaluation passed its budget of {MAX_EVAL_BYTES} bytes \
                 or {MAX_EVAL_STEPS} operations"
            ));
        }
        match result {
            Ok(cel::Value::Bool(b)) => Ok(b),
            Ok(other) => Err(format!("the condition gave {:?}, not a bool", other.type_of())),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// A position from a node id: the crate keeps byte offsets.
fn at(src: &str, program: &Program, id: u64, message: String) -> ConditionError {
    let offset = program
        .source_info()
        .offset_for(id)
        .map_or(0, |(start, _)| start as usize)
        .min(src.len());
    let before = &src[..src.floor_char_boundary(offset)];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    ConditionError {
        message,
        line: u32::try_from(line).unwrap_or(u32::MAX),
        column: u32::try_from(column).unwrap_or(u32::MAX),
    }
}

type Checked = Result<Ty, (u64, String)>;

/// Fields of `trigger` a condition may read (the names templates have).
const TRIGGER_FIELDS: &[(&str, Ty)] = &[
    ("text", Ty::String),
    ("author", Ty::String),
    ("event_id", Ty::String),
    ("channel", Ty::String),
    ("body", Ty::Map),
];

/// Names CEL itself defines (type names), usable as identifiers.
const TYPE_NAMES: &[&str] = &[
    "bool",
    "int",
    "uint",
    "double",
    "string",
    "bytes",
    "list",
    "map",
    "null_type",
    "type",
];

struct Checker<'a, 's> {
    earlier: &'a [StepShape<'s>],
    /// Variables bound by the comprehensions around the node.
    scope: Vec<String>,
    comprehension_depth: u32,
}

impl Checker<'_, '_> {
    fn ty(&self, e: &IdedExpr) -> Checked {
        if let Some(path) = path_of(e) {
            return self.path_ty(&path);
        }
        match &e.expr {
            Expr::Literal(l) => Ok(literal_ty(l)),
            Expr::Ident(name) => self.ident_ty(e.id, name),
            Expr::Select(s) if s.test => {
                // `has(a.b)`: the field tested must be one a run can hold.
                if let Some(mut p) = path_of(&s.operand) {
                    p.push((e.id, Segment::Name(&s.field)));
                    self.path_ty(&p)?;
                } else {
                    self.ty(&s.operand)?;
                }
                Ok(Ty::Bool)
            }
            Expr::Select(s) => {
                let operand = self.ty(&s.operand)?;
                match operand {
                    Ty::Map | Ty::Dyn => Ok(Ty::Dyn),
                    other => Err((e.id, format!("{} has no field {}", other.name(), s.field))),
                }
            }
            Expr::List(l) => {
                for el in &l.elements {
                    self.ty(el)?;
                }
                Ok(Ty::List)
            }
            Expr::Map(m) => {
                for entry in &m.entries {
                    if let EntryExpr::MapEntry(me) = &entry.expr {
                        self.ty(&me.key)?;
                        self.ty(&me.value)?;
                    } else {
                        return Err((entry.id, "struct literals are not supported".into()));
                    }
                }
                Ok(Ty::Map)
            }
            Expr::Struct(_) => Err((e.id, "struct literals are not supported".into())),
            Expr::Comprehension(c) => self.comprehension_ty(e.id, c),
            Expr::Call(call) => self.call_ty(e.id, call),
            Expr::Unspecified => Err((e.id, "empty expression".into())),
        }
    }

    fn ident_ty(&self, id: u64, name: &str) -> Checked {
        if self.scope.iter().any(|s| s == name) {
            return Ok(Ty::Dyn);
        }
        match name {
            "trigger" | "steps" => Ok(Ty::Map),
            n if TYPE_NAMES.contains(&n) => Ok(Ty::Type),
            n => Err((id, format!("unknown name {n}: use trigger or steps"))),
        }
    }

    /// The type at a path rooted at a variable (`trigger.text`,
    /// `steps["a"].output.reply`), checked against what a run holds.
    fn path_ty(&self, path: &[(u64, Segment<'_>)]) -> Checked {
        let (root_id, Segment::Name(root)) = path[0] else {
            unreachable!("a path starts with its root name");
        };
        if self.scope.iter().any(|s| s == root) {
            return Ok(Ty::Dyn);
        }
        let last = path.last().map_or(root_id, |(id, _)| *id);
        match root {
            "trigger" => trigger_path_ty(path, last),
            "steps" => self.step_path_ty(path, last),
            _ => unreachable!("path_of roots a path at trigger or steps"),
        }
    }

    fn step_path_ty(&self, path: &[(u64, Segment<'_>)], last: u64) -> Checked {
        let name = |i: usize| segment(path, i, "steps must be indexed with a literal step id");
        let Some((id, step)) = name(1)? else {
            return Ok(Ty::Map);
        };
        let Some(shape) = self.earlier.iter().find(|s| s.id == step) else {
            return Err((id, format!("steps.{step} names no earlier step")));
        };
        let Some((id, output)) = name(2)? else {
            return Ok(Ty::Map);
        };
        if output != "output" {
            return Err((
                id,
                format!("use steps.{step}.output.<field>, not steps.{step}.{output}"),
            ));
        }
        let Some((id, f)) = name(3)? else {
            return Ok(Ty::Map);
        };
        let ty = if f == "skipped" {
            Ty::Bool
        } else if let Some((_, ty)) = shape.fields.iter().find(|(n, _)| n == f) {
            *ty
        } else {
            let names: Vec<&str> = shape.fields.iter().map(|(n, _)| n.as_str()).collect();
            return Err((
                id,
                format!(
                    "the output of step {step} has no field {f}: it has {}, skipped",
                    names.join(", ")
                ),
            ));
        };
        match (ty, path.len()) {
            (ty, 4) => Ok(ty),
            (Ty::List | Ty::Map | Ty::Dyn, _) => Ok(Ty::Dyn),
            (ty, _) => Err((
                last,
                format!("steps.{step}.output.{f} is a {}, it has no fields", ty.name()),
            )),
        }
    }

    fn comprehension_ty(&self, id: u64, c: &cel::common::ast::ComprehensionExpr) -> Checked {
        if self.comprehension_depth >= 1 {
            return Err((
                id,
                "comprehensions (exists, all, map, filter) may not nest".into(),
            ));
        }
        if comprehensions_in(&c.iter_range, 0) >= MAX_CHAINED_COMPREHENSIONS {
            return Err((
                id,
                format!(
                    "at most {MAX_CHAINED_COMPREHENSIONS} comprehensions may be chained \
                     (one's list made by another)"
                ),
            ));
        }
        let range = self.ty(&c.iter_range)?;
        if !matches!(range, Ty::List | Ty::Map | Ty::Dyn) {
            return Err((c.iter_range.id, format!("cannot iterate over a {}", range.name())));
        }
        let accu = self.ty(&c.accu_init)?;
        let mut inner = Checker {
            earlier: self.earlier,
            scope: self.scope.clone(),
            comprehension_depth: self.comprehension_depth + 1,
        };
        inner.scope.push(c.iter_var.clone());
        inner.scope.extend(c.iter_var2.clone());
        inner.scope.push(c.accu_var.clone());
        inner.ty(&c.loop_cond)?;
        inner.ty(&c.loop_step)?;
        // The result reads the accumulator, whose type is its initial value's.
        match &c.result.expr {
            Expr::Ident(n) if *n == c.accu_var => Ok(accu),
            _ => inner.ty(&c.result),
        }
    }

    fn call_ty(&self, id: u64, call: &cel::common::ast::CallExpr) -> Checked {
        let mut args = Vec::with_capacity(call.args.len() + 1);
        if let Some(t) = &call.target {
            args.push(self.ty(t)?);
        }
        for a in &call.args {
            args.push(self.ty(a)?);
        }
        let f = call.func_name.as_str();
        let want = |ok: bool, what: &str| {
            if ok {
                Ok(())
            } else {
                let got: Vec<_> = args.iter().map(|t| t.name()).collect();
                Err((id, format!("{what} does not apply to ({})", got.join(", "))))
            }
        };
        match f {
            "_&&_" | "_||_" | "!_" | "@not_strictly_false" => {
                want(args.iter().all(|t| t.fits(Ty::Bool)), operator(f))?;
                Ok(Ty::Bool)
            }
            "_==_" | "_!=_" | "@in" => Ok(Ty::Bool),
            "_<_" | "_<=_" | "_>_" | "_>=_" => {
                want(comparable(args[0], args[1]), operator(f))?;
                Ok(Ty::Bool)
            }
            "_+_" | "_-_" | "_*_" | "_/_" | "_%_" => arithmetic(f, &args).ok_or_else(|| {
                let got: Vec<_> = args.iter().map(|t| t.name()).collect();
                (
                    id,
                    format!("{} does not apply to ({})", operator(f), got.join(", ")),
                )
            }),
            "-_" => {
                want(args[0].numeric() || args[0] == Ty::Dyn, "-")?;
                Ok(args[0])
            }
            "_?_:_" => {
                want(args[0].fits(Ty::Bool), "?:")?;
                Ok(if args[1] == args[2] { args[1] } else { Ty::Dyn })
            }
            "_[_]" => {
                want(matches!(args[0], Ty::List | Ty::Map | Ty::Dyn), "[]")?;
                Ok(Ty::Dyn)
            }
            "size" => {
                let t = args[0];
                want(
                    args.len() == 1 && matches!(t, Ty::String | Ty::Bytes | Ty::List | Ty::Map | Ty::Dyn),
                    "size",
                )?;
                Ok(Ty::Int)
            }
            "contains" | "startsWith" | "endsWith" | "matches" => {
                want(
                    call.target.is_some() && args.len() == 2 && args.iter().all(|t| t.fits(Ty::String)),
                    f,
                )?;
                Ok(Ty::Bool)
            }
            "int" | "uint" | "double" | "string" | "bytes" | "bool" | "dyn" | "type" => {
                want(args.len() == 1, f)?;
                Ok(match f {
                    "int" => Ty::Int,
                    "uint" => Ty::Uint,
                    "double" => Ty::Double,
                    "string" => Ty::String,
                    "bytes" => Ty::Bytes,
                    "bool" => Ty::Bool,
                    "type" => Ty::Type,
                    _ => Ty::Dyn,
                })
            }
            "max" | "min" => {
                want(!args.is_empty(), f)?;
                Ok(Ty::Dyn)
            }
            other => Err((id, format!("unknown function {other}"))),
        }
    }
}

/// How many comprehensions the tree of `e` holds (counting stops past
/// the chain's bound; `depth` bounds the walk).
fn comprehensions_in(e: &IdedExpr, depth: u32) -> u32 {
    if depth > 128 {
        return MAX_CHAINED_COMPREHENSIONS;
    }
    let sum = |es: &mut dyn Iterator<Item = &IdedExpr>| -> u32 {
        es.map(|x| comprehensions_in(x, depth + 1)).sum()
    };
    match &e.expr {
        Expr::Comprehension(c) => 1 + comprehensions_in(&c.iter_range, depth + 1),
        Expr::Call(call) => sum(&mut call.target.iter().map(|t| &**t).chain(call.args.iter())),
        Expr::Select(s) => comprehensions_in(&s.operand, depth + 1),
        Expr::List(l) => sum(&mut l.elements.iter()),
        Expr::Map(m) => sum(&mut m.entries.iter().filter_map(|en| match &en.expr {
            EntryExpr::MapEntry(me) => Some(&me.value),
            EntryExpr::StructField(_) => None,
        })),
        _ => 0,
    }
}

/// Segment `i` of a path as a name (`None` past its end); an index that
/// is not a literal string is refused with `why`.
fn segment<'p>(
    path: &[(u64, Segment<'p>)],
    i: usize,
    why: &str,
) -> Result<Option<(u64, &'p str)>, (u64, String)> {
    match path.get(i) {
        Some((id, Segment::Name(n))) => Ok(Some((*id, *n))),
        Some((id, Segment::Dynamic)) => Err((*id, why.to_string())),
        None => Ok(None),
    }
}

/// The type at a path under `trigger`.
fn trigger_path_ty(path: &[(u64, Segment<'_>)], last: u64) -> Checked {
    let Some((id, f)) = segment(path, 1, "this name must be indexed with a literal string")? else {
        return Ok(Ty::Map);
    };
    let Some((_, ty)) = TRIGGER_FIELDS.iter().find(|(n, _)| *n == f) else {
        let names: Vec<_> = TRIGGER_FIELDS.iter().map(|(n, _)| *n).collect();
        return Err((id, format!("trigger has no field {f}: use {}", names.join(", "))));
    };
    if path.len() == 2 {
        return Ok(*ty);
    }
    if *ty == Ty::Map {
        return Ok(Ty::Dyn);
    }
    Err((last, format!("trigger.{f} is a {}, it has no fields", ty.name())))
}

fn operator(f: &str) -> &str {
    f.trim_matches('_').trim_start_matches('@')
}

fn comparable(a: Ty, b: Ty) -> bool {
    a == Ty::Dyn
        || b == Ty::Dyn
        || (a.numeric() && b.numeric())
        || (a == b && matches!(a, Ty::String | Ty::Bytes | Ty::Bool))
}

fn arithmetic(f: &str, args: &[Ty]) -> Option<Ty> {
    let (a, b) = (args[0], args[1]);
    if a == Ty::Dyn || b == Ty::Dyn {
        return Some(Ty::Dyn);
    }
    match (f, a, b) {
        (_, a, b) if a == b && a.numeric() => Some(a),
        ("_+_", Ty::String, Ty::String) => Some(Ty::String),
        ("_+_", Ty::Bytes, Ty::Bytes) => Some(Ty::Bytes),
        ("_+_", Ty::List, Ty::List) => Some(Ty::List),
        _ => None,
    }
}

fn literal_ty(l: &LiteralValue) -> Ty {
    match l {
        LiteralValue::Boolean(_) => Ty::Bool,
        LiteralValue::Int(_) => Ty::Int,
        LiteralValue::UInt(_) => Ty::Uint,
        LiteralValue::Double(_) => Ty::Double,
        LiteralValue::String(_) => Ty::String,
        LiteralValue::Bytes(_) => Ty::Bytes,
        LiteralValue::Null => Ty::Null,
    }
}

/// One step of a path: a field name (`.x`, `["x"]`) or an index that is
/// not a literal string.
#[derive(Debug, Clone, Copy)]
enum Segment<'e> {
    Name(&'e str),
    Dynamic,
}

/// A chain of field selections and indexes down to a variable, root first:
/// `steps["a"].output.reply` is steps, a, output, reply. `None` for
/// anything else (a call, a literal, a `has()` test).
fn path_of(e: &IdedExpr) -> Option<Vec<(u64, Segment<'_>)>> {
    match &e.expr {
        Expr::Ident(name) if name == "trigger" || name == "steps" => Some(vec![(e.id, Segment::Name(name))]),
        Expr::Select(s) if !s.test => {
            let mut p = path_of(&s.operand)?;
            p.push((e.id, Segment::Name(&s.field)));
            Some(p)
        }
        Expr::Call(c) if c.func_name == "_[_]" && c.target.is_none() && c.args.len() == 2 => {
            let mut p = path_of(&c.args[0])?;
            let seg = match &c.args[1].expr {
                Expr::Literal(LiteralValue::String(s)) => Segment::Name(s.inner()),
                _ => Segment::Dynamic,
            };
            // An index into a list or trigger data is dynamic by nature:
            // only a name's own fields are checked.
            p.push((e.id, seg));
            Some(p)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workflow::Action;
    use serde_json::json;

    /// What an `ask_agent` step's output holds.
    const ASK: Action = Action::AskAgent;

    fn earlier() -> Vec<StepShape<'static>> {
        vec![
            StepShape {
                id: "triage",
                fields: ASK.output_fields().into(),
            },
            StepShape {
                id: "a-b",
                fields: ASK.output_fields().into(),
            },
        ]
    }

    fn ctx() -> Value {
        json!({"trigger": {"text": "Prod is DOWN", "body": {"n": 3, "tags": ["x", "y"]}},
               "steps": {"triage": {"output": {"reply": "urgent: db", "status": "delivered",
                          "replies": [{"agent": "a", "text": "urgent: db"}], "event_id": "e"}},
                         "a-b": {"output": {"skipped": true}}}})
    }

    fn run(src: &str) -> Result<bool, String> {
        Condition::compile(src, &earlier())
            .map_err(|e| e.to_string())?
            .eval(&ctx())
    }

    #[test]
    fn inputs_name_what_it_read_with_values_in_source_order() {
        let c = Condition::compile(
            "steps.triage.output.reply.startsWith('x') || trigger.text == 'a' \
             || has(steps['a-b'].output.reply) || trigger.body.tags[1] == 'y' \
             || trigger.text != 'b'",
            &earlier(),
        )
        .unwrap();
        let got: Vec<(String, Option<Value>)> =
            c.inputs(&ctx()).into_iter().map(|i| (i.path, i.value)).collect();
        assert_eq!(
            got,
            vec![
                ("steps.triage.output.reply".into(), Some(json!("urgent: db"))),
                ("trigger.text".into(), Some(json!("Prod is DOWN"))),
                // has(): the map it tests; a dynamic index: the list.
                ("steps.a-b.output".into(), Some(json!({"skipped": true}))),
                ("trigger.body.tags".into(), Some(json!(["x", "y"]))),
            ]
        );
        // A value too long to show is cut; a path the run lacks is None.
        let long = json!({"trigger": {"text": "z".repeat(1000)}, "steps": {}});
        let inputs = c.inputs(&long);
        let Some(Value::String(cut)) = &inputs[1].value else {
            panic!("{inputs:?}")
        };
        assert!(cut.len() <= MAX_INPUT_BYTES + 3 && cut.ends_with('…'), "{cut}");
        assert_eq!(inputs[0].value, None);
    }

    #[test]
    fn evaluates_over_trigger_and_steps() {
        assert_eq!(run("steps.triage.output.reply.startsWith('urgent')"), Ok(true));
        assert_eq!(run("steps['a-b'].output.skipped"), Ok(true));
        assert_eq!(run("has(steps['a-b'].output.reply)"), Ok(false));
        assert_eq!(
            run("trigger.text.contains('DOWN') && size(trigger.text) > 3"),
            Ok(true)
        );
        assert_eq!(run("int(trigger.body.n) >= 3"), Ok(true));
        assert_eq!(run("trigger.body.tags.exists(t, t == 'y')"), Ok(true));
        assert_eq!(run("steps.triage.output.replies.all(r, r.text != '')"), Ok(true));
        assert_eq!(run("trigger.text.matches('(?i)down')"), Ok(true));
        assert_eq!(
            run("steps.triage.output.status in ['failed', 'timed_out']"),
            Ok(false)
        );
        assert_eq!(run("trigger.body.n > 2 ? true : false"), Ok(true));
    }

    #[test]
    fn runtime_errors_are_errors_not_false() {
        // A skipped step has no reply: reading it is an error, `has()` is the test.
        assert!(run("steps['a-b'].output.reply == 'x'").is_err());
        assert!(run("trigger.body.missing == 1").is_err());
        assert!(
            run("trigger.body.n").is_err(),
            "a dynamic value that is not a bool"
        );
    }

    #[test]
    fn refuses_at_publish_with_a_position() {
        let refused = |src: &str| Condition::compile(src, &earlier()).unwrap_err();
        let e = refused("trigger.text ==");
        assert_eq!(e.line, 1, "{e}");
        let e = refused("steps.later.output.reply == 'x'");
        assert!(e.message.contains("names no earlier step"), "{e}");
        assert_eq!((e.line, e.column), (1, 6), "{e}");
        let e = refused("true &&\n  steps.triage.output.nope == 'x'");
        assert!(e.message.contains("has no field nope"), "{e}");
        assert_eq!(e.line, 2, "{e}");
        for (src, why) in [
            ("env.HOME == 'x'", "unknown name env"),
            ("trigger.secret == 'x'", "trigger has no field secret"),
            ("trigger.text > 3", "does not apply to (string, int)"),
            ("trigger.text", "must be a bool, not string"),
            ("1 + 2", "must be a bool, not int"),
            ("trigger.text.lowerAscii() == 'x'", "unknown function lowerAscii"),
            ("steps.triage.reply == 'x'", "use steps.triage.output"),
            ("steps[trigger.text].output.reply == ''", "literal step id"),
            (
                "trigger.body.a.exists(x, trigger.body.b.exists(y, x == y))",
                "may not nest",
            ),
            ("trigger.text.x == 1", "has no fields"),
            ("!trigger.text", "does not apply"),
        ] {
            let e = refused(src);
            assert!(e.message.contains(why), "{src}: {e}");
        }
        assert!(Condition::compile(&"true || ".repeat(400), &earlier()).is_err());
        let e = refused("trigger.body.l.map(x, x).map(x, x).map(x, x).size() > 0");
        assert!(e.message.contains("may be chained"), "{e}");
        // Two in a chain are fine.
        Condition::compile(
            "trigger.body.l.filter(x, x != '').map(x, x).size() > 0",
            &earlier(),
        )
        .unwrap();
    }

    /// A context whose trigger body holds a string of `n` bytes (`s`) and a
    /// list of `n` one-byte strings (`l`).
    fn big(n: usize) -> Value {
        let l: Vec<String> = (0..n).map(|_| "x".to_string()).collect();
        json!({"trigger": {"text": "", "body": {"s": "a".repeat(n), "l": l}}, "steps": {}})
    }

    fn run_on(src: &str, ctx: &Value) -> Result<bool, String> {
        Condition::compile(src, &earlier())
            .map_err(|e| format!("refused at publish: {e}"))?
            .eval(ctx)
    }

    #[test]
    fn growth_is_refused_as_too_large() {
        let ctx = big(100_000);
        let attacks = [
            // A string doubled per link.
            "[trigger.body.s].map(x, x + x).map(x, x + x + x + x).size() > 0".to_string(),
            // A long sum of a large string.
            format!("size({}) > 0", vec!["trigger.body.s"; 40].join(" + ")),
            // Literals copy what they hold.
            format!("size([{}]) > 0", vec!["trigger.body.s"; 40].join(", ")),
            format!(
                "size({{{}}}) > 0",
                (0..40)
                    .map(|i| format!("'{i}': trigger.body.s"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            // A list times a list.
            "trigger.body.l.map(x, trigger.body.l).size() > 0".to_string(),
            "trigger.body.l.map(x, trigger.body.s).size() > 0".to_string(),
            // An error CEL would absorb does not hide the spending.
            format!("size({}) > 0 || true", vec!["trigger.body.s"; 40].join(" + ")),
        ];
        for src in &attacks {
            let e = run_on(src, &ctx).expect_err(src);
            assert!(e.starts_with("too large"), "{src}: {e}");
        }
        // The same shapes over small values pass.
        let small = big(10);
        for src in &attacks {
            assert!(run_on(src, &small).is_ok(), "{src}");
        }
        // Reading a large value costs nothing: nothing is made.
        let reads =
            "size(trigger.body.s) == 100000 && trigger.body.s.startsWith('a') && size(trigger.body.l) > 9";
        assert_eq!(run_on(reads, &ctx), Ok(true));
        // A comprehension copies its list's elements one by one: its list
        // counts, as does each operation.
        assert_eq!(run_on("trigger.body.l.all(x, x == 'x')", &big(1_000)), Ok(true));
        let e = run_on("trigger.body.l.all(x, x == 'x')", &ctx).unwrap_err();
        assert!(e.starts_with("too large"), "{e}");
    }
}
