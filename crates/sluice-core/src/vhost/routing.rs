//! The routing walk: from the exchange a message is published to, through
//! exchange-to-exchange bindings and alternate exchanges, to the queues it
//! lands in.

use std::collections::HashSet;
use std::sync::Arc;

use amq_protocol::types::FieldTable;

use super::{read, Exchange, VirtualHost};
use crate::exchange::Destination;
use crate::queue::{same_queue, Queue};

/// Exchange-to-exchange bindings may form cycles; the routing walk visits each
/// exchange once, and stops at this depth so a pathological chain costs a
/// bounded amount of work per message.
pub const ROUTING_EXCHANGE_HOPS_MAX: usize = 64;

/// Buffers the routing walk reuses from one message to the next.
#[derive(Default)]
pub struct RouteScratch {
    destinations: Vec<Destination>,
}

impl VirtualHost {
    /// The queues a message published to `exchange` lands in, each once.
    /// `scratch` is reused between calls so routing does not allocate.
    pub fn route(
        &self,
        exchange: &Arc<Exchange>,
        routing_key: &[u8],
        headers: Option<&FieldTable>,
        scratch: &mut RouteScratch,
        out: &mut Vec<Arc<dyn Queue>>,
    ) {
        self.route_keys(exchange, &[routing_key], headers, scratch, out);
    }

    /// [`VirtualHost::route`] with several routing keys at once: a message's
    /// own and its CC and BCC keys (see [`crate::sender_selected`]), or a
    /// dead-lettered copy's. As in RabbitMQ, each queue gets one copy, and
    /// an exchange hands the message to its alternate exchange only when no
    /// key routes it anywhere.
    pub fn route_keys(
        &self,
        exchange: &Arc<Exchange>,
        routing_keys: &[&[u8]],
        headers: Option<&FieldTable>,
        scratch: &mut RouteScratch,
        out: &mut Vec<Arc<dyn Queue>>,
    ) {
        out.clear();
        if exchange.is_default() {
            let queues = read(&self.queues);
            for key in routing_keys {
                let Ok(name) = std::str::from_utf8(key) else {
                    continue;
                };
                if let Some(queue) = queues.get(name) {
                    if !out.iter().any(|seen| same_queue(seen, queue)) {
                        out.push(Arc::clone(queue));
                    }
                }
            }
            return;
        }
        scratch.destinations.clear();
        for key in routing_keys {
            exchange
                .routing()
                .route(key, headers, &mut scratch.destinations);
        }
        if scratch.destinations.is_empty() {
            // Routed nowhere: the alternate exchange, if any, takes the
            // message. Only here, so routable messages never pay for it.
            match exchange.alternate_exchange() {
                Some(alternate) => scratch.destinations.push(Destination::Exchange(alternate)),
                None => return,
            }
        }
        let has_exchange_hops = scratch
            .destinations
            .iter()
            .any(|destination| matches!(destination, Destination::Exchange(_)));
        if has_exchange_hops {
            self.follow_exchange_bindings(exchange, routing_keys, headers, scratch);
        }
        let queues = read(&self.queues);
        for destination in &scratch.destinations {
            if let Destination::Queue(name) = destination {
                if let Some(queue) = queues.get(name) {
                    if !out.iter().any(|seen| same_queue(seen, queue)) {
                        out.push(Arc::clone(queue));
                    }
                }
            }
        }
    }

    /// Expands exchange destinations breadth-first, visiting each exchange
    /// once so binding cycles (and cycles of alternate exchanges) terminate.
    /// As in RabbitMQ, an exchange on the walk that routes the message
    /// nowhere hands it to its own alternate exchange; a missing alternate
    /// is skipped.
    fn follow_exchange_bindings(
        &self,
        source: &Arc<Exchange>,
        routing_keys: &[&[u8]],
        headers: Option<&FieldTable>,
        scratch: &mut RouteScratch,
    ) {
        let mut visited: HashSet<Arc<str>> = HashSet::new();
        visited.insert(Arc::clone(&source.name));
        let mut index = 0;
        let mut hops = 0;
        while index < scratch.destinations.len() && hops < ROUTING_EXCHANGE_HOPS_MAX {
            if let Destination::Exchange(name) = &scratch.destinations[index] {
                if visited.insert(Arc::clone(name)) {
                    hops += 1;
                    if let Ok(next) = self.exchange(name) {
                        let before = scratch.destinations.len();
                        for key in routing_keys {
                            next.routing()
                                .route(key, headers, &mut scratch.destinations);
                        }
                        if scratch.destinations.len() == before {
                            if let Some(alternate) = next.alternate_exchange() {
                                scratch.destinations.push(Destination::Exchange(alternate));
                            }
                        }
                    }
                }
            }
            index += 1;
        }
    }
}
