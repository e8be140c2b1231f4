//! A budget for one evaluation of a condition: the bytes of the values it
//! produces and the operations that produce them, counted as they are
//! produced.
//!
//! The `cel` crate (0.15) evaluates without one, and its values own their
//! contents (a list's clone copies every element): `[s].map(x, x + x).map(...)`
//! doubles a string per link, and `s + s + …` multiplies a 1 MiB trigger
//! body by the number of `+` the source holds. So before evaluation the
//! syntax tree is rewritten: every call (each operator, each function) and
//! every comprehension becomes the argument of [`BUDGET_FN`], a function
//! this module registers, which measures the value its argument produced
//! (a value read from the run's context, borrowed, costs nothing) and
//! fails the evaluation once the total passes [`MAX_EVAL_BYTES`] or the
//! count passes [`MAX_EVAL_STEPS`]. Every element of a list literal and
//! every value of a map literal becomes the argument of [`COPY_FN`],
//! which measures it even when it is borrowed: the literal copies it
//! (`[s, s, s]` holds three copies of `s`). Measuring stops at what is
//! left of the budget, so it costs no more than the budget either. A value is measured before any larger
//! one is built from it, so what one evaluation holds is bounded by about
//! twice the byte budget. Once spent, the budget stays spent: every later
//! call fails at once, even where CEL would absorb an error (`x || true`),
//! and the evaluation as a whole is refused as too large.
//!
//! The nodes a comprehension's step writes its accumulator with
//! (`@result + [x]`, and the `?:` around it) are left as they are: the
//! evaluator recognises that shape to append in place, and measuring the
//! accumulator at every element would count it once per element.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use cel::common::ast::{operators, CallExpr, EntryExpr, Expr, IdedExpr};
use cel::common::types::{CelBytes, CelMap, CelMapKey, CelString};
use cel::common::value::{CowVal, Val};
use cel::{Context, FunctionContext};

/// Bytes the values of one evaluation may add up to.
pub const MAX_EVAL_BYTES: u64 = 256 * 1024;

/// Operations one evaluation may perform (calls and comprehensions).
pub const MAX_EVAL_STEPS: u64 = 10_000;

/// The function the rewritten tree calls around each counted node; `@`
/// cannot start a name in CEL source, so no condition can call it.
pub const BUDGET_FN: &str = "@budget";

/// The function around each element a literal copies.
pub const COPY_FN: &str = "@copy";

/// What one evaluation has spent.
#[derive(Debug, Default)]
pub struct Spent {
    bytes: AtomicU64,
    steps: AtomicU64,
    over: AtomicBool,
}

impl Spent {
    /// Whether the evaluation went past its budget.
    pub fn over(&self) -> bool {
        self.over.load(Ordering::Relaxed)
    }

    /// Counts one operation, and the value `v` it produced (`None`: a
    /// value it only passed on); `false` once over budget.
    fn charge(&self, v: Option<&dyn Val>) -> bool {
        if self.over() {
            return false;
        }
        let steps = self.steps.fetch_add(1, Ordering::Relaxed) + 1;
        let left = MAX_EVAL_BYTES.saturating_sub(self.bytes.load(Ordering::Relaxed));
        let bytes = v.map_or(0, |v| size_within(v, left, 0));
        let total = self
            .bytes
            .fetch_add(bytes, Ordering::Relaxed)
            .saturating_add(bytes);
        if total > MAX_EVAL_BYTES || steps > MAX_EVAL_STEPS {
            self.over.store(true, Ordering::Relaxed);
            return false;
        }
        true
    }
}

/// The shape of a function the `cel` crate calls with its arguments
/// evaluated (its own alias for it is private).
type Function = Box<
    dyn for<'c, 'a> Fn(&mut FunctionContext<'c, 'a>) -> Result<CowVal<'c, 'a>, cel::ExecutionError>
        + Send
        + Sync,
>;

/// Registers [`BUDGET_FN`] and [`COPY_FN`] in `ctx`, charging `spent`.
pub fn install(ctx: &mut Context<'_, '_>, spent: Arc<Spent>) {
    for (name, borrowed_too) in [(BUDGET_FN, false), (COPY_FN, true)] {
        let spent = spent.clone();
        let f: Function = Box::new(move |ftx: &mut FunctionContext<'_, '_>| {
            let Some(value) = ftx.args.pop() else {
                return Err(ftx.error("takes one argument"));
            };
            // A value read from the context or the program is produced by
            // no one, unless a literal is about to copy it.
            let produced = borrowed_too || matches!(value, CowVal::Owned(_));
            if spent.charge(produced.then_some(&*value)) {
                Ok(value)
            } else {
                Err(ftx.error("too large: the condition's evaluation is over its budget"))
            }
        });
        ctx.add_function(name, f)
            .expect("the budget functions' names are free");
    }
}

/// The bytes `v` holds (its strings, bytes and entries; 16 for an atom,
/// the room a list sets aside for an element), or a number above `limit`
/// once it has counted past it.
fn size_within(v: &dyn Val, limit: u64, depth: u32) -> u64 {
    const ATOM: u64 = 16;
    if depth > 64 {
        return ATOM;
    }
    if let Some(s) = v.downcast_ref::<CelString<'_>>() {
        return ATOM + s.inner().len() as u64;
    }
    if let Some(b) = v.downcast_ref::<CelBytes<'_>>() {
        return ATOM + b.inner().len() as u64;
    }
    let mut total = ATOM;
    if let Some(m) = v.downcast_ref::<CelMap<'_>>() {
        for (k, e) in m.inner() {
            let key = match k {
                CelMapKey::String(s) => s.inner().len() as u64,
                _ => 0,
            };
            total += ATOM + key + size_within(&**e, limit.saturating_sub(total), depth + 1);
            if total > limit {
                return total;
            }
        }
        return total;
    }
    if let Some(items) = v.as_iterable() {
        let mut it = items.iter();
        while let Some(e) = it.next() {
            total += size_within(e, limit.saturating_sub(total), depth + 1);
            if total > limit {
                return total;
            }
        }
    }
    total
}

