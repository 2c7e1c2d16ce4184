//! The names a certificate vouches for.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use anyhow::anyhow;
use x509_parser::extensions::GeneralName;

/// The names in a DER certificate: its subject alternative names (DNS
/// names, and IP addresses in their canonical text form) in order, then its
/// subject common name, each once (compared ASCII case-insensitively).
pub fn cert_names(der: &[u8]) -> anyhow::Result<Vec<String>> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| anyhow!("not an X.509 certificate: {e}"))?;
    let mut names: Vec<String> = Vec::new();
    let mut add = |name: String| {
        if !names.iter().any(|n| n.eq_ignore_ascii_case(&name)) {
            names.push(name);
        }
    };
    let san = cert
        .subject_alternative_name()
        .map_err(|e| anyhow!("bad subject alternative name extension: {e}"))?;
    for general_name in san.iter().flat_map(|san| &san.value.general_names) {
        match general_name {
            GeneralName::DNSName(dns) => add((*dns).to_owned()),
            GeneralName::IPAddress(bytes) => {
                if let Some(ip) = ip_from_bytes(bytes) {
                    add(ip.to_string());
                }
            }
            _ => {}
        }
    }
    for common_name in cert.subject().iter_common_name() {
        let common_name = common_name
            .as_str()
            .map_err(|e| anyhow!("bad subject common name: {e}"))?;
        add(common_name.to_owned());
    }
    Ok(names)
}

/// Whether the DER certificate names `host` (ASCII case-insensitively)
/// among [`cert_names`]. An unreadable certificate names nothing.
pub fn cert_allows_host(der: &[u8], host: &str) -> bool {
    match cert_names(der) {
        Ok(names) => names.iter().any(|name| name.eq_ignore_ascii_case(host)),
        Err(_) => false,
    }
}

fn ip_from_bytes(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes)
            .ok()
            .map(|b| IpAddr::V4(Ipv4Addr::from(b))),
        16 => <[u8; 16]>::try_from(bytes)
            .ok()
            .map(|b| IpAddr::V6(Ipv6Addr::from(b))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::first_cert_der;
    use crate::ensure_local_ca;

    #[test]
    fn cert_names_reads_san_and_cn_once_each() {
        let tmp = tempfile::tempdir().unwrap();
        let pki = ensure_local_ca(tmp.path()).unwrap();
        let names: Vec<String> = ["Host-A.example", "10.0.0.5", "host-a.example", "::1"]
            .map(String::from)
            .to_vec();
        let pair = pki.issue_server(&names).unwrap();
        let der = first_cert_der(&pair.cert_pem, "server").unwrap();
        assert_eq!(
            cert_names(&der).unwrap(),
            ["Host-A.example", "10.0.0.5", "::1"]
        );
        assert!(cert_allows_host(&der, "HOST-a.EXAMPLE"));
        assert!(cert_allows_host(&der, "10.0.0.5"));
        assert!(!cert_allows_host(&der, "host-b.example"));
    }

    #[test]
    fn garbage_names_nothing() {
        assert!(cert_names(b"not a certificate").is_err());
        assert!(!cert_allows_host(b"not a certificate", "local-1"));
    }
}
