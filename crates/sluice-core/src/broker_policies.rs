//! The node's policies and runtime parameters: the metadata commands that
//! set and clear them, applied alike on every node, and what the
//! management API reads (in RabbitMQ's definitions JSON shapes).
//!
//! To change one, the HTTP layer validates it first with
//! [`crate::policy::validate_policy`] or
//! [`crate::runtime_parameters::validate_parameter`] (RabbitMQ's error
//! text, at once) and then proposes the command through
//! `broker.metadata.propose(..)`; every node validates it again as it
//! applies it, so all of them give the same reply.

use std::sync::Arc;

use crate::broker::Broker;
use crate::error::{AmqpError, AmqpResult};
use crate::policy::{Policy, PolicyJson};
use crate::runtime_parameters::{
    validate_parameter, vhost_limits_of, vhost_limits_value, GlobalParameterJson, ParameterJson,
    GLOBAL_PARAMETERS_MAX, VHOST_LIMITS_COMPONENT, VHOST_LIMITS_NAME,
};
use crate::vhost::VirtualHost;

/// RabbitMQ's text for clearing what is not there.
const NO_SUCH_PARAMETER: &str = "Parameter does not exist";

impl Broker {
    /// Every policy of every vhost, by vhost and name, as given:
    /// `GET /api/policies`.
    pub fn policies(&self) -> Vec<PolicyJson> {
        let mut vhosts = self.vhosts();
        vhosts.sort_by(|a, b| a.name.cmp(&b.name));
        vhosts
            .iter()
            .flat_map(|vhost| vhost.policy_list())
            .collect()
    }

    /// A vhost's policies by name; None when the vhost does not exist:
    /// `GET /api/policies/{vhost}`.
    pub fn vhost_policies(&self, vhost: &str) -> Option<Vec<PolicyJson>> {
        self.vhost(vhost).map(|vhost| vhost.policy_list())
    }

    /// One policy, as given: `GET /api/policies/{vhost}/{name}`.
    pub fn policy(&self, vhost: &str, name: &str) -> Option<PolicyJson> {
        self.vhost(vhost)?.policy(name)
    }

    /// The policy that applies to a queue of that name now (`policy` and
    /// `effective_policy_definition` of `GET /api/queues`); None when
    /// none does or the vhost does not exist.
    pub fn queue_policy(&self, vhost: &str, queue: &str) -> Option<PolicyJson> {
        let policy = self.vhost(vhost)?.queue_policy(queue)?;
        Some(policy.source.clone())
    }

    /// The policy that applies to an exchange of that name now (`policy`
    /// of `GET /api/exchanges`).
    pub fn exchange_policy(&self, vhost: &str, exchange: &str) -> Option<PolicyJson> {
        let policy = self.vhost(vhost)?.exchange_policy(exchange)?;
        Some(policy.source.clone())
    }

    /// Every vhost's runtime parameters, `vhost-limits` among them, by
    /// vhost, component and name: `GET /api/parameters`.
    pub fn parameters(&self) -> Vec<ParameterJson> {
        let mut vhosts = self.vhosts();
        vhosts.sort_by(|a, b| a.name.cmp(&b.name));
        vhosts
            .iter()
            .flat_map(|vhost| self.parameters_of(vhost))
            .collect()
    }

    /// A vhost's runtime parameters; None when the vhost does not exist:
    /// `GET /api/parameters/{component}/{vhost}` after a filter.
    pub fn vhost_parameters(&self, vhost: &str) -> Option<Vec<ParameterJson>> {
        self.vhost(vhost).map(|vhost| self.parameters_of(&vhost))
    }

    /// One parameter: `GET /api/parameters/{component}/{vhost}/{name}`.
    pub fn parameter(&self, component: &str, vhost: &str, name: &str) -> Option<ParameterJson> {
        self.vhost_parameters(vhost)?
            .into_iter()
            .find(|parameter| parameter.component == component && parameter.name == name)
    }

    /// The global parameters by name: `GET /api/global-parameters`.
    pub fn global_parameters(&self) -> Vec<GlobalParameterJson> {
        self.global_parameter_list()
    }

    pub fn global_parameter(&self, name: &str) -> Option<GlobalParameterJson> {
        let value = self.read_global_parameters().get(name).cloned()?;
        Some(GlobalParameterJson {
            name: name.to_owned(),
            value,
        })
    }

    fn parameters_of(&self, vhost: &Arc<VirtualHost>) -> Vec<ParameterJson> {
        let limits =
            vhost_limits_value(&self.access.vhost_limits(&vhost.name)).map(|value| ParameterJson {
                vhost: vhost.name.to_string(),
                component: VHOST_LIMITS_COMPONENT.to_owned(),
                name: VHOST_LIMITS_NAME.to_owned(),
                value,
            });
        let mut parameters = vhost.parameter_list();
        parameters.extend(limits);
        parameters.sort_by(|a, b| (&a.component, &a.name).cmp(&(&b.component, &b.name)));
        parameters
    }

