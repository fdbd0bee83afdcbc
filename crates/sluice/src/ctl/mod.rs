//! `sluice ctl`: the operator's command line, after rabbitmqctl and
//! rabbitmq-queues, over one node's management HTTP API.
//!
//! - [`args`]: the command line (rabbitmqctl's command names and order).
//! - [`client`]: the blocking HTTP client, URLs and the API's refusals.
//! - [`error`]: failures and their exit statuses (rabbitmqctl's).
//! - [`output`], [`table`]: banners, tables and JSON on standard output.
//! - [`listing`]: the `list_*` commands and their columns.
//! - one module per kind of object: [`node`] (status, health), [`access`]
//!   (users, vhosts, permissions), [`policies`], [`definitions`],
//!   [`queues`], [`members`] (quorum queue members), [`connections`].

pub mod access;
pub mod args;
pub mod client;
pub mod connections;
pub mod definitions;
pub mod error;
pub mod listing;
pub mod members;
pub mod node;
pub mod output;
pub mod policies;
pub mod queues;
pub mod table;

use std::process::ExitCode;

use args::{CtlArgs, CtlCommand};
use client::{api_path, Client, Subject};
use error::CtlResult;
use output::Output;

/// Seconds to wait for each answer without `--timeout`: rabbitmqctl's
/// default for most commands.
const REQUEST_TIMEOUT_SECONDS_DEFAULT: u64 = 60;

/// What every command works with.
pub struct Context {
    pub client: Client,
    pub output: Output,
    /// `-p`: the vhost of commands that act in one.
    pub vhost: String,
}

/// Runs one command; a failure is printed as one line on stderr, `Error:
/// <what>`, and gives its exit status.
pub fn run(args: CtlArgs) -> ExitCode {
    match run_command(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("Error: {error}");
            error.exit_status().into()
        }
    }
}

fn run_command(args: CtlArgs) -> CtlResult<()> {
    let options = args.options;
    let await_seconds = options
        .timeout
        .unwrap_or(node::AWAIT_STARTUP_SECONDS_DEFAULT);
    let request_seconds = match args.command {
        // Each attempt of await_startup is bounded by the whole wait.
        CtlCommand::AwaitStartup => await_seconds.min(REQUEST_TIMEOUT_SECONDS_DEFAULT),
        _ => options.timeout.unwrap_or(REQUEST_TIMEOUT_SECONDS_DEFAULT),
    };
    let context = Context {
        client: Client::new(
            client::base_url(&options.node)?,
            &options.username,
            &options.password,
            request_seconds,
        ),
        output: Output {
            formatter: options.formatter,
            quiet: options.quiet,
            table_headers: !options.no_table_headers,
        },
        vhost: options.vhost,
    };
    dispatch(&context, args.command, await_seconds)
}

fn dispatch(context: &Context, command: CtlCommand, await_seconds: u64) -> CtlResult<()> {
    use CtlCommand::*;
    match command {
        Status => node::status(context),
        ClusterStatus => node::cluster_status(context),
        Ping => node::ping(context),
        AwaitStartup => node::await_startup(context, await_seconds),
        CheckIfNodeIsQuorumCritical => node::check_if_node_is_quorum_critical(context),
        ListQueues { columns } => list_in_vhost(context, &listing::QUEUES, "queues", &columns),
        ListExchanges { columns } => {
            list_in_vhost(context, &listing::EXCHANGES, "exchanges", &columns)
        }
        ListBindings { columns } => {
            list_in_vhost(context, &listing::BINDINGS, "bindings", &columns)
        }
        ListConsumers { columns } => {
            list_in_vhost(context, &listing::CONSUMERS, "consumers", &columns)
        }
        ListConnections { columns } => listing::list(
            context,
            &listing::CONNECTIONS,
            "/api/connections",
            &Subject::Node,
            "Listing connections ...",
            &columns,
        ),
        ListChannels { columns } => listing::list(
            context,
            &listing::CHANNELS,
            "/api/channels",
            &Subject::Node,
            "Listing channels ...",
            &columns,
        ),
        AddUser { name, password } => access::add_user(context, &name, &password),
        DeleteUser { name } => access::delete_user(context, &name),
        ChangePassword { name, password } => access::change_password(context, &name, &password),
        SetUserTags { name, tags } => access::set_user_tags(context, &name, &tags),
        ListUsers => access::list_users(context),
        AddVhost { name } => access::add_vhost(context, &name),
        DeleteVhost { name } => access::delete_vhost(context, &name),
        ListVhosts { columns } => access::list_vhosts(context, &columns),
        SetPermissions {
            user,
            configure,
            write,
            read,
        } => access::set_permissions(context, &user, [&configure, &write, &read]),
        ClearPermissions { user } => access::clear_permissions(context, &user),
        ListPermissions => access::list_permissions(context),
        ListUserPermissions { user } => access::list_user_permissions(context, &user),
        SetPolicy {
            priority,
            apply_to,
            name,
            pattern,
            definition,
        } => policies::set_policy(
            context,
            &policies::PolicySpec {
                name: &name,
                pattern: &pattern,
                definition: &definition,
                priority,
                apply_to,
            },
        ),
        ClearPolicy { name } => policies::clear_policy(context, &name),
        ListPolicies => policies::list_policies(context),
        ExportDefinitions { file } => definitions::export_definitions(context, &file),
        ImportDefinitions { file } => definitions::import_definitions(context, &file),
        CloseConnection { name, reason } => connections::close_connection(context, &name, &reason),
        PurgeQueue { name } => queues::purge_queue(context, &name),
        AddMember { queue, node } => members::add_member(context, &queue, &node),
        DeleteMember { queue, node } => members::delete_member(context, &queue, &node),
        Grow {
            node,
            strategy,
            vhost_pattern,
            queue_pattern,
        } => members::grow(context, &node, strategy, &vhost_pattern, &queue_pattern),
        Shrink { node } => members::shrink(context, &node),
        DeleteQueue {
            name,
            if_empty,
            if_unused,
        } => queues::delete_queue(context, &name, if_empty, if_unused),
    }
}

/// A listing of the `-p` vhost: `/api/{resource}/{vhost}`, after
/// rabbitmqctl's "Listing queues for vhost / ..." banner.
fn list_in_vhost(
    context: &Context,
    catalogue: &listing::Catalogue,
    resource: &str,
    columns: &[String],
) -> CtlResult<()> {
    let vhost = &context.vhost;
    listing::list(
        context,
        catalogue,
        &api_path(&[resource, vhost]),
        &Subject::Vhost(vhost.clone()),
        &format!("Listing {resource} for vhost {vhost} ..."),
        columns,
    )
}
