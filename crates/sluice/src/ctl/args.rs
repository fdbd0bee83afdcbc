//! `sluice ctl`'s command line: rabbitmqctl's command names, argument
//! order and options, parsed by clap. The options before the command
//! (`-n`, `-p`, `-q`, `--formatter`...) may also follow it, as
//! rabbitmqctl allows.

use clap::{Args, Subcommand, ValueEnum};

use super::output::Formatter;

#[derive(Debug, Args)]
pub struct CtlArgs {
    #[command(flatten)]
    pub options: GlobalOptions,

    #[command(subcommand)]
    pub command: CtlCommand,
}

#[derive(Debug, Args)]
pub struct GlobalOptions {
    /// The node's management API: HOST[:PORT] (port 15672 when left out)
    /// or http://HOST:PORT
    #[arg(
        short = 'n',
        long,
        global = true,
        value_name = "NODE",
        default_value = "127.0.0.1:15672"
    )]
    pub node: String,

    /// User to log in to the management API as
    #[arg(
        long,
        global = true,
        env = "SLUICE_CTL_USERNAME",
        default_value = "guest"
    )]
    pub username: String,

    /// That user's password
    #[arg(
        long,
        global = true,
        env = "SLUICE_CTL_PASSWORD",
        default_value = "guest",
        hide_default_value = true,
        hide_env_values = true
    )]
    pub password: String,

    /// Virtual host the command acts in
    #[arg(short = 'p', long, global = true, default_value = "/")]
    pub vhost: String,

    /// How to print results
    #[arg(long, global = true, value_enum, default_value_t = Formatter::Table)]
    pub formatter: Formatter,

    /// Leave out the informational lines ("Listing queues for vhost / ...")
    #[arg(short = 'q', long, global = true)]
    pub quiet: bool,

    /// Leave out the header row of tables
    #[arg(long, global = true)]
    pub no_table_headers: bool,

    /// Seconds to wait for each answer of the node (await_startup: for the
    /// node to come up, 300 unless given)
    #[arg(short = 't', long, global = true, value_name = "SECONDS")]
    pub timeout: Option<u64>,
}

/// What a policy applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ApplyTo {
    Queues,
    Exchanges,
    All,
}

impl ApplyTo {
    pub fn as_str(self) -> &'static str {
        match self {
            ApplyTo::Queues => "queues",
            ApplyTo::Exchanges => "exchanges",
            ApplyTo::All => "all",
        }
    }
}

/// Which quorum queues `grow` adds a member to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum GrowStrategy {
    /// Every one that has no member on the node
    All,
    /// Only those with an even number of members
    Even,
}

impl GrowStrategy {
    pub fn as_str(self) -> &'static str {
        match self {
            GrowStrategy::All => "all",
            GrowStrategy::Even => "even",
        }
    }
}

// snake_case names the commands as rabbitmqctl does; it also applies to the
// commands' own options, so those spell their long names out.
#[derive(Debug, Subcommand)]
#[command(rename_all = "snake_case")]
pub enum CtlCommand {
    /// The node's versions, uptime, memory, disk, alarms and listeners
    Status,
    /// The cluster's name, nodes, running nodes and alarms
    ClusterStatus,
    /// Checks that the node's management API answers
    Ping,
    /// Waits until the node's management API answers (up to --timeout, 300 s by default)
    AwaitStartup,
    /// Fails (exit 69) when stopping the node would leave a quorum queue without a majority
    CheckIfNodeIsQuorumCritical,

    /// Queues of the vhost: name, type, messages, messages_ready, messages_unacknowledged, consumers, leader, members, online, node, durable, auto_delete, arguments, policy, state... [default: name messages]
    ListQueues { columns: Vec<String> },
    /// Connections: name, user, vhost, peer_host, peer_port, state, channels, protocol... [default: user peer_host peer_port state]
    ListConnections { columns: Vec<String> },
    /// Channels: name, connection, number, user, vhost, consumer_count, messages_unacknowledged, prefetch_count, confirm... [default: name user consumer_count messages_unacknowledged]
    ListChannels { columns: Vec<String> },
    /// Consumers of the vhost: queue_name, channel_name, consumer_tag, ack_required, prefetch_count, active...
    ListConsumers { columns: Vec<String> },
    /// Exchanges of the vhost: name, type, durable, auto_delete, internal, arguments, policy [default: name type]
    ListExchanges { columns: Vec<String> },
    /// Bindings of the vhost: source_name, source_kind, destination_name, destination_kind, routing_key, arguments
    ListBindings { columns: Vec<String> },

