//! Exchanges: the bindings of one exchange and the structure that matches a
//! message against them.
//!
//! - `mod.rs`: [`RoutingTable`], the binding index shared by every kind, and the
//!   public vocabulary ([`Destination`], [`ExchangeKind`], [`Binding`]).
//! - `direct.rs`: exact routing-key match through a hash map.
//! - `fanout.rs`: every bound destination, routing key ignored.
//! - `topic.rs`: `*` / `#` patterns matched through a trie over words.
//! - `headers.rs`: `x-match` over the message's headers property.
//!
//! The binding index and the matchers are kept apart on purpose: the index
//! answers control-plane questions (is this binding already there? what is bound
//! to this queue?) while each matcher holds only what the per-message path needs.

pub mod direct;
pub mod fanout;
pub mod headers;
pub mod topic;

use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Arc;

use amq_protocol::types::FieldTable;

use self::direct::DirectMatcher;
use self::fanout::FanoutMatcher;
use self::headers::HeadersMatcher;
use self::topic::TopicTrie;

/// Where a binding sends the messages it matches.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Destination {
    Queue(Arc<str>),
    Exchange(Arc<str>),
}

impl Destination {
    /// The queue or exchange name.
    pub fn name(&self) -> &str {
        match self {
            Destination::Queue(name) | Destination::Exchange(name) => name,
        }
    }
}

/// The exchange types Sluice implements, as named in `exchange.declare`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExchangeKind {
    Direct,
    Fanout,
    Topic,
    Headers,
}

impl ExchangeKind {
    /// Parses the `type` field of `exchange.declare`. Case-sensitive, like
    /// RabbitMQ: `"Direct"` is an unknown type there too.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "direct" => Some(ExchangeKind::Direct),
            "fanout" => Some(ExchangeKind::Fanout),
            "topic" => Some(ExchangeKind::Topic),
            "headers" => Some(ExchangeKind::Headers),
            _ => None,
        }
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            ExchangeKind::Direct => "direct",
            ExchangeKind::Fanout => "fanout",
            ExchangeKind::Topic => "topic",
            ExchangeKind::Headers => "headers",
        }
    }
}

/// One binding from an exchange to a destination. Two bindings are the same
/// binding when destination, routing key and arguments are all equal
/// (RabbitMQ's identity for a binding, given the source exchange).
#[derive(Clone, Debug, PartialEq)]
pub struct Binding {
    pub destination: Destination,
    pub routing_key: String,
    pub arguments: FieldTable,
}

/// The per-kind matching structure. Direct, fanout and topic only care about
/// the (destination, routing key) pair, so they hear about a pair when its
/// first binding arrives and when its last binding leaves; headers matching
/// depends on the arguments, so it hears about every binding.
enum Matcher {
    Direct(DirectMatcher),
    Fanout(FanoutMatcher),
    Topic(TopicTrie),
    Headers(HeadersMatcher),
}

/// Bindings of one exchange, grouped by destination and then routing key.
/// The innermost vector holds bindings that differ only in arguments; it is
/// almost always of length one.
type BindingIndex = HashMap<Destination, HashMap<String, Vec<Binding>>>;

/// The bindings of one exchange and the matching structure for its kind.
pub struct RoutingTable {
    kind: ExchangeKind,
    index: BindingIndex,
    binding_count: usize,
    matcher: Matcher,
}

impl RoutingTable {
    pub fn new(kind: ExchangeKind) -> Self {
        let matcher = match kind {
            ExchangeKind::Direct => Matcher::Direct(DirectMatcher::default()),
            ExchangeKind::Fanout => Matcher::Fanout(FanoutMatcher::default()),
            ExchangeKind::Topic => Matcher::Topic(TopicTrie::default()),
            ExchangeKind::Headers => Matcher::Headers(HeadersMatcher::default()),
        };
        RoutingTable {
            kind,
            index: HashMap::new(),
            binding_count: 0,
            matcher,
        }
    }

    pub fn kind(&self) -> ExchangeKind {
        self.kind
    }

