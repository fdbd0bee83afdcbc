//! `set_policy`, `clear_policy` and `list_policies`, over RabbitMQ's
//! `/api/policies/{vhost}/{name}`: a PUT body of `pattern`, `definition`,
//! `priority` and `apply-to`.

use serde_json::{json, Value};

use super::args::ApplyTo;
use super::client::{api_path, Subject};
use super::error::{CtlError, CtlResult};
use super::listing::{self, POLICIES};
use super::Context;

/// A policy's settings as the command line gives them.
pub struct PolicySpec<'a> {
    pub name: &'a str,
    pub pattern: &'a str,
    /// A JSON object, as rabbitmqctl takes it: `{"max-length":1000}`.
    pub definition: &'a str,
    pub priority: i64,
    pub apply_to: ApplyTo,
}

fn policy_subject(vhost: &str, name: &str) -> Subject {
    Subject::InVhost {
        vhost: vhost.to_owned(),
        what: format!("policy '{name}' in vhost '{vhost}'"),
    }
}

/// The definition as a JSON object.
///
/// # Errors
/// [`CtlError::Input`] for text that is not a JSON object, before the
/// node is asked.
fn parse_definition(text: &str) -> CtlResult<Value> {
    match serde_json::from_str::<Value>(text) {
        Ok(definition @ Value::Object(_)) => Ok(definition),
        Ok(_) => Err(CtlError::Input(format!(
            "the policy definition '{text}' is not a JSON object"
        ))),
        Err(error) => Err(CtlError::Input(format!(
            "the policy definition '{text}' is not JSON: {error}"
        ))),
    }
}

pub fn set_policy(context: &Context, policy: &PolicySpec) -> CtlResult<()> {
    let vhost = &context.vhost;
    let definition = parse_definition(policy.definition)?;
    context.output.banner(&format!(
        "Setting policy \"{}\" for pattern \"{}\" to \"{}\" with priority \"{}\" for vhost \"{vhost}\" ...",
        policy.name, policy.pattern, policy.definition, policy.priority
    ));
    let body = json!({
        "pattern": policy.pattern,
        "definition": definition,
        "priority": policy.priority,
        "apply-to": policy.apply_to.as_str(),
    });
    context.client.put(
        &api_path(&["policies", vhost, policy.name]),
        &body,
        &policy_subject(vhost, policy.name),
    )
}

pub fn clear_policy(context: &Context, name: &str) -> CtlResult<()> {
    let vhost = &context.vhost;
    context.output.banner(&format!(
        "Clearing policy \"{name}\" on vhost \"{vhost}\" ..."
    ));
    context.client.delete(
        &api_path(&["policies", vhost, name]),
        &policy_subject(vhost, name),
    )
}

pub fn list_policies(context: &Context) -> CtlResult<()> {
    let vhost = &context.vhost;
    listing::list(
        context,
        &POLICIES,
        &api_path(&["policies", vhost]),
        &Subject::Vhost(vhost.clone()),
        &format!("Listing policies for vhost \"{vhost}\" ..."),
        &[],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn definitions_must_be_json_objects() {
        assert_eq!(
            parse_definition(r#"{"max-length": 10}"#).unwrap(),
            json!({"max-length": 10})
        );
        assert!(matches!(parse_definition("[1]"), Err(CtlError::Input(_))));
        assert!(matches!(
            parse_definition("{max-length: 10}"),
            Err(CtlError::Input(_))
        ));
    }
}
