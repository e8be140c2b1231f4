//! NIP-50 search queries as this relay reads them: the words of the
//! query (each must appear in an event's `content`, in any case), with the
//! `key:value` extensions NIP-50 names (`include:spam`, `domain:`,
//! `language:`, `sentiment:`, `nsfw:`) and any other `key:value` token
//! ignored, never refused.
//!
//! One reading serves both places a query is answered: the stores (SQLite
//! FTS5 and PostgreSQL full-text, which tokenise on the same boundaries)
//! and live matching of new events, so a subscription sees the same events
//! live as it would have read stored.

/// Most words of one query used (the rest are ignored): a bound on the
/// statement a query builds and on live matching's work per event.
pub const MAX_WORDS: usize = 16;

/// Longest word kept, in bytes (longer ones are cut at a character boundary).
pub const MAX_WORD_BYTES: usize = 64;

/// A parsed search: its words, lower-cased, in query order, each once.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Query {
    words: Vec<String>,
}

impl Query {
    /// Reads a filter's `search` string. A query of only extensions (or of
    /// nothing) has no words: it constrains nothing.
    pub fn parse(search: &str) -> Query {
        let mut words: Vec<String> = Vec::new();
        for token in search.split_whitespace() {
            if is_extension(token) {
                continue;
            }
            for word in tokens(token) {
                if words.len() == MAX_WORDS {
                    return Query { words };
                }
                if !words.contains(&word) {
                    words.push(word);
                }
            }
        }
        Query { words }
    }

    /// The words, lower-cased.
    pub fn words(&self) -> &[String] {
        &self.words
    }

    /// Whether the query constrains anything.
    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    /// Whether `content` holds every word of the query as a word of its own.
    pub fn matches(&self, content: &str) -> bool {
        self.words.is_empty() || self.matches_words(&Words::of(content))
    }

    /// Whether `words` (an event's, read once for every query) holds every
    /// word of the query.
    pub fn matches_words(&self, words: &Words) -> bool {
        self.words.iter().all(|w| words.0.contains(w))
    }

    /// The query in SQLite FTS5 syntax: each word a quoted string, all
    /// required (FTS5's implicit AND). Quotes inside a word are doubled, so
    /// no word can change the query's structure.
    pub fn fts5(&self) -> String {
        let quoted: Vec<String> = self
            .words
            .iter()
            .map(|w| format!("\"{}\"", w.replace('"', "\"\"")))
            .collect();
        quoted.join(" ")
    }

    /// The query for PostgreSQL's `plainto_tsquery('simple', …)`: the words
    /// separated by spaces (every one required).
    pub fn plain(&self) -> String {
        self.words.join(" ")
    }
}

/// The words of a text, as a query reads them: read once per event, then
/// looked up by every query it is matched against.
#[derive(Debug, Clone, Default)]
pub struct Words(std::collections::HashSet<String>);

impl Words {
    pub fn of(content: &str) -> Words {
        Words(tokens(content).collect())
    }
}

/// `key:value` with a plain key and a value (NIP-50's extensions and any
/// like them); a URL (`https://…`) is not one.
fn is_extension(token: &str) -> bool {
    match token.split_once(':') {
        Some((key, value)) => {
            !key.is_empty()
                && key
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
                && !value.is_empty()
                && !value.starts_with('/')
        }
        None => false,
    }
}

/// The words of `text`: runs of letters and digits, lower-cased, each cut
/// to [`MAX_WORD_BYTES`]. The stores tokenise on the same boundaries
/// (FTS5 `unicode61`, PostgreSQL's `simple` configuration).
fn tokens(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| {
            let mut lower = w.to_lowercase();
            if lower.len() > MAX_WORD_BYTES {
                let mut cut = MAX_WORD_BYTES;
                while !lower.is_char_boundary(cut) {
                    cut -= 1;
                }
                lower.truncate(cut);
            }
            lower
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_lowered_and_extensions_ignored() {
        let q = Query::parse("Nostr  RELAY include:spam language:en nostr");
        assert_eq!(q.words(), ["nostr", "relay"]);
        assert!(Query::parse("include:spam domain:example.com").is_empty());
        assert!(Query::parse("   ").is_empty());
        // A URL is not an extension: its words are searched.
        assert_eq!(Query::parse("https://x.org").words(), ["https", "x", "org"]);
    }

    #[test]
    fn every_word_must_appear_as_a_word() {
        let q = Query::parse("durable delivery");
        assert!(q.matches("Durable agent DELIVERY, at last."));
        assert!(!q.matches("durable agents"));
        assert!(!Query::parse("deliver").matches("delivery"));
        assert!(Query::parse("").matches("anything"));
        assert!(Query::parse("café").matches("Un CAFÉ noir"));
    }

    #[test]
    fn fts5_quotes_every_word() {
        assert_eq!(Query::parse("a b").fts5(), "\"a\" \"b\"");
        assert_eq!(Query::parse("x\"y").fts5(), "\"x\" \"y\"");
        assert_eq!(Query::parse("NEAR OR").fts5(), "\"near\" \"or\"");
    }

    #[test]
    fn bounded() {
        let many: Vec<String> = (0..100).map(|i| format!("w{i}")).collect();
        assert_eq!(Query::parse(&many.join(" ")).words().len(), MAX_WORDS);
        let long = "é".repeat(100);
        let q = Query::parse(&long);
        assert!(q.words()[0].len() <= MAX_WORD_BYTES);
    }
}
