//! Permission checks where RabbitMQ's channel makes them, against the
//! connection's user in its vhost.

use std::sync::Arc;

use sluice_core::access::{
    access_refused, topic_access_refused, Permission, ResourceKind, TopicPermissions,
};
use sluice_core::error::{AmqpError, AmqpResult};
use sluice_core::exchange::ExchangeKind;
use sluice_wire::content::RawProperties;

use crate::connection_context::ConnectionContext;

impl ConnectionContext {
    /// 403 ACCESS_REFUSED with RabbitMQ's text unless the user's
    /// permissions in this vhost grant `permission` on the resource.
    pub fn check_access(
        &self,
        permission: Permission,
        kind: ResourceKind,
        name: &str,
    ) -> AmqpResult<()> {
        let granted = self
            .broker
            .access
            .permissions(&self.user, &self.vhost.name)
            .is_some_and(|permissions| permissions.allows(permission, kind, name));
        if granted {
            Ok(())
        } else {
            Err(access_refused(kind, name, &self.vhost.name, &self.user))
        }
    }

    /// Topic permissions: on a topic exchange the user has them for, the
    /// routing key must match their write (publish) or read (binding)
    /// expression. A missing exchange is left to the caller's own check.
    pub fn check_topic_access(
        &self,
        exchange: &str,
        routing_key: &str,
        write: bool,
    ) -> AmqpResult<()> {
        match self
            .broker
            .access
            .topic_permissions(&self.user, &self.vhost.name, exchange)
        {
            Some(permissions) => self.check_routing_key(&permissions, exchange, routing_key, write),
            None => Ok(()),
        }
    }

    /// `routing_key` against `permissions`, the user's on `exchange`, when
    /// that is a topic exchange.
    fn check_routing_key(
        &self,
        permissions: &TopicPermissions,
        exchange: &str,
        routing_key: &str,
        write: bool,
    ) -> AmqpResult<()> {
        let is_topic = self
            .vhost
            .exchange(exchange)
            .is_ok_and(|found| found.kind == ExchangeKind::Topic);
        if !is_topic || permissions.allows(write, routing_key) {
            return Ok(());
        }
        Err(topic_access_refused(
            routing_key,
            exchange,
            &self.vhost.name,
            &self.user,
        ))
    }

    /// A publish's `user_id` property must name the connection's user,
    /// unless it is an `impersonator` (RabbitMQ's 406 and text).
    pub fn check_user_id(&self, properties: &RawProperties) -> AmqpResult<()> {
        if !properties.has_user_id() {
            return Ok(());
        }
        let decoded = properties
            .decode()
            .map_err(|_| AmqpError::syntax_error("cannot decode message properties"))?;
        let Some(claimed) = decoded.user_id() else {
            return Ok(());
        };
        if claimed.as_str() == &*self.user || self.broker.access.has_tag(&self.user, "impersonator")
        {
            return Ok(());
        }
        Err(AmqpError::precondition_failed(format!(
            "user_id property set to '{}' but authenticated user was '{}'",
            claimed.as_str(),
            self.user
        )))
    }
}

/// The exchange a channel last published to, remembered as allowed until
/// anyone's access changes: a publisher's usual case costs one atomic load
/// and one comparison, not a regular expression per message.
#[derive(Default)]
pub struct PublishPermit {
    generation: u64,
    exchange: Option<Box<[u8]>>,
    /// The user's topic permissions on it, whose routing-key check every
    /// publish then makes.
    topic: Option<Arc<TopicPermissions>>,
}

impl PublishPermit {
    /// `exchange` as the publish carried it: names are matched as text.
    pub fn check(&mut self, context: &ConnectionContext, exchange: &[u8]) -> AmqpResult<()> {
        let generation = context.broker.access.generation();
        if generation == self.generation && self.exchange.as_deref() == Some(exchange) {
            return Ok(());
        }
        let name = String::from_utf8_lossy(exchange);
        context.check_access(Permission::Write, ResourceKind::Exchange, &name)?;
        self.generation = generation;
        self.exchange = Some(exchange.into());
        self.topic =
            context
                .broker
                .access
                .topic_permissions(&context.user, &context.vhost.name, &name);
        Ok(())
    }

    /// After [`Self::check`] and the exchange's own checks: the routing
    /// key, when topic permissions restrict it.
    pub fn check_routing_key(
        &self,
        context: &ConnectionContext,
        exchange: &[u8],
        routing_key: &[u8],
    ) -> AmqpResult<()> {
        let Some(topic) = &self.topic else {
            return Ok(());
        };
        context.check_routing_key(
            topic,
            &String::from_utf8_lossy(exchange),
            &String::from_utf8_lossy(routing_key),
            true,
        )
    }
}
