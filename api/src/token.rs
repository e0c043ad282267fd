//! Peering tokens: what a provider's administrator hands to a consumer's
//! out of band so that the consumer can peer with its own kubeconfig only
//! (docs/tokens.md has the design and its threat model).
//!
//! A token is `liqo-token-v1.` followed by the base64url (no padding) of a
//! JSON [`PeeringToken`]. It carries how to reach and trust the provider
//! (its API address and CA certificate), which tenants it may claim, the
//! grant, and the bootstrap credential: a service account token of the
//! provider's that expires with the peering token and whose only rights
//! are to claim one of those tenants and mint that tenant's credential.
//!
//! The names below are the contract between `liqoctl generate
//! peering-token` (which makes the objects), `liqoctl peer --token` (which
//! uses them) and the admission policy `install` puts on every cluster
//! (which confines the bootstrap credential to them).

use std::fmt;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::sharing::{Cost, Resources};
use crate::{ClusterId, names};

/// What every token string starts with; the version is in it.
pub const PREFIX: &str = "liqo-token-v1.";

/// The Secret type of a claim: a tenant of a token is taken exactly once,
/// by creating this Secret (the API server refuses a second create).
pub const CLAIM_SECRET_TYPE: &str = "liqo.io/peering-claim";

/// The Secret type of a token's anchor: the bootstrap credential is bound
/// to it, so deleting it revokes the token.
pub const TOKEN_SECRET_TYPE: &str = "liqo.io/peering-token";

/// The length of a token ID: lowercase letters and digits.
pub const ID_LEN: usize = 8;

/// What a peering token says.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PeeringToken {
    /// The token's ID: names its objects on the provider.
    pub id: String,
    pub provider_cluster_id: ClusterId,
    pub provider_cluster_name: String,
    /// The provider's API server, as the consumer reaches it.
    pub api_server: String,
    /// The provider's CA certificate (DER, base64): the only CA the
    /// consumer trusts for the provider.
    pub ca: String,
    /// The tenants this token may claim, one per use, in the order they
    /// are tried.
    pub tenants: Vec<TokenTenant>,
    /// The consumer the token is for, when it was bound to one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumer: Option<ClusterId>,
    /// When the token stops working, in seconds since the Unix epoch.
    pub expires: i64,
    pub grant: Resources,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<Cost>,
    /// The bootstrap credential (a bearer token).
    pub bootstrap: String,
}

/// A tenant a token may claim: its ID, and the UID of its Tenant record,
/// which the claim names as its owner (so that ending the tenancy removes
/// the claim too).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenTenant {
    pub id: ClusterId,
    pub uid: String,
}

impl fmt::Debug for PeeringToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeeringToken")
            .field("id", &self.id)
            .field("provider_cluster_id", &self.provider_cluster_id)
            .field("api_server", &self.api_server)
            .field("tenants", &self.tenants)
            .field("expires", &self.expires)
            .field("bootstrap", &"<hidden>")
            .finish_non_exhaustive()
    }
}

/// Why a string is not a token.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("it does not start with {PREFIX} (was it cut when copied?)")]
    Prefix,
    #[error("it is damaged (was it cut or changed when copied?): {0}")]
    Damaged(String),
    #[error("it names no tenant")]
    NoTenant,
    #[error("its ID {0:?} is not {ID_LEN} lowercase letters and digits")]
    Id(String),
}

impl PeeringToken {
    /// The string handed to the consumer.
    pub fn encode(&self) -> String {
        let json = serde_json::to_vec(self).expect("invariant: a token serializes");
        format!(
            "{PREFIX}{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json)
        )
    }

    /// Reads a token string; whitespace around it (a trailing newline from
    /// a file) is ignored.
    pub fn decode(text: &str) -> Result<Self, TokenError> {
        let body = text.trim().strip_prefix(PREFIX).ok_or(TokenError::Prefix)?;
        let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(body)
            .map_err(|e| TokenError::Damaged(e.to_string()))?;
        let token: Self =
            serde_json::from_slice(&json).map_err(|e| TokenError::Damaged(e.to_string()))?;
        if !valid_id(&token.id) {
            return Err(TokenError::Id(token.id));
        }
        if token.tenants.is_empty() {
            return Err(TokenError::NoTenant);
        }
        Ok(token)
    }

    /// The CA certificate's DER bytes.
    pub fn ca_der(&self) -> Result<Vec<u8>, TokenError> {
        base64::engine::general_purpose::STANDARD
            .decode(&self.ca)
            .map_err(|e| TokenError::Damaged(format!("its CA: {e}")))
    }
}

