//! A quorum queue's members and their Raft ids. Ids are stable: a member
//! keeps its id while it is one, and a member added later gets one that no
//! member of the group ever had, so that a change never renumbers the
//! others (the group's Raft log names members by id).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

/// Ids of members added by a membership change are this plus the index
/// of the metadata log entry that added them: unique for the cluster's
/// life, and never one of the ids a group is created with (places in its
/// member list, from 1, at most the number of nodes).
pub const ADDED_MEMBER_ID_BASE: u64 = 1 << 32;

/// The members of a quorum queue, its home (the first leader) first, with
/// their Raft ids.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Membership {
    pub members: Vec<String>,
    pub ids: BTreeMap<String, u64>,
}

impl Membership {
    /// The membership a definition records. A definition without ids (one
    /// written before members could change) has the ids its group was
    /// created with: each member's place in the sorted list, from 1.
    pub fn of(members: &[String], ids: &BTreeMap<String, u64>) -> Membership {
        let ids = if ids.is_empty() {
            positional_ids(members)
        } else {
            ids.clone()
        };
        Membership {
            members: members.to_vec(),
            ids,
        }
    }

    pub fn contains(&self, node: &str) -> bool {
        self.members.iter().any(|member| member == node)
    }

    pub fn id_of(&self, node: &str) -> Option<u64> {
        self.ids.get(node).copied()
    }

    /// Members by id, as the group is started with.
    pub fn by_id(&self) -> BTreeMap<u64, String> {
        self.members
            .iter()
            .filter_map(|member| Some((self.id_of(member)?, member.clone())))
            .collect()
    }

    /// With `node` added (last) under `id`.
    pub fn with_member(&self, node: &str, id: u64) -> Membership {
        let mut changed = self.clone();
        if !changed.contains(node) {
            changed.members.push(node.to_owned());
        }
        changed.ids.insert(node.to_owned(), id);
        changed
    }

    /// Without `node`.
    pub fn without_member(&self, node: &str) -> Membership {
        let mut changed = self.clone();
        changed.members.retain(|member| member != node);
        changed.ids.remove(node);
        changed
    }

    /// Whether this node's member joined a running group (it was added by
    /// a membership change) rather than created it.
    pub fn joined(&self, node: &str) -> bool {
        self.id_of(node).is_some_and(|id| id > ADDED_MEMBER_ID_BASE)
    }
}

/// The ids groups are created with: places in the sorted member list,
/// from 1 (as `sluice_cluster::consensus::positional_member_ids`).
pub fn positional_ids(members: &[String]) -> BTreeMap<String, u64> {
    let mut sorted = members.to_vec();
    sorted.sort();
    sorted.dedup();
    sorted
        .into_iter()
        .enumerate()
        .map(|(position, member)| (member, position as u64 + 1))
        .collect()
}

/// A queue's membership, changed in place as the metadata log changes it:
/// a member that stays one keeps its queue (consumers, state) and only
/// learns who the others are now.
#[derive(Clone, Debug, Default)]
pub struct SharedMembership(Arc<RwLock<Membership>>);

impl SharedMembership {
    pub fn new(membership: Membership) -> Self {
        SharedMembership(Arc::new(RwLock::new(membership)))
    }

    pub fn get(&self) -> Membership {
        self.0
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    pub fn set(&self, membership: Membership) {
        *self
            .0
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = membership;
    }

    /// The members, home first; empty for a queue of another kind.
    pub fn members(&self) -> Vec<String> {
        self.get().members
    }
}

// Texts of refusals, RabbitMQ's where it has them.

pub fn queue_not_found(vhost: &str, name: &str) -> String {
    format!("no queue '{name}' in vhost '{vhost}'")
}

/// What `rabbitmq-queues` says for `add_member` and `delete_member` alike.
pub fn classic_queue_refused() -> String {
    "Cannot add members to a classic queue".to_owned()
}

pub fn last_member_refused(vhost: &str, name: &str) -> String {
    format!("last_node: the last member of queue '{name}' in vhost '{vhost}' cannot be removed")
}

pub fn node_not_in_cluster(node: &str) -> String {
    format!("node_not_running: {node} is not a node of this cluster")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(members: &[&str]) -> Vec<String> {
        members.iter().map(|member| (*member).to_owned()).collect()
    }

    #[test]
    fn membership_without_recorded_ids_has_the_ids_its_group_was_created_with() {
        // The home comes first in the list, not in the ids.
        let membership = Membership::of(&names(&["c", "a", "b"]), &BTreeMap::new());
        assert_eq!(membership.id_of("a"), Some(1));
        assert_eq!(membership.id_of("b"), Some(2));
        assert_eq!(membership.id_of("c"), Some(3));
        assert!(!membership.joined("c"));
    }

    #[test]
    fn membership_changes_renumber_no_one() {
        let membership = Membership::of(&names(&["b", "a"]), &BTreeMap::new());
        let shrunk = membership.without_member("a");
        assert_eq!(shrunk.members, ["b"]);
        assert_eq!(shrunk.id_of("b"), Some(2));
        let grown = shrunk.with_member("c", ADDED_MEMBER_ID_BASE + 40);
        assert_eq!(grown.members, ["b", "c"]);
        assert_eq!(grown.id_of("b"), Some(2));
        assert!(grown.joined("c"));
        assert_eq!(
            grown.by_id().into_iter().collect::<Vec<_>>(),
            [
                (2, "b".to_owned()),
                (ADDED_MEMBER_ID_BASE + 40, "c".to_owned())
            ]
        );
        // Added back, a removed member is a new one.
        let back = grown.with_member("a", ADDED_MEMBER_ID_BASE + 41);
        assert_eq!(back.id_of("a"), Some(ADDED_MEMBER_ID_BASE + 41));
    }
}