    /// Creates a user (with no tags)
    AddUser {
        name: String,
        // Its own id: clap would otherwise take it for the global --password.
        #[arg(
            id = "new_password",
            value_name = "PASSWORD",
            allow_hyphen_values = true
        )]
        password: String,
    },
    /// Deletes a user, closing its connections
    DeleteUser { name: String },
    /// Sets a user's password
    ChangePassword {
        name: String,
        // Its own id: clap would otherwise take it for the global --password.
        #[arg(
            id = "new_password",
            value_name = "PASSWORD",
            allow_hyphen_values = true
        )]
        password: String,
    },
    /// Replaces a user's tags (none clears them)
    SetUserTags { name: String, tags: Vec<String> },
    /// Users and their tags
    ListUsers,

    /// Creates a vhost
    AddVhost { name: String },
    /// Deletes a vhost and everything in it
    DeleteVhost { name: String },
    /// Vhosts: name, description, tags, tracing, default_queue_type [default: name]
    ListVhosts { columns: Vec<String> },

    /// Sets a user's configure, write and read patterns in the vhost
    SetPermissions {
        user: String,
        #[arg(allow_hyphen_values = true)]
        configure: String,
        #[arg(allow_hyphen_values = true)]
        write: String,
        #[arg(allow_hyphen_values = true)]
        read: String,
    },
    /// Removes a user's permissions in the vhost
    ClearPermissions { user: String },
    /// Permissions in the vhost
    ListPermissions,
    /// A user's permissions in every vhost
    ListUserPermissions { user: String },

    /// Sets a policy in the vhost: DEFINITION is a JSON object such as '{"max-length":1000}'
    SetPolicy {
        /// Which policy wins when several match (the highest)
        #[arg(long = "priority", default_value_t = 0, allow_negative_numbers = true)]
        priority: i64,
        /// What the policy applies to
        #[arg(long = "apply-to", value_enum, default_value_t = ApplyTo::All)]
        apply_to: ApplyTo,
        name: String,
        #[arg(allow_hyphen_values = true)]
        pattern: String,
        definition: String,
    },
    /// Removes a policy from the vhost
    ClearPolicy { name: String },
    /// Policies in the vhost
    ListPolicies,

    /// Writes every definition (users, vhosts, permissions, policies, queues, exchanges, bindings) as JSON to FILE, or to standard output for -
    ExportDefinitions {
        #[arg(allow_hyphen_values = true)]
        file: String,
    },
    /// Imports definitions from a JSON FILE, or from standard input for -
    ImportDefinitions {
        #[arg(allow_hyphen_values = true)]
        file: String,
    },

    /// Closes a connection (by its name, as list_connections name shows it); its client hears 320 CONNECTION_FORCED and REASON
    CloseConnection {
        name: String,
        #[arg(allow_hyphen_values = true)]
        reason: String,
    },
    /// Removes the ready messages of a queue in the vhost
    PurgeQueue { name: String },
    /// Adds a member (replica) of a quorum queue of the vhost on NODE; it catches up, then votes (rabbitmq-queues add_member)
    AddMember {
        queue: String,
        // Its own id: clap would otherwise take it for the global --node.
        #[arg(id = "member_node", value_name = "NODE")]
        node: String,
    },
    /// Removes the member of a quorum queue of the vhost on NODE, which erases its copy (rabbitmq-queues delete_member)
    DeleteMember {
        queue: String,
        // Its own id: clap would otherwise take it for the global --node.
        #[arg(id = "member_node", value_name = "NODE")]
        node: String,
    },
    /// Adds a member on NODE to every matching quorum queue without one there: all of them, or those with an even number of members
    Grow {
        // Its own id: clap would otherwise take it for the global --node.
        #[arg(id = "member_node", value_name = "NODE")]
        node: String,
        #[arg(value_enum)]
        strategy: GrowStrategy,
        /// Vhosts whose queues grow (a regular expression)
        #[arg(
            long = "vhost-pattern",
            default_value = ".*",
            allow_hyphen_values = true
        )]
        vhost_pattern: String,
        /// Queues that grow (a regular expression)
        #[arg(
            long = "queue-pattern",
            default_value = ".*",
            allow_hyphen_values = true
        )]
        queue_pattern: String,
    },
    /// Removes the member on NODE of every quorum queue that has one there and another elsewhere
    Shrink {
        // Its own id: clap would otherwise take it for the global --node.
        #[arg(id = "member_node", value_name = "NODE")]
        node: String,
    },
    /// Deletes a queue in the vhost
    DeleteQueue {
        name: String,
        /// Only if it has no messages
        #[arg(short = 'e', long = "if-empty", visible_alias = "if_empty")]
        if_empty: bool,
        /// Only if it has no consumers
        #[arg(short = 'u', long = "if-unused", visible_alias = "if_unused")]
        if_unused: bool,
    },
}