/// Whether `id` can be a token ID.
pub fn valid_id(id: &str) -> bool {
    id.len() == ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// The tenant IDs of a token that may be used `uses` times: the consumer's
/// own cluster ID when the token is bound to it, else `<id>-<n>`.
pub fn tenants(id: &str, uses: u32, consumer: Option<&ClusterId>) -> Vec<ClusterId> {
    match consumer {
        Some(c) => vec![c.clone()],
        None => (1..=uses)
            .map(|n| ClusterId::new(format!("{id}-{n}")).expect("invariant: a DNS label"))
            .collect(),
    }
}

/// Names of a token's objects on the provider, all in the `liqo` namespace.
pub mod objects {
    use crate::ClusterId;

    /// The prefix of the bootstrap service accounts; the admission policy
    /// recognises a bootstrap credential by it.
    pub const BOOTSTRAP_PREFIX: &str = "liqo-token-";

    /// The prefix of the service accounts that stand for a tenant.
    pub const PEER_PREFIX: &str = "liqo-peer-";

    /// The prefix of the claim Secrets.
    pub const CLAIM_PREFIX: &str = "liqo-claim-";

    /// The bootstrap ServiceAccount, its Role and RoleBinding, and the
    /// Secret its credential is bound to.
    pub fn bootstrap(token: &str) -> String {
        format!("{BOOTSTRAP_PREFIX}{token}")
    }

    /// The ServiceAccount that stands for tenant `tenant` (it may only
    /// impersonate the tenant's user), and its RBAC objects.
    pub fn tenant_account(tenant: &ClusterId) -> String {
        format!("{PEER_PREFIX}{tenant}")
    }

    /// The Secret whose creation claims tenant `tenant` of token `token`;
    /// the tenant's credential is bound to it.
    pub fn claim(token: &str, tenant: &ClusterId) -> String {
        format!("{CLAIM_PREFIX}{token}-{tenant}")
    }
}

/// The user name of a token's bootstrap credential on the provider.
pub fn bootstrap_user(token: &str) -> String {
    format!(
        "system:serviceaccount:{}:{}",
        names::NAMESPACE,
        objects::bootstrap(token)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token() -> PeeringToken {
        PeeringToken {
            id: "ab12cd34".into(),
            provider_cluster_id: ClusterId::new("provider-1").expect("id"),
            provider_cluster_name: "provider".into(),
            api_server: "https://127.0.0.1:6443".into(),
            ca: base64::engine::general_purpose::STANDARD.encode(b"not really a CA"),
            tenants: tenants("ab12cd34", 2, None)
                .into_iter()
                .map(|id| TokenTenant {
                    id,
                    uid: "8c1e7b5a-0000-4000-8000-000000000000".into(),
                })
                .collect(),
            consumer: None,
            expires: 1_800_000_000,
            grant: Resources::default(),
            cost: None,
            bootstrap: "eyJhbGciOi.secret.part".into(),
        }
    }

    #[test]
    fn a_token_round_trips_and_survives_a_trailing_newline() {
        let t = token();
        let text = t.encode();
        assert!(text.starts_with(PREFIX));
        assert!(!text.contains(char::is_whitespace));
        assert_eq!(PeeringToken::decode(&format!("{text}\n")), Ok(t));
    }

    #[test]
    fn damaged_tokens_are_refused_with_the_reason() {
        let text = token().encode();
        assert_eq!(PeeringToken::decode("hello"), Err(TokenError::Prefix));
        let cut = &text[..text.len() - 10];
        assert!(matches!(
            PeeringToken::decode(cut),
            Err(TokenError::Damaged(_))
        ));
        let mut bad = token();
        bad.id = "../etc".into();
        assert!(matches!(
            PeeringToken::decode(&bad.encode()),
            Err(TokenError::Id(_))
        ));
        bad = token();
        bad.tenants.clear();
        assert_eq!(
            PeeringToken::decode(&bad.encode()),
            Err(TokenError::NoTenant)
        );
    }

    #[test]
    fn the_bootstrap_credential_is_never_printed_by_debug() {
        let shown = format!("{:?}", token());
        assert!(!shown.contains("secret.part"), "{shown}");
        assert!(shown.contains("ab12cd34"));
    }

    #[test]
    fn tenants_are_the_bound_consumer_or_one_per_use() {
        let c = ClusterId::new("home").expect("id");
        assert_eq!(tenants("ab12cd34", 3, Some(&c)), vec![c]);
        let unbound: Vec<String> = tenants("ab12cd34", 3, None)
            .into_iter()
            .map(String::from)
            .collect();
        assert_eq!(unbound, ["ab12cd34-1", "ab12cd34-2", "ab12cd34-3"]);
        assert!(valid_id("ab12cd34") && !valid_id("AB12cd34") && !valid_id("ab12"));
    }

    #[test]
    fn names_line_up_with_the_admission_policy() {
        let t = ClusterId::new("home").expect("id");
        assert_eq!(objects::claim("ab12cd34", &t), "liqo-claim-ab12cd34-home");
        assert_eq!(objects::tenant_account(&t), "liqo-peer-home");
        assert_eq!(
            bootstrap_user("ab12cd34"),
            "system:serviceaccount:liqo:liqo-token-ab12cd34"
        );
    }
}
