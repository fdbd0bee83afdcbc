//! The node's metadata as one value, for the metadata log's snapshots, and
//! the node brought to such a value.

use crate::broker::Broker;
use crate::definitions::{Definitions, VhostDefinitions};

impl Broker {
    /// Every vhost's exchanges, queues and bindings.
    pub fn metadata_snapshot(&self) -> Definitions {
        let mut definitions = Definitions::default();
        for vhost in self.vhosts() {
            definitions
                .vhosts
                .insert(vhost.name.to_string(), vhost.definitions());
        }
        definitions
    }

    /// Makes the node's metadata exactly `definitions`: a node restarting
    /// from a snapshot, or one that fell behind and was sent one.
    pub fn restore_metadata(&self, definitions: &Definitions) {
        for (name, vhost_definitions) in &definitions.vhosts {
            self.add_vhost(name).restore(vhost_definitions);
        }
        let empty = VhostDefinitions::default();
        for vhost in self.vhosts() {
            if !definitions.vhosts.contains_key(&*vhost.name) {
                vhost.restore(&empty);
            }
        }
    }
}
