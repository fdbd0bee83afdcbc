//! A vhost rebuilt at start from the definitions an earlier run saved.

use std::sync::Arc;

use super::{ExchangeSpec, VirtualHost};
use crate::definitions::{
    BindingDefinition, ExchangeDefinition, QueueDefinition, VhostDefinitions,
};
use crate::exchange::{Destination, ExchangeKind};
use crate::queue::{Queue, QueueOptions};
use crate::queue_factory::{create_queue, QueueCreateError};

/// A durable queue that could not be brought back at start.
#[derive(Debug, thiserror::Error)]
#[error("cannot recover queue '{queue}' in vhost '{vhost}' (journal queues/{store_id} in the data directory): {error}; the node does not start rather than drop a durable queue: fix the cause and start it again")]
pub struct RecoveryError {
    pub queue: String,
    pub vhost: String,
    pub store_id: String,
    #[source]
    pub error: QueueCreateError,
}

impl VirtualHost {
    /// Rebuilds durable exchanges, queues (with their journals) and bindings
    /// saved by an earlier run.
    ///
    /// # Errors
    /// A durable queue that cannot be brought back (its journal cannot be
    /// opened or read): the node does not start. Skipping it would drop its
    /// definition, and its messages with it, at the next save.
    pub fn recover(&self, definitions: &VhostDefinitions) -> Result<(), RecoveryError> {
        if self.store.is_none() {
            return Ok(());
        }
        self.recover_exchanges(&definitions.exchanges);
        let recovered_queues = self.recover_queues(&definitions.queues)?;
        self.recover_bindings(&definitions.bindings);
        // Only now that the bindings are back: a message that expired while
        // the node was down is due at once, and its dead-letter exchange
        // must route it.
        for queue in recovered_queues {
            queue.start_timers();
        }
        Ok(())
    }

    fn recover_exchanges(&self, definitions: &[ExchangeDefinition]) {
        let mut exchanges = self.exchanges_mut();
        for definition in definitions {
            let Some(kind) = ExchangeKind::parse(&definition.kind) else {
                tracing::error!(exchange = %definition.name, kind = %definition.kind, "skipping an exchange of unknown type");
                continue;
            };
            let exchange = self.new_exchange(ExchangeSpec {
                name: &definition.name,
                kind,
                durable: true,
                auto_delete: definition.auto_delete,
                internal: definition.internal,
                arguments: definition.arguments.clone(),
            });
            exchanges.insert(Arc::clone(&exchange.name), Arc::new(exchange));
        }
    }

    /// The queues back, with what their journals hold; returns them for
    /// their timers to start once the bindings are back too.
    fn recover_queues(
        &self,
        definitions: &[QueueDefinition],
    ) -> Result<Vec<Arc<dyn Queue>>, RecoveryError> {
        let mut recovered = Vec::with_capacity(definitions.len());
        let mut queues = self.queues_mut();
        for definition in definitions {
            let effective = self.effective_queue_arguments(&definition.name, &definition.arguments);
            let options = QueueOptions {
                durable: true,
                exclusive_owner: None,
                auto_delete: definition.auto_delete,
                arguments: definition.arguments.clone(),
            };
            let name: Arc<str> = Arc::from(definition.name.as_str());
            let spec = self.queue_spec(
                Arc::clone(&name),
                options,
                &effective,
                Some(definition.store_id.clone()),
            );
            let queue = create_queue(spec).map_err(|error| RecoveryError {
                queue: definition.name.clone(),
                vhost: self.name.to_string(),
                store_id: definition.store_id.clone(),
                error,
            })?;
            tracing::info!(queue = %definition.name, vhost = %self.name, messages = queue.message_count(), "recovered queue");
            recovered.push(Arc::clone(&queue));
            queues.insert(name, queue);
        }
        Ok(recovered)
    }

    fn recover_bindings(&self, definitions: &[BindingDefinition]) {
        for definition in definitions {
            let destination = match definition.destination_type.as_str() {
                "exchange" => Destination::Exchange(Arc::from(definition.destination.as_str())),
                _ => Destination::Queue(Arc::from(definition.destination.as_str())),
            };
            if let Err(error) = self.bind(
                &definition.source,
                destination,
                &definition.routing_key,
                definition.arguments.clone(),
                0,
            ) {
                tracing::error!(source = %definition.source, destination = %definition.destination, %error, "skipping a binding");
            }
        }
    }
}
