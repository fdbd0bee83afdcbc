//! Topic exchange: binding keys are patterns of words separated by `.`, where
//! `*` matches exactly one word and `#` matches zero or more words.
//!
//! Words are split the way RabbitMQ splits them: the empty key has no words,
//! and every `.` separates two words even when they are empty, so `"a..b"` is
//! `["a", "", "b"]` and `"a."` is `["a", ""]`.
//!
//! Patterns live in a trie over words with separate `*` and `#` children, so a
//! route walks only the branches that can match instead of every binding.
//! `#` is matched by backtracking over how many words it swallows; a memo of
//! (`#` node, position) pairs keeps patterns with several `#`s polynomial where
//! naive backtracking is exponential.

use std::collections::{HashMap, HashSet};

use super::{deduplicate_tail, Destination};

/// Longest binding key accepted, in bytes: the AMQP shortstr limit, which every
/// key bound over the wire already obeys. It also bounds the trie's depth, and
/// with it the recursion depth of routing and of dropping the trie.
pub const BINDING_KEY_LENGTH_MAX: usize = 255;

const WORD_SEPARATOR: u8 = b'.';
const WILDCARD_ONE: &[u8] = b"*";
const WILDCARD_ANY: &[u8] = b"#";

/// Rejects binding keys the trie will not hold.
///
/// # Errors
/// A message naming the limit when the key is longer than
/// [`BINDING_KEY_LENGTH_MAX`].
pub(super) fn validate_binding_key(key: &str) -> Result<(), String> {
    if key.len() > BINDING_KEY_LENGTH_MAX {
        return Err(format!(
            "binding key of {} bytes is longer than the limit of {BINDING_KEY_LENGTH_MAX} bytes",
            key.len()
        ));
    }
    Ok(())
}

/// The words of a key; the empty key has none.
fn split_words(key: &[u8]) -> impl Iterator<Item = &[u8]> {
    let words = (!key.is_empty()).then(|| key.split(|byte| *byte == WORD_SEPARATOR));
    words.into_iter().flatten()
}

/// Splits the first word off a non-empty remainder. `None` means no words are
/// left, which differs from `Some(b"")`: one empty word left.
fn next_word(words: &[u8]) -> (&[u8], Option<&[u8]>) {
    match words.iter().position(|byte| *byte == WORD_SEPARATOR) {
        Some(separator) => (&words[..separator], Some(&words[separator + 1..])),
        None => (words, None),
    }
}

#[derive(Default)]
struct Node {
    literal_children: HashMap<Box<[u8]>, Node>,
    one_word_child: Option<Box<Node>>,
    any_words_child: Option<Box<Node>>,
    /// Destinations whose binding key ends at this node. Each appears once: the
    /// table reports each (destination, key) pair once and a node is one key.
    destinations: Vec<Destination>,
}

impl Node {
    fn is_empty(&self) -> bool {
        self.destinations.is_empty()
            && self.literal_children.is_empty()
            && self.one_word_child.is_none()
            && self.any_words_child.is_none()
    }

    fn child_mut(&mut self, word: &[u8]) -> &mut Node {
        if word == WILDCARD_ONE {
            self.one_word_child.get_or_insert_with(Box::default)
        } else if word == WILDCARD_ANY {
            self.any_words_child.get_or_insert_with(Box::default)
        } else {
            self.literal_children.entry(Box::from(word)).or_default()
        }
    }

    /// Removes `destination` from the node at the end of `words`; returns
    /// whether this node is now empty, so the parent can prune it.
    fn remove(&mut self, words: &[&[u8]], destination: &Destination) -> bool {
        match words.split_first() {
            None => self.destinations.retain(|existing| existing != destination),
            Some((word, rest)) => {
                if *word == WILDCARD_ONE {
                    if let Some(child) = self.one_word_child.as_mut() {
                        if child.remove(rest, destination) {
                            self.one_word_child = None;
                        }
                    }
                } else if *word == WILDCARD_ANY {
                    if let Some(child) = self.any_words_child.as_mut() {
                        if child.remove(rest, destination) {
                            self.any_words_child = None;
                        }
                    }
                } else if let Some(child) = self.literal_children.get_mut(*word) {
                    if child.remove(rest, destination) {
                        self.literal_children.remove(*word);
                    }
                }
            }
        }
        self.is_empty()
    }
}

/// The topic patterns of one exchange.
#[derive(Default)]
pub(super) struct TopicTrie {
    root: Node,
}

