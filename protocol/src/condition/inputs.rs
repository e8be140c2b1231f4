//! What a condition read: the paths into a run's context it names
//! (`steps.triage.output.severity`, `trigger.text`), and their values in
//! one run, so that a page can say why a step was skipped ("the condition
//! `steps.triage.output.severity == "high"` was false: severity was
//! "low"") without evaluating anything itself.

use cel::common::ast::{EntryExpr, Expr, IdedExpr};
use serde_json::Value;

use super::{path_of, Segment};
use crate::api::ConditionInput;

/// Paths kept per condition, at most (the first ones in the source).
pub const MAX_INPUTS: usize = 8;

/// Bytes of one value shown, at most: a longer one is cut, as text.
pub const MAX_INPUT_BYTES: usize = 256;

/// Nodes of the tree walked, at most (the parser nests 96 deep and the
/// source is 2 KiB, so a real condition has far fewer).
const MAX_NODES: usize = 4096;

/// The distinct paths `root` reads under `trigger` and `steps`, each as
/// its names, cut at the first index that is not a literal string.
pub(super) fn paths_of(root: &IdedExpr) -> Vec<Vec<String>> {
    let mut out: Vec<Vec<String>> = Vec::new();
    let mut stack = vec![root];
    let mut seen = 0;
    while let Some(e) = stack.pop() {
        seen += 1;
        if seen > MAX_NODES || out.len() >= MAX_INPUTS {
            break;
        }
        if let Some(path) = path_of(e) {
            let names: Vec<String> = path
                .iter()
                .map_while(|(_, s)| match s {
                    Segment::Name(n) => Some((*n).to_string()),
                    Segment::Dynamic => None,
                })
                .collect();
            if names.len() > 1 && !out.contains(&names) {
                out.push(names);
            }
            continue;
        }
        // Children pushed in reverse, so that paths come in source order.
        let mut children: Vec<&IdedExpr> = Vec::new();
        match &e.expr {
            Expr::Call(c) => children.extend(c.target.iter().map(|t| &**t).chain(c.args.iter())),
            Expr::Select(s) => children.push(&s.operand),
            Expr::List(l) => children.extend(l.elements.iter()),
            Expr::Map(m) => children.extend(m.entries.iter().filter_map(|en| match &en.expr {
                EntryExpr::MapEntry(me) => Some(&me.value),
                EntryExpr::StructField(_) => None,
            })),
            Expr::Comprehension(c) => {
                children.extend([&c.iter_range, &c.accu_init, &c.loop_cond, &c.loop_step, &c.result])
            }
            _ => {}
        }
        stack.extend(children.into_iter().rev());
    }
    out
}

/// Each path's value in `ctx` (`None`: the run has nothing there), a
/// value longer than [`MAX_INPUT_BYTES`] as JSON cut to a string.
pub(super) fn values_in(paths: &[Vec<String>], ctx: &Value) -> Vec<ConditionInput> {
    paths
        .iter()
        .map(|names| {
            let value = names.iter().try_fold(ctx, |v, n| v.get(n.as_str())).map(|v| {
                let text = v.to_string();
                if text.len() <= MAX_INPUT_BYTES {
                    v.clone()
                } else {
                    let cut = text.floor_char_boundary(MAX_INPUT_BYTES);
                    Value::String(format!("{}…", &text[..cut]))
                }
            });
            ConditionInput {
                path: names.join("."),
                value,
            }
        })
        .collect()
}
