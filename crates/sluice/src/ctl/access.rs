//! Users, vhosts and permissions: `add_user`, `delete_user`,
//! `change_password`, `set_user_tags`, `list_users`, `add_vhost`,
//! `delete_vhost`, `list_vhosts`, `set_permissions`, `clear_permissions`,
//! `list_permissions`, `list_user_permissions`.

use serde_json::{json, Value};

use super::client::{api_path, Subject};
use super::error::{CtlError, CtlResult};
use super::listing::{self, PERMISSIONS, USERS, USER_PERMISSIONS, VHOSTS};
use super::Context;

/// Creates `name`; refuses a user that exists already, as rabbitmqctl
/// does (a PUT alone would silently replace its password and tags).
pub fn add_user(context: &Context, name: &str, password: &str) -> CtlResult<()> {
    context
        .output
        .banner(&format!("Adding user \"{name}\" ..."));
    let path = api_path(&["users", name]);
    let subject = Subject::User(name.to_owned());
    if context.client.exists(&path, &subject)? {
        return Err(CtlError::AlreadyExists(format!("user '{name}'")));
    }
    context
        .client
        .put(&path, &json!({"password": password, "tags": ""}), &subject)
}

pub fn delete_user(context: &Context, name: &str) -> CtlResult<()> {
    context
        .output
        .banner(&format!("Deleting user \"{name}\" ..."));
    context
        .client
        .delete(&api_path(&["users", name]), &Subject::User(name.to_owned()))
}

/// The user's current tags, as the API lists them; also checks that the
/// user exists, since a PUT would create it.
fn tags_of(context: &Context, name: &str) -> CtlResult<Value> {
    let user = context
        .client
        .get(&api_path(&["users", name]), &Subject::User(name.to_owned()))?;
    Ok(match &user["tags"] {
        Value::Array(tags) => Value::Array(tags.clone()),
        // Versions of the API before 3.9 gave tags as one comma-separated string.
        Value::String(text) => text.split(',').map(str::trim).collect(),
        _ => Value::Array(Vec::new()),
    })
}

pub fn change_password(context: &Context, name: &str, password: &str) -> CtlResult<()> {
    context
        .output
        .banner(&format!("Changing password for user \"{name}\" ..."));
    let tags = tags_of(context, name)?;
    context.client.put(
        &api_path(&["users", name]),
        &json!({"password": password, "tags": tags}),
        &Subject::User(name.to_owned()),
    )
}

pub fn set_user_tags(context: &Context, name: &str, tags: &[String]) -> CtlResult<()> {
    context.output.banner(&format!(
        "Setting tags for user \"{name}\" to [{}] ...",
        tags.join(", ")
    ));
    tags_of(context, name)?;
    // Without a password the API keeps the user's own.
    context.client.put(
        &api_path(&["users", name]),
        &json!({"tags": tags}),
        &Subject::User(name.to_owned()),
    )
}

pub fn list_users(context: &Context) -> CtlResult<()> {
    listing::list(
        context,
        &USERS,
        "/api/users",
        &Subject::Node,
        "Listing users ...",
        &[],
    )
}

pub fn add_vhost(context: &Context, name: &str) -> CtlResult<()> {
    context
        .output
        .banner(&format!("Adding vhost \"{name}\" ..."));
    context.client.put(
        &api_path(&["vhosts", name]),
        &json!({}),
        &Subject::Vhost(name.to_owned()),
    )
}

pub fn delete_vhost(context: &Context, name: &str) -> CtlResult<()> {
    context
        .output
        .banner(&format!("Deleting vhost \"{name}\" ..."));
    context.client.delete(
        &api_path(&["vhosts", name]),
        &Subject::Vhost(name.to_owned()),
    )
}

pub fn list_vhosts(context: &Context, columns: &[String]) -> CtlResult<()> {
    listing::list(
        context,
        &VHOSTS,
        "/api/vhosts",
        &Subject::Node,
        "Listing vhosts ...",
        columns,
    )
}

fn permission_subject(vhost: &str, user: &str) -> Subject {
    Subject::InVhost {
        vhost: vhost.to_owned(),
        what: format!("permissions of user '{user}' in vhost '{vhost}'"),
    }
}

/// Sets the user's patterns in the vhost. The API answers a missing user
/// or vhost alike (400 "vhost_or_user_not_found"), so that answer is
/// looked into to say which is missing.
pub fn set_permissions(context: &Context, user: &str, patterns: [&str; 3]) -> CtlResult<()> {
    let vhost = &context.vhost;
    context.output.banner(&format!(
        "Setting permissions for user \"{user}\" in vhost \"{vhost}\" ..."
    ));
    let [configure, write, read] = patterns;
    let body = json!({"configure": configure, "write": write, "read": read});
    let path = api_path(&["permissions", vhost, user]);
    let subject = permission_subject(vhost, user);
    match context.client.put(&path, &body, &subject) {
        Err(CtlError::Refused(reason)) if reason == "vhost_or_user_not_found" => {
            which_is_missing(context, user).map_or(Err(CtlError::Refused(reason)), Err)
        }
        result => result,
    }
}

/// The user or the vhost, whichever does not exist.
fn which_is_missing(context: &Context, user: &str) -> Option<CtlError> {
    let vhost = &context.vhost;
    let user_subject = Subject::User(user.to_owned());
    if let Ok(false) = context
        .client
        .exists(&api_path(&["users", user]), &user_subject)
    {
        return Some(CtlError::NotFound {
            what: format!("user '{user}'"),
            is_user: true,
        });
    }
    let vhost_subject = Subject::Vhost(vhost.clone());
    if let Ok(false) = context
        .client
        .exists(&api_path(&["vhosts", vhost]), &vhost_subject)
    {
        return Some(CtlError::NotFound {
            what: format!("vhost '{vhost}'"),
            is_user: false,
        });
    }
    None
}

pub fn clear_permissions(context: &Context, user: &str) -> CtlResult<()> {
    let vhost = &context.vhost;
    context.output.banner(&format!(
        "Clearing permissions for user \"{user}\" in vhost \"{vhost}\" ..."
    ));
    context.client.delete(
        &api_path(&["permissions", vhost, user]),
        &permission_subject(vhost, user),
    )
}

pub fn list_permissions(context: &Context) -> CtlResult<()> {
    let vhost = &context.vhost;
    listing::list(
        context,
        &PERMISSIONS,
        &api_path(&["vhosts", vhost, "permissions"]),
        &Subject::Vhost(vhost.clone()),
        &format!("Listing permissions for vhost \"{vhost}\" ..."),
        &[],
    )
}

pub fn list_user_permissions(context: &Context, user: &str) -> CtlResult<()> {
    listing::list(
        context,
        &USER_PERMISSIONS,
        &api_path(&["users", user, "permissions"]),
        &Subject::User(user.to_owned()),
        &format!("Listing permissions for user \"{user}\" ..."),
        &[],
    )
}
