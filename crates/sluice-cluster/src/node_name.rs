//! A node's name: `NAME@HOST:PORT`, where HOST:PORT is its inter-node
//! listener. RabbitMQ's node names are `NAME@HOST`; ours carry the port so
//! that several nodes can share a host without a port mapper.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

/// The longest node name accepted, in bytes: it travels in every link
/// handshake, and RabbitMQ's own names are Erlang atoms of at most 255.
pub const NODE_NAME_BYTES_MAX: usize = 255;

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeName {
    text: String,
    /// Where `NAME` ends in `text`.
    at: usize,
    /// The `HOST:PORT` part, resolved when it is an IP address.
    address: Option<SocketAddr>,
}

/// Why a node name was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NodeNameError {
    #[error("node name '{0}' is not NAME@HOST:PORT")]
    Shape(String),
    #[error("node name '{0}' has an invalid port")]
    Port(String),
    #[error("node name is longer than {NODE_NAME_BYTES_MAX} bytes")]
    TooLong,
}

impl NodeName {
    /// The part before `@`.
    pub fn name(&self) -> &str {
        &self.text[..self.at]
    }

    /// The `HOST:PORT` part: the node's inter-node listener.
    pub fn host_port(&self) -> &str {
        &self.text[self.at + 1..]
    }

    /// The listener's address when HOST is an IP address; a host name is
    /// resolved when the node is dialled.
    pub fn socket_address(&self) -> Option<SocketAddr> {
        self.address
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl FromStr for NodeName {
    type Err = NodeNameError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.len() > NODE_NAME_BYTES_MAX {
            return Err(NodeNameError::TooLong);
        }
        let shape = || NodeNameError::Shape(text.to_owned());
        let (name, host_port) = text.split_once('@').ok_or_else(shape)?;
        let (host, port) = host_port.rsplit_once(':').ok_or_else(shape)?;
        let name_ok = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if !name_ok || host.is_empty() || host.contains('@') {
            return Err(shape());
        }
        match port.parse::<u16>() {
            Ok(port) if port != 0 => {}
            _ => return Err(NodeNameError::Port(text.to_owned())),
        }
        Ok(NodeName {
            text: text.to_owned(),
            at: name.len(),
            address: host_port.parse().ok(),
        })
    }
}

impl fmt::Display for NodeName {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_name_parts_and_refusals() {
        let node: NodeName = "sluice1@127.0.0.1:25681".parse().unwrap();
        assert_eq!(node.name(), "sluice1");
        assert_eq!(node.host_port(), "127.0.0.1:25681");
        assert_eq!(
            node.socket_address(),
            Some("127.0.0.1:25681".parse().unwrap())
        );
        let ipv6: NodeName = "n@[::1]:5".parse().unwrap();
        assert_eq!(ipv6.socket_address(), Some("[::1]:5".parse().unwrap()));
        let named: NodeName = "rabbit@broker-1.internal:25672".parse().unwrap();
        assert_eq!(named.socket_address(), None);
        for bad in [
            "sluice1",
            "sluice1@host",
            "@h:1",
            "a b@h:1",
            "n@h:0",
            "n@h:x",
        ] {
            assert!(bad.parse::<NodeName>().is_err(), "{bad}");
        }
    }
}
