//! The user a verified client certificate names, for SASL EXTERNAL: its
//! subject as RabbitMQ writes it (`rabbit_cert_info:subject/1`), or its
//! common name (`rabbit_ssl:peer_cert_auth_name/2`), so that the users a
//! RabbitMQ deployment created for its certificates match here unchanged.

use x509_cert::der::asn1::AnyRef;
use x509_cert::der::{Decode, Tag, Tagged};
use x509_cert::Certificate;

use super::config::CertificateLoginFrom;

/// What SASL EXTERNAL logs in as on a connection whose client presented a
/// verified certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CertificateLogin {
    /// The user the certificate names.
    User(String),
    /// The certificate names none (no common name, or a subject that cannot
    /// be read): EXTERNAL is refused with this reason, as RabbitMQ's "no
    /// name found".
    NoName(&'static str),
}

impl CertificateLogin {
    /// The login a client certificate (DER) gives, by `login_from`.
    pub fn from_certificate(der: &[u8], login_from: CertificateLoginFrom) -> Self {
        let Ok(certificate) = Certificate::from_der(der) else {
            return CertificateLogin::NoName("the certificate's subject cannot be read");
        };
        let subject = &certificate.tbs_certificate.subject;
        match login_from {
            CertificateLoginFrom::DistinguishedName => {
                // Most specific part first, as RFC 4514 writes it: the
                // reverse of the order in the certificate.
                let parts: Vec<String> = subject
                    .0
                    .iter()
                    .rev()
                    .map(|rdn| {
                        rdn.0
                            .iter()
                            .map(|attribute| {
                                let value = attribute_text(AnyRef::from(&attribute.value));
                                format!("{}={}", attribute_name(&attribute.oid), escape(&value))
                            })
                            .collect::<Vec<_>>()
                            .join("+")
                    })
                    .collect();
                CertificateLogin::User(parts.join(","))
            }
            CertificateLoginFrom::CommonName => {
                // Several common names are joined with commas, unescaped,
                // as RabbitMQ does.
                let names: Vec<String> = subject
                    .0
                    .iter()
                    .flat_map(|rdn| rdn.0.iter())
                    .filter(|attribute| attribute.oid == COMMON_NAME)
                    .map(|attribute| attribute_text(AnyRef::from(&attribute.value)))
                    .collect();
                if names.is_empty() {
                    CertificateLogin::NoName("no name found")
                } else {
                    CertificateLogin::User(names.join(","))
                }
            }
        }
    }
}

type Oid = x509_cert::der::oid::ObjectIdentifier;

const COMMON_NAME: Oid = Oid::new_unwrap("2.5.4.3");

/// RabbitMQ's short names for attribute types (`format_rdn/1`); others are
/// written as their dotted OID.
const ATTRIBUTE_NAMES: &[(&str, &str)] = &[
    ("2.5.4.4", "SN"),
    ("2.5.4.42", "GIVENNAME"),
    ("2.5.4.43", "INITIALS"),
    ("2.5.4.44", "GENERATIONQUALIFIER"),
    ("2.5.4.3", "CN"),
    ("2.5.4.7", "L"),
    ("2.5.4.8", "ST"),
    ("2.5.4.10", "O"),
    ("2.5.4.11", "OU"),
    ("2.5.4.12", "TITLE"),
    ("2.5.4.6", "C"),
    ("2.5.4.5", "SERIALNUMBER"),
    ("2.5.4.65", "PSEUDONYM"),
    ("0.9.2342.19200300.100.1.25", "DC"),
    ("1.2.840.113549.1.9.1", "EMAILADDRESS"),
    ("2.5.4.9", "STREET"),
    ("0.9.2342.19200300.100.1.1", "UID"),
];

fn attribute_name(oid: &Oid) -> String {
    let dotted = oid.to_string();
    ATTRIBUTE_NAMES
        .iter()
        .find(|(known, _)| *known == dotted)
        .map_or(dotted, |(_, name)| (*name).to_owned())
}