    /// Adds a binding. Binding is idempotent, like RabbitMQ: returns `Ok(true)`
    /// if the binding is new and `Ok(false)` if an equal binding (same
    /// destination, routing key and arguments) already existed.
    ///
    /// # Errors
    /// A message fit for a `precondition_failed` channel close, worded like
    /// RabbitMQ's, when the arguments are invalid for the kind: headers
    /// bindings whose `x-match` is not one of `all`, `any`, `all-with-x`,
    /// `any-with-x`; topic bindings whose key is longer than
    /// [`topic::BINDING_KEY_LENGTH_MAX`].
    pub fn bind(&mut self, binding: Binding) -> Result<bool, String> {
        // Validate before touching the index so a rejected binding leaves no trace.
        let headers_spec = match &self.matcher {
            Matcher::Headers(_) => Some(headers::HeadersSpec::parse(&binding.arguments)?),
            Matcher::Topic(_) => {
                topic::validate_binding_key(&binding.routing_key)?;
                None
            }
            Matcher::Direct(_) | Matcher::Fanout(_) => None,
        };

        let by_key = self.index.entry(binding.destination.clone()).or_default();
        let variants = match by_key.get_mut(binding.routing_key.as_str()) {
            Some(variants) => variants,
            None => by_key.entry(binding.routing_key.clone()).or_default(),
        };
        if variants.contains(&binding) {
            return Ok(false);
        }
        let pair_is_new = variants.is_empty();

        match &mut self.matcher {
            Matcher::Direct(direct) if pair_is_new => {
                direct.add(&binding.destination, binding.routing_key.as_bytes());
            }
            Matcher::Fanout(fanout) if pair_is_new => fanout.add(&binding.destination),
            Matcher::Topic(trie) if pair_is_new => {
                trie.add(&binding.destination, binding.routing_key.as_bytes());
            }
            Matcher::Headers(headers) => {
                if let Some(spec) = headers_spec {
                    headers.add(binding.destination.clone(), spec);
                }
            }
            _ => {}
        }
        variants.push(binding);
        self.binding_count += 1;
        Ok(true)
    }

    /// Removes an exact binding (destination, routing key, arguments); returns
    /// whether it existed.
    pub fn unbind(&mut self, binding: &Binding) -> bool {
        let Some(by_key) = self.index.get_mut(&binding.destination) else {
            return false;
        };
        let Some(variants) = by_key.get_mut(binding.routing_key.as_str()) else {
            return false;
        };
        let Some(position) = variants.iter().position(|existing| existing == binding) else {
            return false;
        };
        variants.swap_remove(position);
        let pair_is_gone = variants.is_empty();
        if pair_is_gone {
            by_key.remove(binding.routing_key.as_str());
            if by_key.is_empty() {
                self.index.remove(&binding.destination);
            }
        }
        self.binding_count -= 1;

        match &mut self.matcher {
            Matcher::Direct(direct) if pair_is_gone => {
                direct.remove(&binding.destination, binding.routing_key.as_bytes());
            }
            Matcher::Fanout(fanout) if pair_is_gone => fanout.remove(&binding.destination),
            Matcher::Topic(trie) if pair_is_gone => {
                trie.remove(&binding.destination, binding.routing_key.as_bytes());
            }
            Matcher::Headers(headers) => {
                // The binding was accepted by bind(), so its arguments parse.
                if let Ok(spec) = headers::HeadersSpec::parse(&binding.arguments) {
                    headers.remove(&binding.destination, &spec);
                }
            }
            _ => {}
        }
        true
    }

    /// Removes every binding to `destination` (its queue or exchange was
    /// deleted); returns how many.
    pub fn remove_destination(&mut self, destination: &Destination) -> usize {
        let Some(by_key) = self.index.remove(destination) else {
            return 0;
        };
        let removed: usize = by_key.values().map(Vec::len).sum();
        self.binding_count -= removed;
        match &mut self.matcher {
            Matcher::Direct(direct) => {
                for key in by_key.keys() {
                    direct.remove(destination, key.as_bytes());
                }
            }
            Matcher::Fanout(fanout) => fanout.remove_all(destination),
            Matcher::Topic(trie) => {
                for key in by_key.keys() {
                    trie.remove(destination, key.as_bytes());
                }
            }
            Matcher::Headers(headers) => headers.remove_destination(destination),
        }
        removed
    }