impl TopicTrie {
    /// Called once per (destination, key) pair.
    pub(super) fn add(&mut self, destination: &Destination, key: &[u8]) {
        let mut node = &mut self.root;
        for word in split_words(key) {
            node = node.child_mut(word);
        }
        debug_assert!(!node.destinations.contains(destination));
        node.destinations.push(destination.clone());
    }

    /// Called once per (destination, key) pair that lost its last binding.
    pub(super) fn remove(&mut self, destination: &Destination, key: &[u8]) {
        let words: Vec<&[u8]> = split_words(key).collect();
        self.root.remove(&words, destination);
    }

    pub(super) fn route(&self, routing_key: &[u8], out: &mut Vec<Destination>) {
        let start = out.len();
        let mut search = Search {
            routing_key_length: routing_key.len(),
            out,
            matched_node_count: 0,
            visited_any_words: HashSet::new(),
        };
        let words = (!routing_key.is_empty()).then_some(routing_key);
        search.visit(&self.root, words, false);
        // One node holds no duplicates, so only several matching nodes (say
        // "a.*" and "#" both bound to one queue) need the deduplication pass.
        if search.matched_node_count > 1 {
            deduplicate_tail(out, start);
        }
    }
}

/// The state of one route through the trie.
struct Search<'out> {
    routing_key_length: usize,
    out: &'out mut Vec<Destination>,
    matched_node_count: usize,
    /// (`#` node address, position in the routing key) pairs already expanded.
    /// Only `#` nodes below another `#` can be reached twice at one position,
    /// so only they are recorded; a set that stays empty never allocates.
    visited_any_words: HashSet<(usize, usize)>,
}

