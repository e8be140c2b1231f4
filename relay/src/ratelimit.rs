//! A token bucket: `rate_per_sec` sustained, `burst` at most at once.

use std::time::Instant;

/// Token bucket for one connection.
#[derive(Debug)]
pub struct TokenBucket {
    rate_per_sec: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    pub fn new(rate_per_sec: u32, burst: u32) -> Self {
        assert!(rate_per_sec > 0 && burst > 0);
        Self {
            rate_per_sec: f64::from(rate_per_sec),
            burst: f64::from(burst),
            tokens: f64::from(burst),
            last: Instant::now(),
        }
    }

    /// Takes one token if available.
    pub fn try_take(&mut self) -> bool {
        self.try_take_at(Instant::now())
    }

    /// Whether a token is available, without taking it.
    pub fn has_token(&mut self) -> bool {
        self.refill(Instant::now());
        self.tokens >= 1.0
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.rate_per_sec).min(self.burst);
    }

    fn try_take_at(&mut self, now: Instant) -> bool {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Token buckets by key (for the HTTP API: community and pubkey; failed
/// webhook calls: community and address), bounded:
/// past `MAX_KEYS` keys the table is cleared (everyone gets a fresh burst,
/// memory stays bounded).
pub struct KeyedLimiter {
    buckets: std::sync::Mutex<std::collections::HashMap<String, TokenBucket>>,
    rate_per_sec: u32,
    burst: u32,
}

const MAX_KEYS: usize = 100_000;

impl KeyedLimiter {
    pub fn new(rate_per_sec: u32, burst: u32) -> Self {
        Self {
            buckets: std::sync::Mutex::new(std::collections::HashMap::new()),
            rate_per_sec,
            burst,
        }
    }

    /// Takes one token for `key`.
    pub fn try_take(&self, key: &str) -> bool {
        self.with(key, TokenBucket::try_take)
    }

    /// Whether `key` has a token, without taking it (for limits charged
    /// only when a request fails).
    pub fn has_tokens(&self, key: &str) -> bool {
        self.with(key, TokenBucket::has_token)
    }

    fn with(&self, key: &str, f: impl FnOnce(&mut TokenBucket) -> bool) -> bool {
        let mut map = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= MAX_KEYS && !map.contains_key(key) {
            map.clear();
        }
        f(map
            .entry(key.to_string())
            .or_insert_with(|| TokenBucket::new(self.rate_per_sec, self.burst)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn burst_then_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10, 3);
        b.last = t0;
        assert!(b.try_take_at(t0));
        assert!(b.try_take_at(t0));
        assert!(b.try_take_at(t0));
        assert!(!b.try_take_at(t0));
        assert!(b.try_take_at(t0 + Duration::from_millis(100)));
        assert!(!b.try_take_at(t0 + Duration::from_millis(100)));
        // Never more than the burst, however long it waited.
        let later = t0 + Duration::from_secs(60);
        for _ in 0..3 {
            assert!(b.try_take_at(later));
        }
        assert!(!b.try_take_at(later));
    }
}