/// An attribute's value as text: the directory string types decoded to
/// UTF-8, anything else as its bytes read leniently.
fn attribute_text(value: AnyRef<'_>) -> String {
    let bytes = value.value();
    match value.tag() {
        Tag::BmpString => {
            let units: Vec<u16> = bytes
                .chunks_exact(2)
                .map(|pair| u16::from_be_bytes([pair[0], pair[1]]))
                .collect();
            String::from_utf16_lossy(&units)
        }
        // TeletexString is read as ISO-8859-1, as RabbitMQ does.
        Tag::TeletexString => bytes.iter().map(|&byte| char::from(byte)).collect(),
        _ => String::from_utf8_lossy(bytes).into_owned(),
    }
}

/// RFC 4514 escaping as RabbitMQ does it (`escape_rdn_value/2`): a leading
/// space or `#`, a trailing space and `"+,;<>\` get a backslash; bytes of
/// the UTF-8 form below 32 or from 126 up are written as `\XX`.
fn escape(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut escaped = String::with_capacity(bytes.len());
    for (index, &byte) in bytes.iter().enumerate() {
        let first = index == 0;
        let last = index + 1 == bytes.len();
        match byte {
            b' ' | b'#' if first => {
                escaped.push('\\');
                escaped.push(char::from(byte));
            }
            b' ' if last => escaped.push_str("\\ "),
            b'"' | b'+' | b',' | b';' | b'<' | b'>' | b'\\' => {
                escaped.push('\\');
                escaped.push(char::from(byte));
            }
            byte if !(32..126).contains(&byte) => {
                escaped.push_str(&format!("\\{byte:02X}"));
            }
            byte => escaped.push(char::from(byte)),
        }
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair};

    fn certificate(subject: &[(DnType, &str)]) -> Vec<u8> {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        let mut name = DistinguishedName::new();
        for (kind, value) in subject {
            name.push(kind.clone(), *value);
        }
        params.distinguished_name = name;
        let key = KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn certificate_login_distinguished_name_is_most_specific_first() {
        let der = certificate(&[
            (DnType::CountryName, "NL"),
            (DnType::OrganizationName, "Example"),
            (DnType::CommonName, "client"),
        ]);
        assert_eq!(
            CertificateLogin::from_certificate(&der, CertificateLoginFrom::DistinguishedName),
            CertificateLogin::User("CN=client,O=Example,C=NL".to_owned())
        );
    }

    #[test]
    fn certificate_login_common_name() {
        let der = certificate(&[
            (DnType::OrganizationName, "Example"),
            (DnType::CommonName, "guest"),
        ]);
        assert_eq!(
            CertificateLogin::from_certificate(&der, CertificateLoginFrom::CommonName),
            CertificateLogin::User("guest".to_owned())
        );
        let nameless = certificate(&[(DnType::OrganizationName, "Example")]);
        assert_eq!(
            CertificateLogin::from_certificate(&nameless, CertificateLoginFrom::CommonName),
            CertificateLogin::NoName("no name found")
        );
    }

    #[test]
    fn certificate_login_escapes_as_rabbitmq() {
        assert_eq!(escape("a,b+c"), "a\\,b\\+c");
        assert_eq!(escape(" lead#"), "\\ lead#");
        assert_eq!(escape("#x "), "\\#x\\ ");
        assert_eq!(escape("é~"), "\\C3\\A9\\7E");
        let der = certificate(&[(DnType::CommonName, "Smith, J")]);
        assert_eq!(
            CertificateLogin::from_certificate(&der, CertificateLoginFrom::DistinguishedName),
            CertificateLogin::User("CN=Smith\\, J".to_owned())
        );
    }

    #[test]
    fn certificate_login_unreadable_certificate_names_nobody() {
        assert!(matches!(
            CertificateLogin::from_certificate(
                b"not a certificate",
                CertificateLoginFrom::CommonName
            ),
            CertificateLogin::NoName(_)
        ));
    }
}
