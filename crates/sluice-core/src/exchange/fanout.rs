//! Fanout exchange: a message goes to every bound destination; the routing key
//! is ignored.

use std::collections::HashMap;

use super::Destination;

/// Bound destinations, each with the number of distinct routing keys it is
/// bound with: a queue bound twice with different keys still gets one copy,
/// and keeps its route until the last of those bindings goes.
#[derive(Default)]
pub(super) struct FanoutMatcher {
    key_count_by_destination: HashMap<Destination, usize>,
}

impl FanoutMatcher {
    /// Called once per new (destination, key) pair.
    pub(super) fn add(&mut self, destination: &Destination) {
        *self
            .key_count_by_destination
            .entry(destination.clone())
            .or_insert(0) += 1;
    }

    /// Called once per (destination, key) pair that lost its last binding.
    pub(super) fn remove(&mut self, destination: &Destination) {
        if let Some(count) = self.key_count_by_destination.get_mut(destination) {
            *count -= 1;
            if *count == 0 {
                self.key_count_by_destination.remove(destination);
            }
        }
    }

    pub(super) fn remove_all(&mut self, destination: &Destination) {
        self.key_count_by_destination.remove(destination);
    }

    pub(super) fn route(&self, out: &mut Vec<Destination>) {
        out.extend(self.key_count_by_destination.keys().cloned());
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
    fn every_destination_regardless_of_key() {
        let mut table = RoutingTable::new(ExchangeKind::Fanout);
        table.bind(binding(queue("q1"), "")).expect("valid binding");
        table
            .bind(binding(queue("q2"), "whatever"))
            .expect("valid binding");
        for key in [&b""[..], b"whatever", b"other", &[0xff]] {
            assert_eq!(routed(&table, key), ["q1", "q2"]);
        }
    }

    #[test]
    fn destination_bound_with_two_keys_gets_one_copy() {
        let mut table = RoutingTable::new(ExchangeKind::Fanout);
        table.bind(binding(queue("q"), "a")).expect("valid binding");
        table.bind(binding(queue("q"), "b")).expect("valid binding");
        assert_eq!(routed(&table, b"x"), ["q"]);
        assert!(table.unbind(&binding(queue("q"), "a")));
        assert_eq!(routed(&table, b"x"), ["q"]);
        assert!(table.unbind(&binding(queue("q"), "b")));
        assert!(routed(&table, b"x").is_empty());
    }

    #[test]
    fn empty_table_routes_nowhere() {
        let table = RoutingTable::new(ExchangeKind::Fanout);
        assert!(routed(&table, b"k").is_empty());
    }
}
