//! The vhost's policies and runtime parameters as the metadata log sets
//! them, and what a policy change does to the objects that exist: as
//! RabbitMQ's `rabbit_policy:update_matched_objects`, every queue and
//! exchange is matched again, and each takes its new effective settings
//! (a queue through [`crate::queue::Queue::apply_policy`], an exchange its
//! alternate exchange). This runs as the change is applied, on every node.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{read, write, VirtualHost};
use crate::error::{AmqpError, AmqpResult};
use crate::policy::{
    effective_alternate_exchange, effective_queue_arguments, Policy, PolicyJson,
    POLICIES_PER_VHOST_MAX,
};
use crate::queue::Queue;
use crate::runtime_parameters::{ParameterJson, PARAMETERS_PER_VHOST_MAX};

/// RabbitMQ's text for clearing what is not there.
const NO_SUCH_PARAMETER: &str = "Parameter does not exist";

impl VirtualHost {
    /// Creates or replaces a validated policy, then gives every object its
    /// new effective settings.
    ///
    /// # Errors
    /// 406 past [`POLICIES_PER_VHOST_MAX`].
    pub fn set_policy(&self, policy: Policy) -> AmqpResult<()> {
        {
            let mut policies = write(&self.policies);
            if policies.get(&policy.name).is_none() && policies.len() >= POLICIES_PER_VHOST_MAX {
                return Err(AmqpError::precondition_failed(format!(
                    "cannot set policy '{}': vhost '{}' holds {POLICIES_PER_VHOST_MAX} policies, the most it may",
                    policy.name, self.name
                )));
            }
            policies.put(policy);
        }
        self.apply_policies();
        Ok(())
    }

    /// Removes a policy, then gives every object its new effective
    /// settings.
    ///
    /// # Errors
    /// 404 `Parameter does not exist`, RabbitMQ's text, for a policy the
    /// vhost does not have.
    pub fn clear_policy(&self, name: &str) -> AmqpResult<()> {
        if write(&self.policies).remove(name).is_none() {
            return Err(AmqpError::not_found(NO_SUCH_PARAMETER));
        }
        self.apply_policies();
        Ok(())
    }

    /// The named policy, as it was given.
    pub fn policy(&self, name: &str) -> Option<PolicyJson> {
        read(&self.policies)
            .get(name)
            .map(|policy| policy.source.clone())
    }

    /// Every policy, as given, in name order.
    pub fn policy_list(&self) -> Vec<PolicyJson> {
        let mut policies: Vec<PolicyJson> = read(&self.policies)
            .iter()
            .map(|policy| policy.source.clone())
            .collect();
        policies.sort_by(|a, b| a.name.cmp(&b.name));
        policies
    }

    /// Makes the policies exactly `wanted` (a snapshot's), without
    /// applying them: the caller restores the objects, then applies.
    /// One that no longer validates (a snapshot of a newer version) is
    /// logged and left out.
    pub(super) fn restore_policies(&self, wanted: &[PolicyJson]) {
        let mut policies = write(&self.policies);
        *policies = Default::default();
        for json in wanted {
            match Policy::from_json(json) {
                Ok(policy) => policies.put(policy),
                Err(error) => tracing::error!(%error, "skipping a policy of the snapshot"),
            }
        }
    }

    /// Gives every queue and exchange of the vhost the effective settings
    /// the policies give it now. Queues compare and keep what is the same;
    /// routes cached by publishers are computed again when an alternate
    /// exchange changed.
    pub fn apply_policies(&self) {
        let generation = self.policy_generation.load(Ordering::Acquire);
        let mut alternate_changed = false;
        let exchanges: Vec<_> = read(&self.exchanges).values().cloned().collect();
        for exchange in exchanges {
            if exchange.is_default() {
                continue;
            }
            let policy = self.exchange_policy(&exchange.name);
            let wanted = effective_alternate_exchange(&exchange.arguments, policy.as_deref());
            let mut current = write(&exchange.alternate_exchange);
            if *current != wanted {
                *current = wanted;
                alternate_changed = true;
            }
        }
        if alternate_changed {
            // Released at once: moving the topology version on is the point.
            drop(self.exchanges_mut());
        }
        let queues: Vec<Arc<dyn Queue>> = read(&self.queues).values().cloned().collect();
        for queue in queues {
            let policy = self.queue_policy(queue.name());
            let effective =
                effective_queue_arguments(&queue.options().arguments, policy.as_deref());
            queue.apply_policy(&effective, generation);
        }
    }

    /// Creates or replaces a runtime parameter (validated by the caller).
    ///
    /// # Errors
    /// 406 past [`PARAMETERS_PER_VHOST_MAX`].
    pub fn set_parameter(
        &self,
        component: &str,
        name: &str,
        value: serde_json::Value,
    ) -> AmqpResult<()> {
        let mut parameters = write(&self.parameters);
        let key = (component.to_owned(), name.to_owned());
        if !parameters.contains_key(&key) && parameters.len() >= PARAMETERS_PER_VHOST_MAX {
            return Err(AmqpError::precondition_failed(format!(
                "cannot set parameter '{name}': vhost '{}' holds {PARAMETERS_PER_VHOST_MAX} parameters, the most it may",
                self.name
            )));
        }
        parameters.insert(key, value);
        Ok(())
    }

    /// # Errors
    /// 404 `Parameter does not exist` for one the vhost does not have.
    pub fn clear_parameter(&self, component: &str, name: &str) -> AmqpResult<()> {
        write(&self.parameters)
            .remove(&(component.to_owned(), name.to_owned()))
            .map(drop)
            .ok_or_else(|| AmqpError::not_found(NO_SUCH_PARAMETER))
    }

    /// Every runtime parameter but `vhost-limits`, by component and name.
    pub fn parameter_list(&self) -> Vec<ParameterJson> {
        read(&self.parameters)
            .iter()
            .map(|((component, name), value)| ParameterJson {
                vhost: self.name.to_string(),
                component: component.clone(),
                name: name.clone(),
                value: value.clone(),
            })
            .collect()
    }

    /// Makes the parameters exactly `wanted` (a snapshot's).
    pub(super) fn restore_parameters(&self, wanted: &[ParameterJson]) {
        *write(&self.parameters) = wanted
            .iter()
            .map(|parameter| {
                (
                    (parameter.component.clone(), parameter.name.clone()),
                    parameter.value.clone(),
                )
            })
            .collect();
    }
}
