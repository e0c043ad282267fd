//! Who is calling, and may they: as a kubelet in webhook mode, a client
//! certificate (verified against the cluster's client CA during the
//! handshake) names the user (common name) and groups (organizations); a
//! bearer token is checked with a TokenReview; the request is then allowed
//! by a SubjectAccessReview on the node's subresource.

use std::collections::BTreeMap;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Api;
use kube::api::PostParams;

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct User {
    pub name: String,
    pub uid: Option<String>,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// Why a caller could not be authenticated or authorized.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("the client certificate cannot be read")]
    Certificate,
    #[error("calling the API server")]
    Api(#[source] kube::Error),
}

/// The user a verified client certificate names: common name and
/// organizations, plus `system:authenticated` as the API server adds it.
pub fn user_from_certificate(der: &[u8]) -> Result<User, AuthError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|_| AuthError::Certificate)?;
    let subject = cert.subject();
    let name = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .ok_or(AuthError::Certificate)?
        .to_owned();
    let mut groups: Vec<String> = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_owned))
        .collect();
    groups.push("system:authenticated".to_owned());
    Ok(User {
        name,
        uid: None,
        groups,
        extra: BTreeMap::new(),
    })
}

/// The bearer token of an `Authorization` header, if any.
pub fn bearer_token(header: Option<&http::HeaderValue>) -> Option<&str> {
    let value = header?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The user a bearer token stands for, by TokenReview; `None` when the API
/// server does not authenticate it.
pub async fn review_token(client: &kube::Client, token: &str) -> Result<Option<User>, AuthError> {
    let api: Api<TokenReview> = Api::all(client.clone());
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.to_owned()),
            audiences: None,
        },
        ..TokenReview::default()
    };
    let got = api
        .create(&PostParams::default(), &review)
        .await
        .map_err(AuthError::Api)?;
    let Some(status) = got.status else {
        return Ok(None);
    };
    if status.authenticated != Some(true) {
        return Ok(None);
    }
    Ok(status.user.map(|u| User {
        name: u.username.unwrap_or_default(),
        uid: u.uid,
        groups: u.groups.unwrap_or_default(),
        extra: u.extra.unwrap_or_default(),
    }))
}

/// The SubjectAccessReview a kubelet sends for `user` doing `verb` on its
/// node's `subresource`.
pub fn access_review(
    user: &User,
    node: &str,
    subresource: &str,
    verb: &str,
) -> SubjectAccessReview {
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.name.clone()),
            uid: user.uid.clone(),
            groups: Some(user.groups.clone()),
            extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
            resource_attributes: Some(ResourceAttributes {
                group: Some(String::new()),
                version: Some("v1".to_owned()),
                resource: Some("nodes".to_owned()),
                subresource: Some(subresource.to_owned()),
                name: Some(node.to_owned()),
                verb: Some(verb.to_owned()),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    }
}

/// Whether the API server allows the review.
pub async fn allowed(
    client: &kube::Client,
    review: &SubjectAccessReview,
) -> Result<bool, AuthError> {
    let api: Api<SubjectAccessReview> = Api::all(client.clone());
    let got = api
        .create(&PostParams::default(), review)
        .await
        .map_err(AuthError::Api)?;
    Ok(got
        .status
        .is_some_and(|s| s.allowed && s.denied != Some(true)))
}

/// The body of a 403, as a kubelet words it.
pub fn forbidden_message(user: &User, node: &str, subresource: &str, verb: &str) -> String {
    format!(
        "Forbidden (user={}, verb={verb}, resource=nodes, subresource={subresource}, node={node})",
        user.name
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificate_subjects_name_the_user() -> Result<(), Box<dyn std::error::Error>> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "kube-apiserver-kubelet-client");
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:masters");
        let key = rcgen::KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        let user = user_from_certificate(cert.der())?;
        assert_eq!(user.name, "kube-apiserver-kubelet-client");
        assert_eq!(user.groups, ["system:masters", "system:authenticated"]);
        assert!(user_from_certificate(b"not a certificate").is_err());
        Ok(())
    }

    #[test]
    fn bearer_tokens() {
        let h = |s: &str| http::HeaderValue::from_str(s).expect("header");
        assert_eq!(bearer_token(Some(&h("Bearer abc"))), Some("abc"));
        assert_eq!(bearer_token(Some(&h("bearer  abc "))), Some("abc"));
        assert_eq!(bearer_token(Some(&h("Basic abc"))), None);
        assert_eq!(bearer_token(Some(&h("Bearer "))), None);
        assert_eq!(bearer_token(None), None);
    }

    #[test]
    fn reviews_ask_about_the_nodes_subresource() {
        let user = User {
            name: "alice".into(),
            groups: vec!["dev".into()],
            ..User::default()
        };
        let review = access_review(&user, "vnode", "proxy", "get");
        let attrs = review.spec.resource_attributes.expect("attributes");
        assert_eq!(attrs.resource.as_deref(), Some("nodes"));
        assert_eq!(attrs.subresource.as_deref(), Some("proxy"));
        assert_eq!(attrs.name.as_deref(), Some("vnode"));
        assert_eq!(attrs.verb.as_deref(), Some("get"));
        assert_eq!(review.spec.user.as_deref(), Some("alice"));
        assert_eq!(review.spec.groups, Some(vec!["dev".to_owned()]));
        assert_eq!(review.spec.extra, None);
    }
}