    /// Appends the destinations matched by this message to `out`. Within one
    /// call a destination appears once even when several bindings match it,
    /// because RabbitMQ delivers one copy; `out` may still hold duplicates from
    /// earlier calls, which the caller removes across exchange-to-exchange hops.
    /// `headers` is the message's headers property when it has one (only the
    /// headers kind looks at it).
    pub fn route(
        &self,
        routing_key: &[u8],
        headers: Option<&FieldTable>,
        out: &mut Vec<Destination>,
    ) {
        match &self.matcher {
            Matcher::Direct(direct) => direct.route(routing_key, out),
            Matcher::Fanout(fanout) => fanout.route(out),
            Matcher::Topic(trie) => trie.route(routing_key, out),
            Matcher::Headers(matcher) => matcher.route(headers, out),
        }
    }

    pub fn bindings(&self) -> impl Iterator<Item = &Binding> {
        self.index
            .values()
            .flat_map(|by_key| by_key.values().flatten())
    }

    pub fn len(&self) -> usize {
        self.binding_count
    }

    pub fn is_empty(&self) -> bool {
        self.binding_count == 0
    }

    pub fn has_destination(&self, destination: &Destination) -> bool {
        self.index.contains_key(destination)
    }
}

/// A total order on destinations, so matchers that can produce the same
/// destination twice can sort and deduplicate without hashing.
fn destination_order(left: &Destination, right: &Destination) -> Ordering {
    let rank = |destination: &Destination| match destination {
        Destination::Queue(_) => 0u8,
        Destination::Exchange(_) => 1u8,
    };
    rank(left)
        .cmp(&rank(right))
        .then_with(|| left.name().cmp(right.name()))
}

/// Removes duplicates among `out[start..]`, leaving `out[..start]` alone:
/// those were appended by earlier routing steps the caller owns.
fn deduplicate_tail(out: &mut Vec<Destination>, start: usize) {
    if out.len().saturating_sub(start) < 2 {
        return;
    }
    out[start..].sort_unstable_by(destination_order);
    let mut write = start + 1;
    for read in start + 1..out.len() {
        if out[read] != out[write - 1] {
            out.swap(read, write);
            write += 1;
        }
    }
    out.truncate(write);
}

#[cfg(test)]
mod tests {
    use super::*;
    use amq_protocol::types::{AMQPValue, LongString};

    pub(crate) fn queue(name: &str) -> Destination {
        Destination::Queue(Arc::from(name))
    }

    pub(crate) fn binding(destination: Destination, key: &str) -> Binding {
        Binding {
            destination,
            routing_key: key.to_owned(),
            arguments: FieldTable::default(),
        }
    }

    #[test]
    fn kind_parse_and_as_str_round_trip() {
        for kind in [
            ExchangeKind::Direct,
            ExchangeKind::Fanout,
            ExchangeKind::Topic,
            ExchangeKind::Headers,
        ] {
            assert_eq!(ExchangeKind::parse(kind.as_str()), Some(kind));
        }
        assert_eq!(ExchangeKind::parse("x-consistent-hash"), None);
        assert_eq!(ExchangeKind::parse("Direct"), None);
        assert_eq!(ExchangeKind::parse(""), None);
    }

    #[test]
    fn bind_is_idempotent() {
        let mut table = RoutingTable::new(ExchangeKind::Direct);
        assert_eq!(table.bind(binding(queue("q"), "k")), Ok(true));
        assert_eq!(table.bind(binding(queue("q"), "k")), Ok(false));
        assert_eq!(table.len(), 1);
    }

