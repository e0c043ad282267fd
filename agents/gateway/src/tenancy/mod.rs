//! On a provider: its tenants and their twin namespaces, followed once for
//! the two tasks that keep their grants: the split into shares
//! ([`shares`]) and the grant that follows the load ([`grant`]).

pub mod grant;
pub mod shares;

use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::watcher;
use liqo_agent_runtime::follow::{self, Followed};
use liqo_api::authentication::Tenant;
use liqo_api::names::labels;

/// The stores of the tenants and of the namespaces labelled with a tenant.
#[derive(Clone)]
pub struct Tenants {
    pub tenants: Followed<Tenant>,
    pub twins: Followed<Namespace>,
}

/// Follows the tenants and their twins; the task keeps both stores.
pub fn follow(client: kube::Client) -> (Tenants, impl Future<Output = ()> + Send) {
    let (tenants, follow_tenants) = follow::follow(
        Api::<Tenant>::all(client.clone()),
        watcher::Config::default(),
        "tenants",
    );
    let (twins, follow_twins) = follow::follow(
        Api::<Namespace>::all(client),
        watcher::Config::default().labels(labels::TENANT),
        "twin namespaces",
    );
    let task = async move {
        tokio::join!(follow_tenants, follow_twins);
    };
    (Tenants { tenants, twins }, task)
}

/// The twin namespaces of tenant `id` among `twins`.
pub fn twins_of<'a>(
    twins: &'a [Arc<Namespace>],
    id: &'a str,
) -> impl Iterator<Item = &'a Namespace> + 'a {
    twins
        .iter()
        .map(|n| &**n)
        .filter(move |n| n.labels().get(labels::TENANT).map(String::as_str) == Some(id))
}
