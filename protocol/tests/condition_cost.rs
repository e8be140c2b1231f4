//! What the worst conditions one can publish cost when they run: the
//! memory one evaluation takes beyond the evaluator's own copy of its
//! context (measured by a counting allocator: the peak above the start,
//! less that of `true` on the same context) against a trigger body of
//! 1 MiB, the largest a manual run accepts. Each figure is printed
//! (`cargo test -p protocol --test condition_cost -- --nocapture`); the
//! bound asserted is on bytes, which do not depend on the machine.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use protocol::condition::{Condition, MAX_CONDITION_BYTES};
use serde_json::{json, Value};

struct Counting;

static NOW: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let now = NOW.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(now, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        NOW.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// The peak bytes allocated above the start while `f` runs, and its time.
fn measure<T>(f: impl FnOnce() -> T) -> (T, usize, std::time::Duration) {
    let start = NOW.load(Ordering::Relaxed);
    PEAK.store(start, Ordering::Relaxed);
    let t = Instant::now();
    let out = f();
    let took = t.elapsed();
    (out, PEAK.load(Ordering::Relaxed) - start, took)
}

/// `part` joined by `sep` as many times as fits in the publish limit,
/// between `head` and `tail`.
fn longest(head: &str, part: &str, sep: &str, tail: &str) -> String {
    let mut parts = vec![part.to_string()];
    loop {
        let next = format!("{head}{}{sep}{part}{tail}", parts.join(sep));
        if next.len() > MAX_CONDITION_BYTES {
            return format!("{head}{}{tail}", parts.join(sep));
        }
        parts.push(part.to_string());
    }
}

#[test]
fn the_worst_conditions_cost_under_a_megabyte() {
    const MIB: usize = 1024 * 1024;
    // A 1 MiB body: one string, or a list of short strings.
    let items = MIB / 4;
    let body_s = json!({"s": "a".repeat(MIB - 64)});
    let body_l = json!({"l": vec!["ab"; items]});
    // Bodies small enough that the same attacks stay within the budget:
    // the most an evaluation that is not refused can take.
    let small_s = json!({"s": "a".repeat(3_000)});
    let small_l = json!({"l": vec!["ab"; 600]});
    let ctx = |body: &Value| json!({"trigger": {"text": "", "body": body}, "steps": {}});
    let chain =
        "[trigger.body.s].map(x, x + x + x + x + x + x + x + x).map(x, x + x + x + x + x + x + x + x)";
    let cases: Vec<(&str, String, &Value)> = vec![
        ("chained doubling", format!("{chain}.size() > 0"), &body_s),
        (
            "sum of the body",
            longest("size(", "trigger.body.s", " + ", ") > 0"),
            &body_s,
        ),
        (
            "list literal of the body",
            longest("size([", "trigger.body.s", ", ", "]) > 0"),
            &body_s,
        ),
        (
            "list times list",
            "trigger.body.l.map(x, trigger.body.l).size() > 0".into(),
            &body_l,
        ),
        (
            "list times string",
            "trigger.body.l.map(x, x + x + x + x + x + x + x + x).size() > 0".into(),
            &body_l,
        ),
        (
            "many scans",
            longest("", "trigger.body.l.exists(x, x == 'z')", " || ", ""),
            &body_l,
        ),
    ];
    let within: Vec<(&str, String, &Value)> = cases
        .iter()
        .map(|(name, src, body)| {
            let small = if std::ptr::eq(*body, &body_s) {
                &small_s
            } else {
                &small_l
            };
            (*name, src.clone(), small)
        })
        .collect();
    let cases = cases.into_iter().chain(within);
    let truth = Condition::compile("true", &[]).unwrap();
    for (name, src, body) in cases {
        assert!(src.len() <= MAX_CONDITION_BYTES, "{name}");
        let condition = Condition::compile(&src, &[]).unwrap_or_else(|e| panic!("{name}: {e}"));
        let ctx = ctx(body);
        // What any condition costs on this context: the evaluator's own
        // copy of it.
        let (_, baseline, copying) = measure(|| truth.eval(&ctx));
        let (out, peak, took) = measure(|| condition.eval(&ctx));
        let beyond = peak.saturating_sub(baseline);
        let verdict = match &out {
            Ok(b) => format!("{b}"),
            Err(e) => e.split(':').next().unwrap_or_default().to_string(),
        };
        println!(
            "{name:<24} {:>4} B source, {:>7} B body: context copy {:>8} B {:>6.2} ms; \
             beyond it {:>6} B {:>6.2} ms -> {verdict}",
            src.len(),
            body.to_string().len(),
            baseline,
            copying.as_secs_f64() * 1000.0,
            beyond,
            took.saturating_sub(copying).as_secs_f64() * 1000.0
        );
        assert!(
            beyond < 1_000_000,
            "{name}: {beyond} bytes beyond the context's own copy"
        );
    }
}