/// The tree of `e` with every call and comprehension counted.
pub fn counted(e: &IdedExpr) -> IdedExpr {
    let rewritten = IdedExpr {
        id: e.id,
        expr: children(&e.expr, None),
    };
    match &e.expr {
        // Its operands are counted as copied, before it runs; its value is
        // counted where it is copied in turn.
        Expr::Call(call) if call.func_name == operators::ADD => rewritten,
        Expr::Call(_) | Expr::Comprehension(_) => wrap(rewritten),
        _ => rewritten,
    }
}

/// Whether operand `i` of `call` (the target first, when there is one)
/// is copied into its value, and so counted before the call runs: `+`
/// copies both sides, the conversions and `max`/`min` their argument;
/// `matches` compiles its pattern.
fn copies_operand(call: &CallExpr, i: usize) -> bool {
    let operands = call.args.len() + usize::from(call.target.is_some());
    match call.func_name.as_str() {
        operators::ADD | "string" | "bytes" | "max" | "min" => true,
        "matches" => i + 1 == operands,
        _ => false,
    }
}

fn wrap(inner: IdedExpr) -> IdedExpr {
    wrap_in(BUDGET_FN, inner)
}

/// `inner` copied into a literal: counted whatever it is (a counted
/// call's value once when made, once more when copied).
fn copied(inner: &IdedExpr) -> IdedExpr {
    wrap_in(COPY_FN, counted(inner))
}

fn wrap_in(name: &str, inner: IdedExpr) -> IdedExpr {
    IdedExpr {
        id: inner.id,
        expr: Expr::Call(CallExpr {
            func_name: name.to_string(),
            target: None,
            args: vec![inner],
        }),
    }
}

/// `e` with its children counted; `accu` is the accumulator of the
/// comprehension whose step `e` is part of.
fn children(e: &Expr, accu: Option<&str>) -> Expr {
    match e {
        Expr::Call(call) => {
            let skip = usize::from(call.target.is_some());
            let operand = |i: usize, a: &IdedExpr| {
                if copies_operand(call, i) {
                    wrap_in(COPY_FN, in_step(a, accu))
                } else {
                    in_step(a, accu)
                }
            };
            Expr::Call(CallExpr {
                func_name: call.func_name.clone(),
                target: call.target.as_ref().map(|t| Box::new(operand(0, t))),
                args: call
                    .args
                    .iter()
                    .enumerate()
                    .map(|(i, a)| operand(i + skip, a))
                    .collect(),
            })
        }
        Expr::Comprehension(c) => {
            let mut c = (**c).clone();
            // Every element is copied into the loop's variable in turn, and
            // `map` and `filter` set aside room for as many results.
            c.iter_range = copied(&c.iter_range);
            c.accu_init = counted(&c.accu_init);
            c.loop_cond = in_step(&c.loop_cond, Some(&c.accu_var));
            c.loop_step = in_step(&c.loop_step, Some(&c.accu_var));
            c.result = in_step(&c.result, Some(&c.accu_var));
            Expr::Comprehension(Box::new(c))
        }
        Expr::Select(s) => {
            let mut s = s.clone();
            s.operand = Box::new(counted(&s.operand));
            Expr::Select(s)
        }
        Expr::List(l) => {
            let mut l = l.clone();
            l.elements = l.elements.iter().map(copied).collect();
            Expr::List(l)
        }
        Expr::Map(m) => {
            let mut m = m.clone();
            for entry in &mut m.entries {
                if let EntryExpr::MapEntry(me) = &mut entry.expr {
                    me.key = copied(&me.key);
                    me.value = copied(&me.value);
                }
            }
            Expr::Map(m)
        }
        other => other.clone(),
    }
}

/// A node of a comprehension's step: counted, unless it writes the
/// accumulator (a call whose first argument is it, as `accu + [x]` and
/// `accu && p`, or a `?:` choosing it), whose shape the evaluator reads.
fn in_step(e: &IdedExpr, accu: Option<&str>) -> IdedExpr {
    let Some(accu) = accu else { return counted(e) };
    let is_accu = |a: &IdedExpr| matches!(&a.expr, Expr::Ident(n) if n == accu);
    let keeps_shape = match &e.expr {
        Expr::Call(call) => {
            call.target.is_none()
                && (call.args.first().is_some_and(is_accu)
                    || (call.func_name == operators::CONDITIONAL && call.args.iter().any(is_accu)))
        }
        _ => false,
    };
    if !keeps_shape {
        return counted(e);
    }
    let Expr::Call(call) = &e.expr else {
        unreachable!("checked above")
    };
    IdedExpr {
        id: e.id,
        expr: Expr::Call(CallExpr {
            func_name: call.func_name.clone(),
            target: call.target.as_ref().map(|t| Box::new(counted(t))),
            args: call.args.iter().map(|a| in_step(a, Some(accu))).collect(),
        }),
    }
}
