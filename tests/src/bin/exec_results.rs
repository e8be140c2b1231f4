//! Test exec handler that answers per delivery (the agent's per-delivery
//! answer format): reads the turn from stdin, appends the number of
//! messages in the turn to the file named by its first argument, and
//! prints `{"results": [...]}`: a message whose text contains "flaky"
//! fails (code `webhook_refused`, with a message), one containing
//! "later" asks for a retry, every other one is delivered with its own reply.

use std::io::{Read, Write};

use serde_json::{json, Value};

fn main() {
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input).expect("stdin");
    let turn: Value = serde_json::from_str(&input).expect("turn json");
    let messages = turn["messages"].as_array().cloned().unwrap_or_default();
    if let Some(log) = std::env::args().nth(1) {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("log");
        writeln!(f, "{}", messages.len()).expect("log write");
    }
    let results: Vec<Value> = messages
        .iter()
        .map(|m| {
            let id = m["delivery_id"].clone();
            let text = m["text"].as_str().unwrap_or_default();
            if text.contains("flaky") {
                json!({"delivery_id": id, "outcome": "failed", "failure_code": "webhook_refused",
                       "failure_message": format!("the flaky webhook said no to: {text}")})
            } else if text.contains("later") {
                json!({"delivery_id": id, "outcome": "retry", "failure_message": "try later"})
            } else {
                json!({"delivery_id": id, "outcome": "delivered", "reply": format!("ok: {text}")})
            }
        })
        .collect();
    eprintln!("answered {} deliveries", results.len());
    println!("{}", json!({"results": results}));
}
