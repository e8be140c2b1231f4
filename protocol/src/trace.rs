//! One trace per workflow run, in W3C Trace Context terms: a run's trace
//! id is derived from its community and id (random, stored), so it is the
//! same for its whole life, in every process, across restarts, sleeps,
//! waits and redeliveries; every span of it (the run, each step, each
//! webhook call attempt, each delivery) has an id derived from that trace
//! id and the span's name, so any process computes the same ids again
//! without storing them. The relay sends `traceparent` on webhook calls and in
//! each claimed delivery; the agent continues the trace from there.

use sha2::{Digest, Sha256};

/// A W3C `traceparent`: a trace and the span that is the parent of what
/// the receiver does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
}

impl TraceParent {
    /// The run's root span in a trace (`trace_id` as 32 hex digits, not
    /// all zero). `None` for anything else.
    pub fn of_run(trace_id: &str) -> Option<TraceParent> {
        let bytes: [u8; 16] = hex::decode(trace_id).ok()?.try_into().ok()?;
        let trace = TraceParent {
            trace_id: bytes,
            span_id: [0; 8],
        };
        (bytes != [0; 16]).then(|| trace.child("run"))
    }

    /// The span named `name` under this one (the same ids in any process).
    pub fn child(&self, name: &str) -> TraceParent {
        let digest = Sha256::new()
            .chain_update(self.trace_id)
            .chain_update(self.span_id)
            .chain_update(name.as_bytes())
            .finalize();
        let mut span_id = [0u8; 8];
        span_id.copy_from_slice(&digest[..8]);
        if span_id == [0; 8] {
            span_id[7] = 1;
        }
        TraceParent {
            trace_id: self.trace_id,
            span_id,
        }
    }

    /// The header value: version 00, sampled.
    pub fn header(&self) -> String {
        format!(
            "00-{}-{}-01",
            hex::encode(self.trace_id),
            hex::encode(self.span_id)
        )
    }

    /// Reads a header value (version 00; ids not all zero).
    pub fn parse(header: &str) -> Option<TraceParent> {
        let parts: Vec<&str> = header.trim().split('-').collect();
        let [version, trace, span, flags] = parts.as_slice() else {
            return None;
        };
        if *version != "00" || flags.len() != 2 || hex::decode(flags).is_err() {
            return None;
        }
        let trace_id: [u8; 16] = hex::decode(trace).ok()?.try_into().ok()?;
        let span_id: [u8; 8] = hex::decode(span).ok()?.try_into().ok()?;
        (trace_id != [0; 16] && span_id != [0; 8]).then_some(TraceParent { trace_id, span_id })
    }

    /// The trace id as 32 hex digits.
    pub fn trace_hex(&self) -> String {
        hex::encode(self.trace_id)
    }
}

/// The trace id of run `run_id` of `community`: 32 hex digits, not all
/// zero.
pub fn run_trace_id(community: &str, run_id: &str) -> String {
    let digest = Sha256::new()
        .chain_update(b"workflow-run-trace\0")
        .chain_update(community.as_bytes())
        .chain_update(b"\0")
        .chain_update(run_id.as_bytes())
        .finalize();
    let mut id = [0u8; 16];
    id.copy_from_slice(&digest[..16]);
    if id == [0; 16] {
        id[15] = 1;
    }
    hex::encode(id)
}

/// The span of a run's step.
pub fn step_span(run_trace_id: &str, step_id: &str) -> Option<TraceParent> {
    TraceParent::of_run(run_trace_id).map(|run| run.child(&format!("step:{step_id}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_are_derived_and_headers_round_trip() {
        let id = run_trace_id("default", "r1");
        assert_eq!(id, run_trace_id("default", "r1"));
        assert_ne!(id, run_trace_id("other", "r1"));
        let step = step_span(&id, "call").unwrap();
        assert_eq!(step, step_span(&id, "call").unwrap(), "the same in any process");
        assert_ne!(step, step_span(&id, "other").unwrap());
        assert_eq!(step.trace_hex(), id);
        let call = step.child("call:1");
        let header = call.header();
        assert!(
            header.starts_with(&format!("00-{id}-")) && header.ends_with("-01"),
            "{header}"
        );
        assert_eq!(TraceParent::parse(&header), Some(call));
        for bad in [
            "",
            "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b71692033-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad}");
        }
        assert!(TraceParent::of_run("00000000000000000000000000000000").is_none());
        assert!(TraceParent::of_run("xyz").is_none());
    }
}