impl Search<'_> {
    /// Matches `remaining` words against the patterns below `node`.
    /// `below_any_words` says whether a `#` lies on the path to `node`.
    fn visit(&mut self, node: &Node, remaining: Option<&[u8]>, below_any_words: bool) {
        match remaining {
            None => {
                if !node.destinations.is_empty() {
                    self.out.extend(node.destinations.iter().cloned());
                    self.matched_node_count += 1;
                }
            }
            Some(words) => {
                let (word, rest) = next_word(words);
                if let Some(child) = node.literal_children.get(word) {
                    self.visit(child, rest, below_any_words);
                }
                if let Some(child) = &node.one_word_child {
                    self.visit(child, rest, below_any_words);
                }
            }
        }
        // `#` also matches when no words are left: it may swallow zero.
        if let Some(child) = &node.any_words_child {
            self.swallow_words(child, remaining, below_any_words);
        }
    }

    /// Lets the `#` whose node is `node` swallow 0, 1, ... of the `remaining`
    /// words, matching what is left against the patterns below it each time.
    fn swallow_words(&mut self, node: &Node, mut remaining: Option<&[u8]>, below_any_words: bool) {
        loop {
            if below_any_words {
                let position = match remaining {
                    Some(words) => self.routing_key_length - words.len(),
                    None => usize::MAX,
                };
                let address = node as *const Node as usize;
                // Every expansion runs to the end of the key, so finding this
                // position done means every later one is done too.
                if !self.visited_any_words.insert((address, position)) {
                    return;
                }
            }
            self.visit(node, remaining, true);
            match remaining {
                Some(words) => remaining = next_word(words).1,
                None => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exchange::tests::{binding, queue};
    use crate::exchange::{ExchangeKind, RoutingTable};

    fn table_with(keys: &[&str]) -> RoutingTable {
        let mut table = RoutingTable::new(ExchangeKind::Topic);
        for key in keys {
            // Queue named after its binding key, so assertions read as patterns.
            table.bind(binding(queue(key), key)).expect("valid binding");
        }
        table
    }

    fn routed(table: &RoutingTable, key: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        table.route(key, None, &mut out);
        let mut names: Vec<String> = out.iter().map(|d| d.name().to_owned()).collect();
        names.sort();
        names
    }

    fn matches(pattern: &str, key: &str) -> bool {
        !routed(&table_with(&[pattern]), key.as_bytes()).is_empty()
    }

    /// RabbitMQ's reference semantics, written the obvious exponential way.
    fn reference_match(pattern: &[&[u8]], words: &[&[u8]]) -> bool {
        match pattern.split_first() {
            None => words.is_empty(),
            Some((first, rest)) if *first == WILDCARD_ANY => {
                (0..=words.len()).any(|skip| reference_match(rest, &words[skip..]))
            }
            Some((first, rest)) => match words.split_first() {
                Some((word, words_rest)) => {
                    (*first == WILDCARD_ONE || first == word) && reference_match(rest, words_rest)
                }
                None => false,
            },
        }
    }

    #[test]
    fn split_words_follows_rabbitmq() {
        let split = |key: &str| -> Vec<Vec<u8>> {
            split_words(key.as_bytes()).map(<[u8]>::to_vec).collect()
        };
        assert!(split("").is_empty());
        assert_eq!(split("a"), [b"a".to_vec()]);
        assert_eq!(split("a..b"), [b"a".to_vec(), vec![], b"b".to_vec()]);
        assert_eq!(split("a."), [b"a".to_vec(), vec![]]);
        assert_eq!(split("."), [Vec::<u8>::new(), vec![]]);
    }

    #[test]
    fn literal_words_match_exactly() {
        assert!(matches("a.b.c", "a.b.c"));
        assert!(!matches("a.b.c", "a.b"));
        assert!(!matches("a.b.c", "a.b.c.d"));
        assert!(!matches("a.b", "a.bb"));
        assert!(!matches("a.b", "A.b"));
    }

    #[test]
    fn star_matches_exactly_one_word() {
        assert!(matches("*", "a"));
        assert!(!matches("*", ""));
        assert!(!matches("*", "a.b"));
        assert!(matches("a.*", "a.b"));
        assert!(!matches("a.*", "a"));
        assert!(!matches("a.*", "a.b.c"));
        assert!(matches("*.b.*", "a.b.c"));
        assert!(matches("*.*", "a.b"));
        assert!(!matches("*.*", "a"));
    }

    #[test]
    fn hash_matches_zero_or_more_words() {
        assert!(matches("a.#", "a"));
        assert!(matches("a.#", "a.b"));
        assert!(matches("a.#", "a.b.c"));
        assert!(!matches("a.#", "b.a"));
        assert!(matches("#.z", "z"));
        assert!(matches("#.z", "a.b.z"));
        assert!(!matches("#.z", "z.a"));
        assert!(matches("a.#.z", "a.z"));
        assert!(matches("a.#.z", "a.b.c.z"));
        assert!(!matches("a.#.z", "a.b.c"));
    }

    #[test]
    fn hash_alone_matches_everything_including_empty_key() {
        for key in ["", "a", "a.b.c", ".", "a..b", "*", "#"] {
            assert!(matches("#", key), "{key:?}");
        }
        assert_eq!(routed(&table_with(&["#"]), &[0xff, b'.', 0xfe]), ["#"]);
    }

    #[test]
    fn empty_routing_key() {
        assert!(matches("", ""));
        assert!(!matches("", "a"));
        assert!(!matches("a", ""));
        assert!(!matches("*", ""));
        assert!(matches("#.#", ""));
        assert!(!matches("*.#", ""));
    }

    #[test]
    fn empty_words_are_words() {
        assert!(matches("a..b", "a..b"));
        assert!(matches("a.*.b", "a..b"));
        assert!(!matches("a.b", "a..b"));
        assert!(matches("a.#.b", "a..b"));
        assert!(matches("a.*", "a."));
        assert!(!matches("a", "a."));
        assert!(matches("*.*", "."));
        assert!(!matches("*", "."));
        assert!(matches(".", "."));
    }

    #[test]
    fn combined_wildcards() {
        assert!(matches("#.#", "a.b"));
        assert!(matches("*.#", "a"));
        assert!(matches("*.#", "a.b.c"));
        assert!(matches("#.*", "a"));
        assert!(!matches("#.*", ""));
        assert!(matches("a.*.#", "a.b"));
        assert!(matches("a.*.#", "a.b.c.d"));
        assert!(!matches("a.*.#", "a"));
        assert!(matches("#.a.#", "a"));
        assert!(matches("#.a.#", "x.a.y"));
        assert!(!matches("#.a.#", "x.b.y"));
    }

    #[test]
    fn wildcard_characters_inside_words_are_literal() {
        assert!(matches("a*", "a*"));
        assert!(!matches("a*", "ab"));
        assert!(matches("a#.b", "a#.b"));
        assert!(!matches("a#.b", "a.b"));
        // A literal "*" in the routing key is one word, matched by the wildcard.
        assert!(matches("*", "*"));
    }

    #[test]
    fn queue_matched_by_two_patterns_appears_once() {
        let mut table = RoutingTable::new(ExchangeKind::Topic);
        for key in ["a.*", "#", "a.b", "*.b", "a.#"] {
            table.bind(binding(queue("q"), key)).expect("valid binding");
        }
        table
            .bind(binding(queue("other"), "a.b"))
            .expect("valid binding");
        assert_eq!(routed(&table, b"a.b"), ["other", "q"]);
        assert_eq!(routed(&table, b"z"), ["q"]);
    }

    #[test]
    fn route_leaves_earlier_output_alone() {
        let table = table_with(&["a.*", "#"]);
        let mut out = vec![queue("a.*"), queue("a.*")];
        table.route(b"a.b", None, &mut out);
        assert_eq!(out.len(), 4);
        assert_eq!(&out[..2], &[queue("a.*"), queue("a.*")]);
    }

    #[test]
    fn unbind_prunes_and_keeps_siblings() {
        let mut table = table_with(&["a.b.c", "a.b", "a.#", "a.*.c"]);
        assert!(table.unbind(&binding(queue("a.b.c"), "a.b.c")));
        assert_eq!(routed(&table, b"a.b.c"), ["a.#", "a.*.c"]);
        assert!(table.unbind(&binding(queue("a.#"), "a.#")));
        assert_eq!(routed(&table, b"a.b.c"), ["a.*.c"]);
        assert_eq!(routed(&table, b"a.b"), ["a.b"]);
        assert!(table.unbind(&binding(queue("a.b"), "a.b")));
        assert!(table.unbind(&binding(queue("a.*.c"), "a.*.c")));
        let crate::exchange::Matcher::Topic(trie) = &table.matcher else {
            panic!("a topic table has a topic matcher");
        };
        assert!(trie.root.is_empty(), "trie keeps no empty nodes");
    }

    #[test]
    fn long_binding_key_is_rejected() {
        let mut table = RoutingTable::new(ExchangeKind::Topic);
        let key = "a.".repeat(200);
        let result = table.bind(binding(queue("q"), &key));
        assert!(result.is_err());
        assert!(table.is_empty());
        let longest = "a".repeat(BINDING_KEY_LENGTH_MAX);
        assert_eq!(table.bind(binding(queue("q"), &longest)), Ok(true));
    }

    #[test]
    fn many_hashes_against_long_key_finish_quickly() {
        // Naive backtracking takes exponential time here.
        let patterns = [
            "#.#.#.#.#.#.#.#.#.#.#.#.#.#.#.#.b",
            "#.a.#.a.#.a.#.a.#.a.#.a.#.a.#.b",
        ];
        let table = table_with(&patterns);
        let key = vec!["a"; 200].join(".");
        assert!(routed(&table, key.as_bytes()).is_empty());
        let key_with_end = format!("{key}.b");
        assert_eq!(routed(&table, key_with_end.as_bytes()).len(), 2);
    }

    #[test]
    fn trie_agrees_with_reference_on_generated_cases() {
        // A fixed linear congruential generator keeps the case set reproducible.
        let mut state: u64 = 0x5eed;
        let mut next = move |bound: u64| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (state >> 33) % bound
        };
        let pattern_words = ["a", "b", "", "*", "#"];
        let key_words = ["a", "b", ""];
        let mut generate = |vocabulary: &[&str], max_words: u64| -> String {
            let count = next(max_words + 1);
            (0..count)
                .map(|_| vocabulary[next(vocabulary.len() as u64) as usize])
                .collect::<Vec<_>>()
                .join(".")
        };
        let patterns: Vec<String> = (0..300).map(|_| generate(&pattern_words, 5)).collect();
        let keys: Vec<String> = (0..300).map(|_| generate(&key_words, 5)).collect();

        let mut table = RoutingTable::new(ExchangeKind::Topic);
        for (index, pattern) in patterns.iter().enumerate() {
            table
                .bind(binding(queue(&index.to_string()), pattern))
                .expect("valid binding");
        }
        for key in &keys {
            let words: Vec<&[u8]> = split_words(key.as_bytes()).collect();
            let mut expected: Vec<String> = patterns
                .iter()
                .enumerate()
                .filter(|(_, pattern)| {
                    let pattern_split: Vec<&[u8]> = split_words(pattern.as_bytes()).collect();
                    reference_match(&pattern_split, &words)
                })
                .map(|(index, _)| index.to_string())
                .collect();
            expected.sort();
            assert_eq!(routed(&table, key.as_bytes()), expected, "key {key:?}");
        }
    }
}
