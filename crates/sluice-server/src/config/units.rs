//! The value syntaxes of the configuration file: listener addresses,
//! sizes in RabbitMQ's information units and cuttlefish's bytesize, the
//! credit pair, comments.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use super::CREDIT_FLOW_CREDIT_MAX;

/// `credit_flow_default_credit`: the initial credit, alone or as RabbitMQ's
/// `{InitialCredit, MoreCreditAfter}` pair. The second number is accepted
/// and not used: a queue takes a publish in place, so there is no receiver
/// to grant credit back in batches; a paused reader resumes when its queue
/// drains instead (see docs/configuration.md).
pub(super) fn parse_credit(value: &str) -> Option<u32> {
    let inner = value
        .strip_prefix('{')
        .and_then(|rest| rest.strip_suffix('}'));
    let initial = match inner {
        Some(pair) => {
            let (initial, more_after) = pair.split_once(',')?;
            let more_after: u32 = more_after.trim().parse().ok()?;
            let initial: u32 = initial.trim().parse().ok()?;
            if more_after == 0 || more_after > initial {
                return None;
            }
            initial
        }
        None => value.parse().ok()?,
    };
    Some(initial).filter(|credit| (1..=CREDIT_FLOW_CREDIT_MAX).contains(credit))
}

/// Cuts a comment off a line. `#` starts a comment at the start of a line or after
/// whitespace, so values such as passwords may contain `#`.
pub(super) fn strip_comment(line: &str) -> &str {
    let bytes = line.as_bytes();
    for (i, &byte) in bytes.iter().enumerate() {
        if byte == b'#' && (i == 0 || bytes[i - 1].is_ascii_whitespace()) {
            return &line[..i];
        }
    }
    line
}

/// Parses a listener address in the forms RabbitMQ accepts for `listeners.tcp.*`: a bare
/// port (`5672`, meaning all IPv4 interfaces), `IP:PORT` (`127.0.0.1:5673`), and IPv6 with
/// the port after the last colon (`:::5672`, `::1:5672`) or in brackets (`[::1]:5672`).
/// Port 0 asks the OS for a free port, which tests use.
pub fn parse_listener(text: &str) -> Option<SocketAddr> {
    let text = text.trim();
    if let Ok(port) = text.parse::<u16>() {
        return Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port));
    }
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Some(addr);
    }
    let (ip, port) = text.rsplit_once(':')?;
    let ip = ip.trim_start_matches('[').trim_end_matches(']');
    Some(SocketAddr::new(ip.parse().ok()?, port.parse().ok()?))
}

/// Parses cuttlefish's `bytesize` (used by RabbitMQ for `frame_max`): an integer with an
/// optional `KB`, `MB` or `GB` suffix, each a power of 1024.
pub(super) fn parse_bytesize(text: &str) -> Option<u64> {
    let (digits, multiplier) = if let Some(digits) = text.strip_suffix("KB") {
        (digits, 1 << 10)
    } else if let Some(digits) = text.strip_suffix("MB") {
        (digits, 1 << 20)
    } else if let Some(digits) = text.strip_suffix("GB") {
        (digits, 1 << 30)
    } else {
        (text, 1)
    };
    parse_digits(digits)?.checked_mul(multiplier)
}

/// Examples of the information units [`parse_information_unit`] accepts, for error messages.
pub(super) const INFORMATION_UNIT_EXAMPLES: &str =
    "50000000, 50MB, 500MiB, 500Mi, 2GB, 2GiB, 2Gi, 1TB";

/// Parses RabbitMQ's information units (used by `vm_memory_high_watermark.absolute` and
/// `disk_free_limit.absolute`), after `rabbit_resource_monitor_misc:parse_information_unit`:
/// digits, then an optional unit, case-insensitive. `kib`, `ki` (and `mib`, `gib`, `tib`,
/// `pib` alike) are powers of 1024; `kb`, `mb`, `gb`, `tb`, `pb` are powers of 1000. A bare
/// `k`, `m`, `g` is a power of 1024, as in RabbitMQ 3.10, so a 3.10 `rabbitmq.conf` means
/// the same here. RabbitMQ 3.13 added the `T` and `P` units and the `Ki`, `Mi`, `Gi` forms,
/// which Sluice accepts too, but also made bare letters powers of 1000 (as Kubernetes
/// does), which Sluice does not follow.
pub(super) fn parse_information_unit(text: &str) -> Option<u64> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let number = parse_digits(digits)?;
    let unit = unit.to_ascii_lowercase();
    let multiplier: u64 = match unit.as_str() {
        "" => 1,
        "k" | "ki" | "kib" => 1 << 10,
        "m" | "mi" | "mib" => 1 << 20,
        "g" | "gi" | "gib" => 1 << 30,
        "t" | "ti" | "tib" => 1 << 40,
        "p" | "pi" | "pib" => 1 << 50,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "pb" => 1_000_000_000_000_000,
        _ => return None,
    };
    number.checked_mul(multiplier)
}

/// Digits only: `str::parse` would also take a leading `+`.
fn parse_digits(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}
