//! Where a new classic queue lives: RabbitMQ's queue leader locators.
//! `client-local` (the default) puts it on the node the declaring client is
//! connected to; `balanced` on the running node with the fewest queues,
//! or, once there are many queues, on a random running node (counting
//! them all would cost more than the balance is worth), as RabbitMQ's
//! `rabbit_queue_location` does. Chosen by `x-queue-leader-locator`, else
//! the node's `queue_leader_locator`.

use amq_protocol::types::AMQPValue;

/// How a node picks a new queue's home.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum QueueLocator {
    #[default]
    ClientLocal,
    Balanced,
}

/// Past this many queues, `balanced` picks a random running node.
pub const BALANCED_COUNT_LIMIT: usize = 1000;

impl QueueLocator {
    /// RabbitMQ's names; the locators of earlier versions (`random`,
    /// `least-leaders`, `min-masters`) count as `balanced`, as in RabbitMQ.
    pub fn parse(text: &str) -> Option<QueueLocator> {
        match text {
            "client-local" => Some(QueueLocator::ClientLocal),
            "balanced" | "random" | "least-leaders" | "min-masters" => Some(QueueLocator::Balanced),
            _ => None,
        }
    }

    /// The locator an `x-queue-leader-locator` argument names, when it is
    /// a string naming one.
    pub fn of_argument(value: &AMQPValue) -> Option<QueueLocator> {
        match value {
            AMQPValue::LongString(text) => {
                QueueLocator::parse(&String::from_utf8_lossy(text.as_bytes()))
            }
            AMQPValue::ShortString(text) => QueueLocator::parse(text.as_str()),
            _ => None,
        }
    }

    /// The home for a new queue declared through `local`. `running` are the
    /// nodes up now with the number of queues each holds (`local` among
    /// them); `random` picks an index below its argument.
    pub fn choose(
        self,
        local: &str,
        running: &[(String, usize)],
        random: impl FnOnce(usize) -> usize,
    ) -> String {
        if self == QueueLocator::ClientLocal || running.is_empty() {
            return local.to_owned();
        }
        let total: usize = running.iter().map(|(_, queues)| queues).sum();
        if total >= BALANCED_COUNT_LIMIT {
            return running[random(running.len())].0.clone();
        }
        // Fewest queues; a tie goes to the local node, then by name, so a
        // quiet cluster keeps queues where their clients are.
        running
            .iter()
            .min_by_key(|(node, queues)| (*queues, node != local, node.clone()))
            .map(|(node, _)| node.clone())
            .unwrap_or_else(|| local.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running(counts: &[(&str, usize)]) -> Vec<(String, usize)> {
        counts
            .iter()
            .map(|(node, count)| ((*node).to_owned(), *count))
            .collect()
    }

    #[test]
    fn queue_location_client_local_stays_home_and_balanced_fills_the_emptiest_node() {
        let nodes = running(&[("a", 3), ("b", 1), ("c", 1)]);
        assert_eq!(QueueLocator::ClientLocal.choose("a", &nodes, |_| 0), "a");
        assert_eq!(QueueLocator::Balanced.choose("a", &nodes, |_| 0), "b");
        assert_eq!(QueueLocator::Balanced.choose("c", &nodes, |_| 0), "c");
        let many = running(&[("a", 600), ("b", 300), ("c", 100)]);
        assert_eq!(QueueLocator::Balanced.choose("a", &many, |_| 1), "b");
        assert_eq!(QueueLocator::Balanced.choose("a", &[], |_| 0), "a");
    }

    #[test]
    fn queue_location_names_as_rabbitmq_accepts_them() {
        assert_eq!(
            QueueLocator::parse("client-local"),
            Some(QueueLocator::ClientLocal)
        );
        for balanced in ["balanced", "random", "least-leaders", "min-masters"] {
            assert_eq!(QueueLocator::parse(balanced), Some(QueueLocator::Balanced));
        }
        assert_eq!(QueueLocator::parse("nearest"), None);
    }
}