    #[test]
    fn bindings_differing_only_in_arguments_are_distinct() {
        let mut table = RoutingTable::new(ExchangeKind::Direct);
        let plain = binding(queue("q"), "k");
        let mut with_argument = plain.clone();
        with_argument
            .arguments
            .insert("a".into(), AMQPValue::LongString(LongString::from("1")));
        assert_eq!(table.bind(plain.clone()), Ok(true));
        assert_eq!(table.bind(with_argument.clone()), Ok(true));
        assert_eq!(table.len(), 2);

        // Two bindings, one delivery.
        let mut out = Vec::new();
        table.route(b"k", None, &mut out);
        assert_eq!(out, vec![queue("q")]);

        // The route survives until the last of the two goes.
        assert!(table.unbind(&plain));
        out.clear();
        table.route(b"k", None, &mut out);
        assert_eq!(out, vec![queue("q")]);
        assert!(table.unbind(&with_argument));
        out.clear();
        table.route(b"k", None, &mut out);
        assert!(out.is_empty());
        assert!(table.is_empty());
        assert!(!table.has_destination(&queue("q")));
    }

    #[test]
    fn unbind_missing_binding_returns_false() {
        let mut table = RoutingTable::new(ExchangeKind::Topic);
        assert!(!table.unbind(&binding(queue("q"), "a")));
        table.bind(binding(queue("q"), "a")).expect("valid binding");
        assert!(!table.unbind(&binding(queue("q"), "b")));
        assert!(!table.unbind(&binding(queue("other"), "a")));
        assert!(table.unbind(&binding(queue("q"), "a")));
        assert!(!table.unbind(&binding(queue("q"), "a")));
    }

    #[test]
    fn remove_destination_counts_and_clears_routes_for_every_kind() {
        for kind in [
            ExchangeKind::Direct,
            ExchangeKind::Fanout,
            ExchangeKind::Topic,
            ExchangeKind::Headers,
        ] {
            let mut table = RoutingTable::new(kind);
            for key in ["a", "b", "c.#"] {
                table
                    .bind(binding(queue("gone"), key))
                    .expect("valid binding");
            }
            table
                .bind(binding(queue("kept"), "a"))
                .expect("valid binding");
            assert_eq!(table.len(), 4, "{kind:?}");
            assert!(table.has_destination(&queue("gone")));

            assert_eq!(table.remove_destination(&queue("gone")), 3, "{kind:?}");
            assert_eq!(table.remove_destination(&queue("gone")), 0, "{kind:?}");
            assert!(!table.has_destination(&queue("gone")));
            assert_eq!(table.len(), 1);

            let mut out = Vec::new();
            for key in [&b"a"[..], b"b", b"c"] {
                table.route(key, None, &mut out);
            }
            assert!(!out.contains(&queue("gone")), "{kind:?}: {out:?}");
        }
    }

    #[test]
    fn bindings_lists_every_binding() {
        let mut table = RoutingTable::new(ExchangeKind::Topic);
        let all = [
            binding(queue("q1"), "a.*"),
            binding(queue("q1"), "b"),
            binding(Destination::Exchange(Arc::from("e")), "#"),
        ];
        for each in &all {
            table.bind(each.clone()).expect("valid binding");
        }
        let listed: Vec<&Binding> = table.bindings().collect();
        assert_eq!(listed.len(), all.len());
        for each in &all {
            assert!(listed.contains(&each));
        }
    }

    #[test]
    fn queue_and_exchange_with_same_name_are_different_destinations() {
        let mut table = RoutingTable::new(ExchangeKind::Fanout);
        table.bind(binding(queue("x"), "")).expect("valid binding");
        table
            .bind(binding(Destination::Exchange(Arc::from("x")), ""))
            .expect("valid binding");
        let mut out = Vec::new();
        table.route(b"", None, &mut out);
        assert_eq!(out.len(), 2);
    }

    #[test]
    fn deduplicate_tail_leaves_prefix_alone() {
        let mut out = vec![queue("a"), queue("a"), queue("b"), queue("a"), queue("b")];
        deduplicate_tail(&mut out, 2);
        assert_eq!(&out[..2], &[queue("a"), queue("a")]);
        let mut tail = out[2..].to_vec();
        tail.sort_unstable_by(destination_order);
        assert_eq!(tail, vec![queue("a"), queue("b")]);
    }
}
