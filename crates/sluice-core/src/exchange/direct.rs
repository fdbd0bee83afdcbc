//! Direct exchange: a message goes to the destinations bound with exactly its
//! routing key, compared byte for byte.

use std::collections::HashMap;

use super::Destination;

/// Destinations by binding key. A hash map so routing costs one lookup however
/// many bindings the exchange has. Keys are bytes because routing keys arrive
/// from the wire as bytes that need not be UTF-8.
#[derive(Default)]
pub(super) struct DirectMatcher {
    destinations_by_key: HashMap<Box<[u8]>, Vec<Destination>>,
}

impl DirectMatcher {
    /// Called once per (destination, key) pair, so the vector holds no duplicates.
    pub(super) fn add(&mut self, destination: &Destination, key: &[u8]) {
        match self.destinations_by_key.get_mut(key) {
            Some(destinations) => destinations.push(destination.clone()),
            None => {
                self.destinations_by_key
                    .insert(Box::from(key), vec![destination.clone()]);
            }
        }
    }

    pub(super) fn remove(&mut self, destination: &Destination, key: &[u8]) {
        let Some(destinations) = self.destinations_by_key.get_mut(key) else {
            return;
        };
        destinations.retain(|existing| existing != destination);
        if destinations.is_empty() {
            self.destinations_by_key.remove(key);
        }
    }

    pub(super) fn route(&self, routing_key: &[u8], out: &mut Vec<Destination>) {
        if let Some(destinations) = self.destinations_by_key.get(routing_key) {
            out.extend(destinations.iter().cloned());
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::exchange::tests::{binding, queue};
    use crate::exchange::{ExchangeKind, RoutingTable};

    fn routed(table: &RoutingTable, key: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        table.route(key, None, &mut out);
        let mut names: Vec<String> = out.iter().map(|d| d.name().to_owned()).collect();
        names.sort();
        names
    }

    #[test]
    fn exact_key_matches() {
        let mut table = RoutingTable::new(ExchangeKind::Direct);
        table
            .bind(binding(queue("q1"), "a.b"))
            .expect("valid binding");
        table
            .bind(binding(queue("q2"), "a.b"))
            .expect("valid binding");
        table
            .bind(binding(queue("q3"), "a"))
            .expect("valid binding");
        assert_eq!(routed(&table, b"a.b"), ["q1", "q2"]);
        assert_eq!(routed(&table, b"a"), ["q3"]);
    }

    #[test]
    fn no_prefix_case_or_wildcard_matching() {
        let mut table = RoutingTable::new(ExchangeKind::Direct);
        table
            .bind(binding(queue("q"), "a.b"))
            .expect("valid binding");
        table
            .bind(binding(queue("star"), "*"))
            .expect("valid binding");
        table
            .bind(binding(queue("hash"), "#"))
            .expect("valid binding");
        assert!(routed(&table, b"a").is_empty());
        assert!(routed(&table, b"a.b.c").is_empty());
        assert!(routed(&table, b"A.B").is_empty());
        assert!(routed(&table, b"x").is_empty());
        // Wildcards are ordinary characters here.
        assert_eq!(routed(&table, b"*"), ["star"]);
        assert_eq!(routed(&table, b"#"), ["hash"]);
    }

    #[test]
    fn empty_key_matches_empty_binding_key() {
        let mut table = RoutingTable::new(ExchangeKind::Direct);
        table.bind(binding(queue("q"), "")).expect("valid binding");
        assert_eq!(routed(&table, b""), ["q"]);
        assert!(routed(&table, b"x").is_empty());
    }

    #[test]
    fn non_utf8_routing_key_is_compared_as_bytes() {
        let mut table = RoutingTable::new(ExchangeKind::Direct);
        table.bind(binding(queue("q"), "é")).expect("valid binding");
        assert_eq!(routed(&table, "é".as_bytes()), ["q"]);
        assert!(routed(&table, &[0xff, 0xfe]).is_empty());
        assert!(routed(&table, &[0xc3]).is_empty());
    }

    #[test]
    fn unbind_stops_routing() {
        let mut table = RoutingTable::new(ExchangeKind::Direct);
        table
            .bind(binding(queue("q1"), "k"))
            .expect("valid binding");
        table
            .bind(binding(queue("q2"), "k"))
            .expect("valid binding");
        assert!(table.unbind(&binding(queue("q1"), "k")));
        assert_eq!(routed(&table, b"k"), ["q2"]);
        assert!(table.unbind(&binding(queue("q2"), "k")));
        assert!(routed(&table, b"k").is_empty());
    }
}
