//! The event writer's queue: what waits to be written, one line per
//! author, and batches taken from the lines in turn, bounded by count and
//! by bytes. A burst of large events from one author (each costs the full
//! text index its words) fills batches of its own at most `max_bytes` at a
//! time, and another author's event goes into the next batch instead of
//! waiting behind the whole burst. One author's events keep their order.

use std::collections::{HashMap, VecDeque};

/// Items waiting, by key, served in turn.
pub struct Fair<K, T> {
    lines: HashMap<K, VecDeque<(usize, T)>>,
    /// Keys with a line, in the order they are served.
    turns: VecDeque<K>,
    len: usize,
}

impl<K: std::hash::Hash + Eq + Clone, T> Default for Fair<K, T> {
    fn default() -> Self {
        Fair {
            lines: HashMap::new(),
            turns: VecDeque::new(),
            len: 0,
        }
    }
}

impl<K: std::hash::Hash + Eq + Clone, T> Fair<K, T> {
    /// Queues `item` of `bytes` at the end of `key`'s line.
    pub fn push(&mut self, key: K, bytes: usize, item: T) {
        let line = self.lines.entry(key.clone()).or_default();
        if line.is_empty() {
            self.turns.push_back(key);
        }
        line.push_back((bytes, item));
        self.len += 1;
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Takes the head of each line in turn (a line served goes to the back
    /// of the turns) until `max_items` are taken or their bytes reach
    /// `max_bytes`; the first item is taken whatever its size.
    pub fn take(&mut self, max_items: usize, max_bytes: usize) -> Vec<T> {
        let mut out = Vec::new();
        let mut bytes = 0usize;
        while out.len() < max_items {
            let Some(key) = self.turns.pop_front() else { break };
            let line = self.lines.get_mut(&key).expect("a key in turns has a line");
            let (size, _) = line.front().expect("a line in turns is not empty");
            if !out.is_empty() && bytes.saturating_add(*size) > max_bytes {
                self.turns.push_front(key);
                break;
            }
            let (size, item) = line.pop_front().expect("checked above");
            bytes = bytes.saturating_add(size);
            out.push(item);
            self.len -= 1;
            if line.is_empty() {
                self.lines.remove(&key);
            } else {
                self.turns.push_back(key);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_served_in_turn_in_order_within_bytes() {
        let mut q: Fair<&str, String> = Fair::default();
        for i in 0..5 {
            q.push("burst", 100, format!("b{i}"));
        }
        q.push("other", 10, "o0".into());
        q.push("burst", 100, "b5".into());
        q.push("other", 10, "o1".into());
        assert_eq!(q.len(), 8);
        // In turn: b0, o0, b1, o1, then the bytes bound (250) stops it.
        assert_eq!(q.take(10, 250), ["b0", "o0", "b1", "o1"]);
        // One author's order is kept; the first item goes whatever its size.
        assert_eq!(q.take(10, 50), ["b2"]);
        assert_eq!(q.take(2, 10_000), ["b3", "b4"]);
        assert_eq!(q.take(10, 10_000), ["b5"]);
        assert!(q.is_empty());
        assert!(q.take(10, 10_000).is_empty());
        assert!(q.lines.is_empty() && q.turns.is_empty());
    }
}
