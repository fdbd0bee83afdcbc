//! Password hashes as RabbitMQ stores them: base64 of a 4-byte random salt
//! followed by the digest of salt and password. A definitions file
//! exported by RabbitMQ carries them unchanged, and its users log in here
//! with the passwords they had there.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use md5::Digest;
use serde::{Deserialize, Serialize};

/// The digest under a password hash (`hashing_algorithm` in definitions).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum HashingAlgorithm {
    /// RabbitMQ's default since 3.6.
    #[default]
    #[serde(rename = "rabbit_password_hashing_sha256")]
    Sha256,
    #[serde(rename = "rabbit_password_hashing_sha512")]
    Sha512,
    /// Users of RabbitMQ before 3.6 (and definitions without an algorithm).
    #[serde(rename = "rabbit_password_hashing_md5")]
    Md5,
}

impl HashingAlgorithm {
    /// The algorithm a definitions file names; RabbitMQ reads a missing
    /// one as MD5, the only one there was before 3.6.
    pub fn from_definitions(name: Option<&str>) -> Result<Self, String> {
        match name {
            None | Some("rabbit_password_hashing_md5") => Ok(Self::Md5),
            Some("rabbit_password_hashing_sha256") => Ok(Self::Sha256),
            Some("rabbit_password_hashing_sha512") => Ok(Self::Sha512),
            Some(other) => Err(format!("unsupported password hashing algorithm '{other}'")),
        }
    }

    pub fn definitions_name(self) -> &'static str {
        match self {
            Self::Sha256 => "rabbit_password_hashing_sha256",
            Self::Sha512 => "rabbit_password_hashing_sha512",
            Self::Md5 => "rabbit_password_hashing_md5",
        }
    }

    fn digest(self, salt: &[u8], password: &[u8]) -> Vec<u8> {
        match self {
            Self::Sha256 | Self::Sha512 => {
                let algorithm = if self == Self::Sha256 {
                    &ring::digest::SHA256
                } else {
                    &ring::digest::SHA512
                };
                let mut context = ring::digest::Context::new(algorithm);
                context.update(salt);
                context.update(password);
                context.finish().as_ref().to_vec()
            }
            Self::Md5 => {
                let mut hasher = md5::Md5::new();
                hasher.update(salt);
                hasher.update(password);
                hasher.finalize().to_vec()
            }
        }
    }
}

const SALT_LEN: usize = 4;

/// A user's `password_hash`: salt and digest, base64 in definitions. Empty
/// for a passwordless user, whom no password lets in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PasswordHash(Vec<u8>);

impl PasswordHash {
    /// `password` hashed with a fresh random salt.
    pub fn new(algorithm: HashingAlgorithm, password: &str) -> Self {
        Self::with_salt(algorithm, rand::random::<[u8; SALT_LEN]>(), password)
    }

    pub fn with_salt(algorithm: HashingAlgorithm, salt: [u8; SALT_LEN], password: &str) -> Self {
        let mut bytes = salt.to_vec();
        bytes.extend(algorithm.digest(&salt, password.as_bytes()));
        Self(bytes)
    }

    /// From its base64 form; empty is passwordless.
    pub fn from_base64(encoded: &str) -> Result<Self, String> {
        BASE64
            .decode(encoded)
            .map(Self)
            .map_err(|error| format!("password_hash is not base64: {error}"))
    }

    pub fn to_base64(&self) -> String {
        BASE64.encode(&self.0)
    }

    pub fn is_passwordless(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `password` is the one hashed, in time that does not depend
    /// on where a wrong one differs. A blank password never matches, as
    /// RabbitMQ refuses blank passwords outright.
    pub fn verify(&self, algorithm: HashingAlgorithm, password: &str) -> bool {
        if password.is_empty() || self.0.len() <= SALT_LEN {
            return false;
        }
        let (salt, digest) = self.0.split_at(SALT_LEN);
        constant_time_equal(digest, &algorithm.digest(salt, password.as_bytes()))
    }
}

/// Compares in time independent of where the inputs differ.
fn constant_time_equal(left: &[u8], right: &[u8]) -> bool {
    if left.len() != right.len() {
        return false;
    }
    left.iter()
        .zip(right)
        .fold(0u8, |difference, (a, b)| difference | (a ^ b))
        == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn password_hash_matches_what_rabbitmq_computes() {
        // `rabbitmqctl hash_password` style: salt 0x908DC60A, password
        // "test12"; RabbitMQ's documented example hash for it.
        let hash =
            PasswordHash::from_base64("kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR").unwrap();
        assert!(hash.verify(HashingAlgorithm::Sha256, "test12"));
        assert!(!hash.verify(HashingAlgorithm::Sha256, "test13"));
        assert!(!hash.verify(HashingAlgorithm::Sha512, "test12"));
    }

    #[test]
    fn password_hash_round_trips_every_algorithm() {
        for algorithm in [
            HashingAlgorithm::Sha256,
            HashingAlgorithm::Sha512,
            HashingAlgorithm::Md5,
        ] {
            let hash = PasswordHash::new(algorithm, "s3cret");
            let decoded = PasswordHash::from_base64(&hash.to_base64()).unwrap();
            assert!(decoded.verify(algorithm, "s3cret"), "{algorithm:?}");
            assert!(!decoded.verify(algorithm, "s3cret "), "{algorithm:?}");
            assert!(!decoded.verify(algorithm, ""), "{algorithm:?}");
        }
    }

    #[test]
    fn password_hash_passwordless_lets_no_password_in() {
        let hash = PasswordHash::from_base64("").unwrap();
        assert!(hash.is_passwordless());
        assert!(!hash.verify(HashingAlgorithm::Sha256, "anything"));
        assert!(!hash.verify(HashingAlgorithm::Sha256, ""));
    }

    #[test]
    fn password_hash_algorithm_names_are_rabbitmqs() {
        assert_eq!(
            HashingAlgorithm::from_definitions(None),
            Ok(HashingAlgorithm::Md5)
        );
        for algorithm in [
            HashingAlgorithm::Sha256,
            HashingAlgorithm::Sha512,
            HashingAlgorithm::Md5,
        ] {
            assert_eq!(
                HashingAlgorithm::from_definitions(Some(algorithm.definitions_name())),
                Ok(algorithm)
            );
        }
        assert!(HashingAlgorithm::from_definitions(Some("bcrypt")).is_err());
    }
}
