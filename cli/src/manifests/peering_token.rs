//! The provider-side objects of a peering token (docs/tokens.md), as typed
//! manifests built by pure functions. Everything a consumer will have is
//! made here, by the provider's administrator, when the token is
//! generated: the bootstrap credential can only claim it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use liqo_api::authentication::peer_user;
use liqo_api::names::{self, labels};
use liqo_api::token::{self, objects};
use liqo_api::{ClusterId, ClusterIdentity};

use crate::manifests::{Manifest, common_labels, rbac};

/// The label that ties every object of a token to it.
pub const TOKEN_LABEL: &str = "liqo.io/peering-token";

/// The anchor Secret's annotations: when the token expires (RFC 3339), and
/// the tenants it may claim (comma-separated).
pub const EXPIRES_ANNOTATION: &str = "liqo.io/expires";
pub const TENANTS_ANNOTATION: &str = "liqo.io/tenants";

/// On the consumer, the identity Secret of a token peering names the
/// tenant the provider knows it as, and the token it came from.
pub const TENANT_ANNOTATION: &str = "liqo.io/tenant";

fn token_labels(id: &str) -> BTreeMap<String, String> {
    let mut l = common_labels("peering-token");
    l.insert(TOKEN_LABEL.to_owned(), id.to_owned());
    l
}

/// The token's anchor: the Secret its bootstrap credential is bound to.
/// Deleting it revokes the credential, and the garbage collector removes
/// the [`bootstrap`] objects it owns.
pub fn anchor(id: &str, tenants: &[ClusterId], expires: &str) -> Manifest {
    let tenants: Vec<&str> = tenants.iter().map(ClusterId::as_str).collect();
    Manifest::Secret(Secret {
        metadata: ObjectMeta {
            name: Some(objects::bootstrap(id)),
            namespace: Some(names::NAMESPACE.to_owned()),
            labels: Some(token_labels(id)),
            annotations: Some(BTreeMap::from([
                (EXPIRES_ANNOTATION.to_owned(), expires.to_owned()),
                (TENANTS_ANNOTATION.to_owned(), tenants.join(",")),
            ])),
            ..Default::default()
        },
        type_: Some(token::TOKEN_SECRET_TYPE.to_owned()),
        ..Default::default()
    })
}

/// The bootstrap account and its rights: create Secrets in `liqo` (the
/// admission policy `liqo-peering-tokens` narrows that to its claims),
/// mint the credential of its tenants' accounts (narrowed to credentials
/// bound to a claim by UID), delete its own anchor, and read the
/// provider's identity.
pub fn bootstrap(id: &str, tenants: &[ClusterId]) -> Vec<Manifest> {
    let name = objects::bootstrap(id);
    let meta = ObjectMeta {
        name: Some(name.clone()),
        namespace: Some(names::NAMESPACE.to_owned()),
        labels: Some(token_labels(id)),
        ..Default::default()
    };
    let accounts: Vec<String> = tenants.iter().map(objects::tenant_account).collect();
    vec![
        Manifest::ServiceAccount(ServiceAccount {
            metadata: meta.clone(),
            automount_service_account_token: Some(false),
            ..Default::default()
        }),
        Manifest::Role(Role {
            metadata: meta.clone(),
            rules: Some(vec![
                rbac::rule(&[""], &["secrets"], &["create"]),
                // Its own anchor: the consumer that takes the last tenant
                // revokes the token at once.
                rbac::named_rule(&[""], &["secrets"], &[&name], &["delete"]),
                rbac::named_rule(&[""], &["serviceaccounts/token"], &accounts, &["create"]),
                rbac::named_rule(
                    &[""],
                    &["configmaps"],
                    &[names::IDENTITY_CONFIGMAP],
                    &["get"],
                ),
            ]),
        }),
        Manifest::RoleBinding(RoleBinding {
            metadata: meta,
            role_ref: rbac::role_ref("Role", &name),
            subjects: Some(vec![rbac::service_account(&name, names::NAMESPACE)]),
        }),
    ]
}

