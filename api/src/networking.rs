//! Networks: the CIDRs clusters bring to a peering, and the arithmetic on
//! them that routing and NAT rely on. The gateway's own resources will live
//! here.

use ipnet::IpNet;

/// Parses an IPv4 or IPv6 CIDR such as `10.200.0.0/16`, normalised to its
/// network address; `what` names it in the error.
pub fn parse_cidr(what: &str, value: &str) -> Result<IpNet, String> {
    let net: IpNet = value
        .trim()
        .parse()
        .map_err(|_| format!("{what} {value:?} is not a CIDR such as 10.0.0.0/16"))?;
    Ok(net.trunc())
}

/// Whether two networks share an address.
pub fn overlap(a: &IpNet, b: &IpNet) -> bool {
    a.contains(b) || b.contains(a)
}

/// Ranges that cannot carry pod or service traffic between clusters, with
/// what they are.
const RESERVED: [(&str, &str); 7] = [
    ("0.0.0.0/8", "the unspecified network 0.0.0.0/8"),
    ("127.0.0.0/8", "the loopback network 127.0.0.0/8"),
    ("169.254.0.0/16", "the link-local network 169.254.0.0/16"),
    ("224.0.0.0/4", "the multicast network 224.0.0.0/4"),
    ("::1/128", "the loopback address ::1"),
    ("fe80::/10", "the link-local network fe80::/10"),
    ("ff00::/8", "the multicast network ff00::/8"),
];

/// The reserved range `net` overlaps, if any.
pub fn reserved_overlap(net: &IpNet) -> Option<&'static str> {
    RESERVED.iter().find_map(|(cidr, what)| {
        let reserved: IpNet = cidr.parse().expect("invariant: the table holds CIDRs");
        overlap(net, &reserved).then_some(*what)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().expect("cidr")
    }

    #[test]
    fn cidrs_are_normalised_and_bad_ones_named() {
        assert_eq!(parse_cidr("x", "10.1.2.3/16"), Ok(net("10.1.0.0/16")));
        assert_eq!(parse_cidr("x", "fd00::1/64"), Ok(net("fd00::/64")));
        let err = parse_cidr("--pod-cidr", "10.0.0.0").expect_err("no prefix");
        assert!(err.contains("--pod-cidr"), "{err}");
    }

    #[test]
    fn overlaps_both_ways_and_reserved_ranges() {
        assert!(overlap(&net("10.0.0.0/8"), &net("10.200.0.0/16")));
        assert!(overlap(&net("10.200.0.0/16"), &net("10.0.0.0/8")));
        assert!(!overlap(&net("10.200.0.0/16"), &net("10.201.0.0/16")));
        assert!(!overlap(&net("10.0.0.0/8"), &net("fd00::/8")));
        assert_eq!(reserved_overlap(&net("10.200.0.0/16")), None);
        assert!(reserved_overlap(&net("0.0.0.0/0")).is_some());
        assert!(reserved_overlap(&net("127.1.0.0/16")).is_some());
        assert!(reserved_overlap(&net("fe80::/64")).is_some());
    }
}