    pub(crate) fn global_parameter_list(&self) -> Vec<GlobalParameterJson> {
        self.read_global_parameters()
            .iter()
            .map(|(name, value)| GlobalParameterJson {
                name: name.clone(),
                value: value.clone(),
            })
            .collect()
    }

    fn read_global_parameters(
        &self,
    ) -> std::sync::RwLockReadGuard<'_, std::collections::BTreeMap<String, serde_json::Value>> {
        self.global_parameters
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write_global_parameters(
        &self,
    ) -> std::sync::RwLockWriteGuard<'_, std::collections::BTreeMap<String, serde_json::Value>>
    {
        self.global_parameters
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A snapshot's global parameters, exactly.
    pub(crate) fn restore_global_parameters(&self, wanted: &[GlobalParameterJson]) {
        *self.write_global_parameters() = wanted
            .iter()
            .map(|parameter| (parameter.name.clone(), parameter.value.clone()))
            .collect();
    }

    /// `SetPolicy`, as every node applies it.
    pub(crate) fn apply_set_policy(&self, json: &PolicyJson) -> AmqpResult<()> {
        let vhost = self.vhost_of_parameter(&json.vhost)?;
        let policy = Policy::from_json(json)
            .map_err(|error| AmqpError::precondition_failed(error.rabbitmq_text()))?;
        if vhost.policy(&json.name).as_ref() == Some(json) {
            // Set again as it is (a definitions file read at every start):
            // nothing changes, as RabbitMQ notifies nobody then.
            return Ok(());
        }
        self.next_policy_generation();
        vhost.set_policy(policy)
    }

    /// `ClearPolicy`, as every node applies it.
    pub(crate) fn apply_clear_policy(&self, vhost: &str, name: &str) -> AmqpResult<()> {
        let vhost = self.vhost_of_parameter(vhost)?;
        self.next_policy_generation();
        vhost.clear_policy(name)
    }

    /// `SetParameter`, as every node applies it.
    pub(crate) fn apply_set_parameter(&self, parameter: ParameterJson) -> AmqpResult<()> {
        let vhost = self.vhost_of_parameter(&parameter.vhost)?;
        validate_parameter(&parameter)
            .map_err(|error| AmqpError::precondition_failed(error.rabbitmq_text()))?;
        if parameter.component == VHOST_LIMITS_COMPONENT {
            // Validated just above.
            let limits = vhost_limits_of(&parameter.name, &parameter.value).unwrap_or_default();
            self.access.set_vhost_limits(&vhost.name, limits);
            return Ok(());
        }
        vhost.set_parameter(&parameter.component, &parameter.name, parameter.value)
    }

    /// `ClearParameter`, as every node applies it.
    pub(crate) fn apply_clear_parameter(
        &self,
        component: &str,
        vhost: &str,
        name: &str,
    ) -> AmqpResult<()> {
        let vhost = self.vhost_of_parameter(vhost)?;
        if component == VHOST_LIMITS_COMPONENT {
            if self.access.vhost_limits(&vhost.name) == Default::default() {
                return Err(AmqpError::not_found(NO_SUCH_PARAMETER));
            }
            self.access
                .set_vhost_limits(&vhost.name, Default::default());
            return Ok(());
        }
        vhost.clear_parameter(component, name)
    }

    /// `SetGlobalParameter`, as every node applies it.
    pub(crate) fn apply_set_global_parameter(
        &self,
        name: &str,
        value: serde_json::Value,
    ) -> AmqpResult<()> {
        let mut parameters = self.write_global_parameters();
        if !parameters.contains_key(name) && parameters.len() >= GLOBAL_PARAMETERS_MAX {
            return Err(AmqpError::precondition_failed(format!(
                "cannot set global parameter '{name}': the cluster holds {GLOBAL_PARAMETERS_MAX}, the most it may"
            )));
        }
        parameters.insert(name.to_owned(), value);
        Ok(())
    }

    /// `ClearGlobalParameter`, as every node applies it.
    pub(crate) fn apply_clear_global_parameter(&self, name: &str) -> AmqpResult<()> {
        self.write_global_parameters()
            .remove(name)
            .map(drop)
            .ok_or_else(|| AmqpError::not_found(NO_SUCH_PARAMETER))
    }

    /// The vhost a policy or parameter change names.
    ///
    /// # Errors
    /// 404 when it does not exist.
    fn vhost_of_parameter(&self, name: &str) -> AmqpResult<Arc<VirtualHost>> {
        self.vhost(name)
            .ok_or_else(|| AmqpError::not_found(format!("vhost '{name}' does not exist")))
    }
}

#[cfg(test)]
#[path = "broker_policies_test.rs"]
mod tests;