/// The account that stands for tenant `tenant` and may do one thing:
/// impersonate the tenant's user (`liqo.io:peer:<tenant>`, whose rights
/// are the tenant's, exactly as with a certificate); and the tenant user's
/// right to end its own tenancy by deleting its Tenant record (the
/// garbage collector removes what the record owns).
pub fn tenant_account(tenant: &ClusterId, id: &str) -> Vec<Manifest> {
    let account = objects::tenant_account(tenant);
    let user = peer_user(tenant);
    let mut object_labels = token_labels(id);
    object_labels.insert(labels::PEER_CLUSTER_ID.to_owned(), tenant.to_string());
    let cluster_meta = |name: &str| ObjectMeta {
        name: Some(name.to_owned()),
        labels: Some(object_labels.clone()),
        ..Default::default()
    };
    let end = format!("{account}-end");
    vec![
        Manifest::ServiceAccount(ServiceAccount {
            metadata: ObjectMeta {
                namespace: Some(names::NAMESPACE.to_owned()),
                ..cluster_meta(&account)
            },
            automount_service_account_token: Some(false),
            ..Default::default()
        }),
        Manifest::ClusterRole(ClusterRole {
            metadata: cluster_meta(&account),
            rules: Some(vec![rbac::named_rule(
                &[""],
                &["users"],
                &[&user],
                &["impersonate"],
            )]),
            ..Default::default()
        }),
        Manifest::ClusterRoleBinding(ClusterRoleBinding {
            metadata: cluster_meta(&account),
            role_ref: rbac::role_ref("ClusterRole", &account),
            subjects: Some(vec![rbac::service_account(&account, names::NAMESPACE)]),
        }),
        Manifest::ClusterRole(ClusterRole {
            metadata: cluster_meta(&end),
            rules: Some(vec![rbac::named_rule(
                &[names::GROUP],
                &["tenants"],
                &[tenant.as_str()],
                &["get", "delete"],
            )]),
            ..Default::default()
        }),
        Manifest::ClusterRoleBinding(ClusterRoleBinding {
            metadata: cluster_meta(&end),
            role_ref: rbac::role_ref("ClusterRole", &end),
            subjects: Some(vec![rbac::user(&user)]),
        }),
    ]
}

/// The stand-in identity of a tenant not claimed yet: the tenant's
/// objects are named after `tenant`; its name says which token holds it.
pub fn unclaimed(tenant: &ClusterId, id: &str, provider: &ClusterIdentity) -> ClusterIdentity {
    ClusterIdentity {
        cluster_id: tenant.clone(),
        cluster_name: format!("token-{id}"),
        labels: BTreeMap::new(),
        pod_cidr: provider.pod_cidr,
        service_cidr: provider.service_cidr,
        version: liqo_api::VERSION.to_owned(),
    }
}

/// The claim Secret a consumer creates to take tenant `tenant`; it names
/// the consumer. Its UID binds the tenant's credential.
pub fn claim(id: &str, tenant: &ClusterId, consumer: &ClusterIdentity) -> Secret {
    let mut claim_labels = token_labels(id);
    claim_labels.insert(
        labels::PEER_CLUSTER_ID.to_owned(),
        consumer.cluster_id.to_string(),
    );
    claim_labels.insert(TENANT_ANNOTATION.to_owned(), tenant.to_string());
    Secret {
        metadata: ObjectMeta {
            name: Some(objects::claim(id, tenant)),
            namespace: Some(names::NAMESPACE.to_owned()),
            labels: Some(claim_labels),
            ..Default::default()
        },
        type_: Some(token::CLAIM_SECRET_TYPE.to_owned()),
        string_data: Some(BTreeMap::from([
            ("clusterID".to_owned(), consumer.cluster_id.to_string()),
            ("clusterName".to_owned(), consumer.cluster_name.clone()),
        ])),
        ..Default::default()
    }
}

/// An owner reference to a Tenant or a Secret just created.
pub fn owner(kind: &str, api_version: &str, name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: api_version.to_owned(),
        kind: kind.to_owned(),
        name: name.to_owned(),
        uid: uid.to_owned(),
        block_owner_deletion: None,
        controller: None,
    }
}

/// A token random enough to name its objects: not a secret.
pub(crate) fn new_id() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    uuid::Uuid::new_v4()
        .as_bytes()
        .iter()
        .take(token::ID_LEN)
        .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bootstrap_may_mint_only_its_tenants_credentials() {
        let tenants = token::tenants("ab12cd34", 2, None);
        let all = bootstrap("ab12cd34", &tenants);
        let Manifest::Role(role) = &all[1] else {
            panic!("a Role")
        };
        let rules = role.rules.as_ref().expect("rules");
        let mint = &rules[2];
        assert_eq!(
            mint.resources.as_deref(),
            Some(&["serviceaccounts/token".to_owned()][..])
        );
        assert_eq!(
            mint.resource_names.as_deref(),
            Some(
                &[
                    "liqo-peer-ab12cd34-1".to_owned(),
                    "liqo-peer-ab12cd34-2".to_owned()
                ][..]
            )
        );
        for rule in rules {
            assert!(
                !rule
                    .verbs
                    .iter()
                    .any(|v| ["*", "list", "watch", "update", "patch"].contains(&v.as_str())),
                "{rule:?}"
            );
        }
    }

    #[test]
    fn a_tenant_account_may_only_impersonate_its_tenant() {
        let t = ClusterId::new("home").expect("id");
        let all = tenant_account(&t, "ab12cd34");
        let impersonate: Vec<_> = all
            .iter()
            .filter_map(|m| match m {
                Manifest::ClusterRole(r) => r.rules.clone(),
                _ => None,
            })
            .flatten()
            .filter(|r| r.verbs.contains(&"impersonate".to_owned()))
            .collect();
        assert_eq!(impersonate.len(), 1);
        assert_eq!(
            impersonate[0].resources.as_deref(),
            Some(&["users".to_owned()][..])
        );
        assert_eq!(
            impersonate[0].resource_names.as_deref(),
            Some(&["liqo.io:peer:home".to_owned()][..])
        );
    }
}
