//! Where a completion webhook may be sent (pure). A callback URL is something a user typed:
//! left unchecked it would let anyone make the server call its own network (SSRF). Only
//! `http(s)` URLs without credentials, to hosts an admin allows, and (unless the admin allows
//! private ranges) only to public addresses: checked on the URL when it is registered and on
//! every address the name resolves to when it is delivered.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use url::{Host, Url};

/// Longest callback URL accepted.
pub const MAX_URL_LEN: usize = 2048;

/// What an admin allows callbacks to reach.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetPolicy {
    /// Host patterns: `*` (any host), `example.com` (that host), `*.example.com` (its subdomains).
    pub allow_hosts: Vec<String>,
    /// Allow loopback, private, link-local and other non-public addresses (a lab, or tests).
    pub allow_private: bool,
}

impl Default for TargetPolicy {
    fn default() -> Self {
        TargetPolicy { allow_hosts: vec!["*".into()], allow_private: false }
    }
}

impl TargetPolicy {
    /// Check a callback URL as given; `Err` says why it is refused, in words for the user.
    pub fn check_url(&self, raw: &str) -> Result<Url, String> {
        if raw.len() > MAX_URL_LEN {
            return Err(format!("the callback URL is longer than {MAX_URL_LEN} characters"));
        }
        let url = Url::parse(raw.trim()).map_err(|e| format!("the callback URL is not a URL: {e}"))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err("the callback URL must start with http:// or https://".into());
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err("the callback URL must not carry a user name or password".into());
        }
        let host = url.host().ok_or("the callback URL has no host")?;
        let name = match &host {
            Host::Domain(d) => d.trim_end_matches('.').to_ascii_lowercase(),
            Host::Ipv4(ip) => ip.to_string(),
            Host::Ipv6(ip) => ip.to_string(),
        };
        if !self.allow_hosts.iter().any(|pattern| host_matches(pattern, &name)) {
            return Err(format!("callbacks to {name} are not allowed on this server"));
        }
        let literal = match host {
            Host::Ipv4(ip) => Some(IpAddr::V4(ip)),
            Host::Ipv6(ip) => Some(IpAddr::V6(ip)),
            Host::Domain(_) => None,
        };
        if let Some(ip) = literal {
            self.check_address(ip)?;
        }
        Ok(url)
    }

    /// Check one address a callback host resolved to.
    pub fn check_address(&self, ip: IpAddr) -> Result<(), String> {
        if self.allow_private || is_public(ip) {
            Ok(())
        } else {
            Err(format!("callbacks to the non-public address {ip} are not allowed"))
        }
    }
}

/// Pure: does `host` (lower case) match an allow-list pattern?
pub fn host_matches(pattern: &str, host: &str) -> bool {
    let pattern = pattern.trim().trim_end_matches('.').to_ascii_lowercase();
    if pattern == "*" {
        return true;
    }
    match pattern.strip_prefix("*.") {
        Some(parent) => host.len() > parent.len() + 1 && host.ends_with(&format!(".{parent}")),
        None => host == pattern,
    }
}

/// Pure: is this an address on the public internet (not loopback, private, link-local,
/// shared, documentation, multicast or reserved; mapped IPv4 judged as IPv4)?
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public_v4(v4);
            }
            let s = v6.segments();
            let nat64 = s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0];
            if nat64 {
                return is_public_v4(Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8));
            }
            // 6to4 carries an IPv4 address in its second and third groups.
            if s[0] == 0x2002 {
                return is_public_v4(Ipv4Addr::new((s[1] >> 8) as u8, s[1] as u8, (s[2] >> 8) as u8, s[2] as u8));
            }
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00 // unique local
                || (s[0] & 0xffc0) == 0xfe80 // link-local
                || (s[0] & 0xffc0) == 0xfec0 // site-local (deprecated)
                || (s[0] == 0x64 && s[1] == 0xff9b) // local-use NAT64
                || (s[0] == 0x100 && s[1..4] == [0, 0, 0]) // discard-only
                || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
                || v6 == Ipv6Addr::from([0u8; 16])
                || s[0..6] == [0, 0, 0, 0, 0, 0]) // IPv4-compatible (deprecated) and the like
        }
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || a == 0
        || (a == 100 && (64..128).contains(&b)) // shared address space (carrier NAT)
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 198 && (b == 18 || b == 19)) // benchmarking
        || a >= 240) // reserved
}

#[cfg(test)]
mod tests {
    use super::*;

    fn public_only() -> TargetPolicy {
        TargetPolicy::default()
    }

    #[test]
    fn private_and_special_addresses_are_refused() {
        for url in [
            "http://127.0.0.1/hook",
            "http://127.1/hook",
            "http://2130706433/hook", // 127.0.0.1 as one number
            "http://0x7f000001/hook",
            "http://10.0.0.5/",
            "http://172.16.3.4/",
            "http://192.168.1.1/",
            "http://169.254.169.254/latest/meta-data/", // cloud metadata
            "http://100.64.0.1/",
            "http://0.0.0.0/",
            "http://[::1]/",
            "http://[::ffff:127.0.0.1]/",
            "http://[::ffff:a9fe:a9fe]/",
            "http://[fd00::1]/",
            "http://[fe80::1]/",
            "http://[64:ff9b::a00:1]/",
            "http://[2002:7f00:1::]/", // 6to4 of 127.0.0.1
            "http://[fec0::1]/",
            "http://[64:ff9b:1::1]/",
            "http://[::]/",
        ] {
            assert!(public_only().check_url(url).is_err(), "{url} should be refused");
        }
        assert!(public_only().check_url("https://93.184.215.14/hook").is_ok());
        assert!(public_only().check_url("https://[2606:4700::1111]/hook").is_ok());
        let lab = TargetPolicy { allow_private: true, ..public_only() };
        assert!(lab.check_url("http://127.0.0.1:8080/hook").is_ok());
    }

    #[test]
    fn schemes_credentials_and_hosts_are_checked() {
        for url in ["ftp://example.com/", "file:///etc/passwd", "gopher://example.com", "javascript:alert(1)", "//x"] {
            assert!(public_only().check_url(url).is_err(), "{url}");
        }
        assert!(public_only().check_url("https://user:pw@example.com/").is_err());
        assert!(public_only().check_url(&format!("https://example.com/{}", "a".repeat(MAX_URL_LEN))).is_err());
        let listed =
            TargetPolicy { allow_hosts: vec!["hooks.example.com".into(), "*.corp.example".into()], ..public_only() };
        assert!(listed.check_url("https://hooks.example.com/x").is_ok());
        assert!(listed.check_url("https://HOOKS.example.com./x").is_ok());
        assert!(listed.check_url("https://a.b.corp.example/x").is_ok());
        assert!(listed.check_url("https://corp.example/x").is_err());
        assert!(listed.check_url("https://evilcorp.example/x").is_err());
        assert!(listed.check_url("https://hooks.example.com.evil.net/x").is_err());
    }
}
