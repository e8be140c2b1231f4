//! Shares of a bounded resource by key: a holder enters under several keys
//! at once (a community, and an owner within it), and waits while any of
//! them is at its cap. The webhook calls' slots use it, so that one
//! owner's hanging calls take at most the owner's share, never the slots
//! of another owner or another community.
//!
//! A holder takes every key of its entry together or none (no partial
//! holding, so no two holders wait on each other); the table holds only
//! keys with a holder, so its size is bounded by the holders.
//!
//! [`weighted_turns`] is the other share: the order in which the engine
//! serves its communities' due runs, by their weights.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// The table of held counts by key.
#[derive(Default)]
pub struct Shares {
    held: Mutex<HashMap<String, usize>>,
    freed: Notify,
}

/// One entry: held until dropped.
pub struct Held {
    shares: Arc<Shares>,
    keys: Vec<String>,
}

impl Shares {
    pub fn new() -> Arc<Shares> {
        Arc::new(Shares::default())
    }

    /// Waits until every `(key, cap)` has a holder fewer than its cap, then
    /// holds one under each. A cap of 0 counts as 1.
    pub async fn enter(self: &Arc<Self>, wanted: &[(String, usize)]) -> Held {
        loop {
            // Registered before the check: a release after it wakes us.
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if self.try_enter(wanted) {
                return Held {
                    shares: self.clone(),
                    keys: wanted.iter().map(|(k, _)| k.clone()).collect(),
                };
            }
            freed.await;
        }
    }

    fn try_enter(&self, wanted: &[(String, usize)]) -> bool {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let room = wanted
            .iter()
            .all(|(key, cap)| held.get(key).copied().unwrap_or(0) < (*cap).max(1));
        if room {
            for (key, _) in wanted {
                *held.entry(key.clone()).or_insert(0) += 1;
            }
        }
        room
    }

    /// How many hold `key` now.
    pub fn holding(&self, key: &str) -> usize {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.get(key).copied().unwrap_or(0)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        {
            let mut held = self.shares.held.lock().unwrap_or_else(|p| p.into_inner());
            for key in &self.keys {
                if let Some(n) = held.get_mut(key) {
                    *n -= 1;
                    if *n == 0 {
                        held.remove(key);
                    }
                }
            }
        }
        self.shares.freed.notify_waiters();
    }
}

/// Items of several lines in weighted turns: each round takes up to
/// `weight` items from each line in order (weight 0 counts as 1), so a
/// line with a long backlog takes its share of each round and no more,
/// and each line keeps its own order. The engine serves its communities'
/// due runs in this order.
pub fn weighted_turns<T>(lines: Vec<(u32, Vec<T>)>) -> Vec<T> {
    let total = lines.iter().map(|(_, items)| items.len()).sum();
    let mut lines: Vec<(usize, std::vec::IntoIter<T>)> = lines
        .into_iter()
        .map(|(weight, items)| (weight.max(1) as usize, items.into_iter()))
        .collect();
    let mut out = Vec::with_capacity(total);
    // Bounded: every round but the last takes at least one item.
    while out.len() < total {
        for (weight, items) in &mut lines {
            out.extend(items.by_ref().take(*weight));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn turns_follow_the_weights_and_keep_each_line_in_order() {
        type Lines = Vec<(u32, Vec<&'static str>)>;
        let table: Vec<(Lines, Vec<&str>)> = vec![
            (vec![], vec![]),
            (vec![(1, vec!["a1", "a2", "a3"])], vec!["a1", "a2", "a3"]),
            (
                vec![(1, vec!["a1", "a2", "a3"]), (1, vec!["b1"])],
                vec!["a1", "b1", "a2", "a3"],
            ),
            (
                vec![(1, vec!["a1", "a2", "a3", "a4"]), (2, vec!["b1", "b2", "b3"])],
                vec!["a1", "b1", "b2", "a2", "b3", "a3", "a4"],
            ),
            (
                vec![(0, vec!["a1", "a2"]), (1, vec![]), (3, vec!["c1"])],
                vec!["a1", "c1", "a2"],
            ),
        ];
        for (lines, want) in table {
            assert_eq!(weighted_turns(lines.clone()), want, "{lines:?}");
        }
    }

    fn entry(community: &str, owner: &str) -> Vec<(String, usize)> {
        vec![(community.to_string(), 3), (format!("{community}/{owner}"), 2)]
    }

    #[tokio::test]
    async fn an_owner_at_its_cap_waits_and_others_go_on() {
        let shares = Shares::new();
        let a1 = shares.enter(&entry("c", "a")).await;
        let _a2 = shares.enter(&entry("c", "a")).await;
        // A third of owner a waits...
        let s = shares.clone();
        let mut third = tokio::spawn(async move { s.enter(&entry("c", "a")).await });
        // ...while owner b of the same community, and another community,
        // enter at once.
        let b = shares.enter(&entry("c", "b")).await;
        let _other = shares.enter(&entry("d", "a")).await;
        assert_eq!(shares.holding("c"), 3);
        assert!(tokio::time::timeout(Duration::from_millis(50), &mut third)
            .await
            .is_err());
        // The community is full: owner b's release lets nobody of c in
        // beyond the caps; a's release lets a's third in.
        drop(b);
        drop(a1);
        let _a3 = third.await.unwrap();
        assert_eq!(shares.holding("c/a"), 2);
        assert_eq!(shares.holding("c/b"), 0);
    }

    #[tokio::test]
    async fn the_table_forgets_keys_nobody_holds() {
        let shares = Shares::new();
        let held: Vec<Held> = vec![
            shares.enter(&entry("c", "a")).await,
            shares.enter(&entry("d", "b")).await,
        ];
        assert_eq!(shares.held.lock().unwrap().len(), 4);
        drop(held);
        assert!(shares.held.lock().unwrap().is_empty());
    }
}
