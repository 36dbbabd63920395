//! Who shares a cap of connections (pure, no IO). One subscriber holds at least an IPv6 /64
//! and often a routed /56 or /48, so shares by /64 alone let one site take every connection:
//! an IPv6 client counts against its /48 (the whole per-address share) and its /64 (a
//! quarter of it); an IPv4 client against its address. The health lane, where connections
//! over a cap go, is shared by network (IPv4 /24, IPv6 /48), and keeps room for networks that
//! hold no connection at all.

use std::net::IpAddr;

use app::server::session::throttle_subject;
use engine::accounts::throttle::network_of;

/// Connections in the health lane that networks already holding connections cannot take:
/// room for a health check or a newcomer however the rest of the lane is used.
pub const LANE_KEPT_FOR_NEWCOMERS: usize = 16;
/// What one network (IPv4 /24, IPv6 /48) may hold of the health lane.
pub const LANE_PER_NETWORK: usize = 4;

/// Pure: an IPv6 /64's cap, a quarter of its /48's (at least one).
pub fn per_64(per_address: usize) -> usize {
    (per_address / 4).max(1)
}

/// Pure: the shares a connection from `ip` takes (subject, cap), widest first; all must
/// have room.
pub fn connection_shares(ip: IpAddr, per_address: usize) -> Vec<(String, usize)> {
    let per_address = per_address.max(1);
    let subject = throttle_subject(ip);
    match ip.to_canonical() {
        IpAddr::V4(_) => vec![(subject, per_address)],
        IpAddr::V6(_) => vec![(network_of(&subject), per_address), (subject, per_64(per_address))],
    }
}

/// Pure: the health lane's share a connection from `ip` takes (its network).
pub fn lane_share(ip: IpAddr) -> (String, usize) {
    (network_of(&throttle_subject(ip)), LANE_PER_NETWORK)
}

/// Pure: the subject a connection from `ip` is known by when asking whether its site holds
/// connections already (the widest of its shares).
pub fn holder_of(ip: IpAddr, per_address: usize) -> String {
    connection_shares(ip, per_address).swap_remove(0).0
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn v6(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn ipv6_counts_against_its_48_and_a_smaller_share_of_its_64() {
        let shares = connection_shares(v6("2001:db8:1:2::7"), 256);
        assert_eq!(shares, vec![("2001:db8:1::/48".to_string(), 256), ("2001:db8:1:2::/64".to_string(), 64)]);
        assert_eq!(connection_shares("192.0.2.7".parse().unwrap(), 256), vec![("192.0.2.7".to_string(), 256)]);
        assert_eq!(lane_share("192.0.2.7".parse().unwrap()), ("192.0.2.0/24".to_string(), LANE_PER_NETWORK));
        assert_eq!(lane_share(v6("2001:db8:1:2::7")).0, "2001:db8:1::/48");
        // An IPv4 address in IPv6 clothing is the IPv4 address.
        assert_eq!(connection_shares(v6("::ffff:192.0.2.7"), 8), vec![("192.0.2.7".to_string(), 8)]);
    }

    proptest! {
        /// However many /64s (a routed /56 has 256) one /48 spreads over, they share one cap.
        #[test]
        fn every_address_of_a_48_shares_its_cap(a in any::<u16>(), b in any::<u16>(), rest in any::<[u16; 5]>()) {
            let ip = IpAddr::from([0x2001, 0xdb8, 0x42, a, b, rest[0], rest[1], rest[2]]);
            let other = IpAddr::from([0x2001, 0xdb8, 0x42, b, a, rest[3], rest[4], 0]);
            prop_assert_eq!(&connection_shares(ip, 256)[0], &connection_shares(other, 256)[0]);
            prop_assert_eq!(holder_of(ip, 256), "2001:db8:42::/48".to_string());
        }
    }
}
