//! How a peer is known to a provider's API server: the user name and group
//! of the x509 identity a consumer cluster gets. The peering's own
//! resources (tenants, CSRs) will live here.

use crate::ClusterId;

/// The group of every peer identity; RBAC may name it, no human is in it.
pub const PEER_GROUP: &str = "liqo.io:peers";

/// The x509 common name (the Kubernetes user name) of the consumer cluster
/// `consumer` on a provider.
pub fn peer_user(consumer: &ClusterId) -> String {
    format!("liqo.io:peer:{consumer}")
}

/// The consumer a user name stands for, if it is a peer identity.
pub fn peer_of(user: &str) -> Option<ClusterId> {
    let id = user.strip_prefix("liqo.io:peer:")?;
    ClusterId::new(id).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_users_round_trip_and_others_are_not_peers() {
        let id = ClusterId::new("c1-home").expect("valid");
        assert_eq!(peer_of(&peer_user(&id)), Some(id));
        for other in [
            "system:admin",
            "liqo.io:peer:",
            "liqo.io:peer:Bad_ID",
            "x:liqo.io:peer:a",
        ] {
            assert_eq!(peer_of(other), None, "{other}");
        }
    }
}
