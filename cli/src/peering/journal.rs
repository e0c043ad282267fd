//! What a run changed, to undo it if the run fails: each object it
//! created, and each it changed with its state before. Rolling back
//! deletes the first and puts the second back, newest first, on whichever
//! cluster they are, so that a failed command leaves both clusters as it
//! found them, and a re-run resumes from what earlier runs left.

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::Api;

use crate::factory::ClusterClient;
use crate::kube::apply::{self, Applied, Change};
use crate::kube::wait::{self, Waited};
use crate::manifests::Manifest;
use crate::printer::Printer;

/// How long a rollback waits for each namespace it deleted to be gone.
const NAMESPACE_GONE: Duration = Duration::from_secs(60);

/// The objects a run created or changed.
#[derive(Debug, Default)]
pub struct Journal {
    entries: Vec<Entry>,
}

#[derive(Debug)]
struct Entry {
    cluster: ClusterClient,
    manifest: Manifest,
    /// What the object was before this run changed it; `None`: this run
    /// created it.
    prior: Option<serde_json::Value>,
}

impl Journal {
    /// Applies `manifest` on `cluster`, recording it if this created or
    /// changed it; returns the object's UID, which the objects it owns
    /// name.
    pub async fn apply(
        &mut self,
        cluster: &ClusterClient,
        manifest: Manifest,
    ) -> anyhow::Result<String> {
        let mut applied = apply::apply_over(cluster, &manifest).await?;
        let uid = std::mem::take(&mut applied.uid);
        self.record(cluster, manifest, applied);
        Ok(uid)
    }

    /// Applies `manifests` on `cluster` by [`Manifest::rank`]: one rank
    /// after the other, the objects of a rank at once. Records every
    /// object applied, also when another of its rank failed; returns the
    /// first failure after the whole rank is done.
    pub async fn apply_all(
        &mut self,
        cluster: &ClusterClient,
        manifests: Vec<Manifest>,
    ) -> anyhow::Result<()> {
        for rank in by_rank(manifests) {
            let applied =
                futures::future::join_all(rank.iter().map(|m| apply::apply_over(cluster, m))).await;
            let mut failure = None;
            for (manifest, result) in rank.into_iter().zip(applied) {
                match result {
                    Ok(applied) => self.record(cluster, manifest, applied),
                    Err(e) => {
                        failure.get_or_insert(e);
                    }
                }
            }
            if let Some(e) = failure {
                return Err(e);
            }
        }
        Ok(())
    }

    fn record(&mut self, cluster: &ClusterClient, manifest: Manifest, applied: Applied) {
        let prior = match applied.change {
            Change::Unchanged => return,
            Change::Created => None,
            Change::Configured => applied.prior,
        };
        self.entries.push(Entry {
            cluster: cluster.clone(),
            manifest,
            prior,
        });
    }

    /// [`Self::roll_back`] as a step of the command's output, when there
    /// is anything to undo.
    pub async fn undo(self, printer: &Printer) {
        if self.entries.is_empty() {
            return;
        }
        let step = printer.step("Rolling back what this run created");
        let left = self.roll_back().await;
        if left.is_empty() {
            step.done("");
        } else {
            step.fail(format!("could not remove {}", left.join(", ")));
        }
    }

    /// Deletes what this run created and puts back what it changed,
    /// newest first; returns what could not be undone (the cluster gone
    /// meanwhile), as `Kind/name on cluster NAME`.
    pub async fn roll_back(self) -> Vec<String> {
        let mut left = Vec::new();
        let mut namespaces = Vec::new();
        for Entry {
            cluster,
            manifest,
            prior,
        } in self.entries.into_iter().rev()
        {
            let deleted = prior.is_none();
            let undone = match prior {
                Some(prior) => apply::restore(&cluster, &manifest, prior).await,
                None => apply::delete(&cluster, &manifest).await.map(|_| ()),
            };
            match undone {
                Ok(()) => {
                    if let (true, Manifest::Namespace(ns)) = (deleted, &manifest) {
                        let name = ns.metadata.name.clone().unwrap_or_default();
                        namespaces.push((cluster, name));
                    }
                }
                Err(e) => {
                    tracing::warn!("rolling back {}: {e:#}", manifest.describe());
                    left.push(format!(
                        "{} on cluster {}",
                        manifest.describe(),
                        cluster.name
                    ));
                }
            }
        }
        // A namespace goes once the namespace controller has emptied it:
        // until then a re-run could not make it again.
        for (cluster, name) in namespaces {
            let api: Api<Namespace> = Api::all(cluster.client.clone());
            let gone = wait::until(
                &cluster,
                api,
                &name,
                |n: Option<&Namespace>| n.is_none(),
                NAMESPACE_GONE,
                &format!("waiting for namespace {name} to be deleted"),
            )
            .await;
            if !matches!(gone, Ok(Waited::Done(_))) {
                left.push(format!(
                    "Namespace/{name} on cluster {} (still terminating)",
                    cluster.name
                ));
            }
        }
        left
    }
}

/// `manifests` in groups of one [`Manifest::rank`], lowest first, each in
/// the order given.
fn by_rank(mut manifests: Vec<Manifest>) -> Vec<Vec<Manifest>> {
    manifests.sort_by_key(Manifest::rank);
    let mut groups: Vec<Vec<Manifest>> = Vec::new();
    for m in manifests {
        match groups.last_mut() {
            Some(group) if group[0].rank() == m.rank() => group.push(m),
            _ => groups.push(vec![m]),
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use liqo_api::ClusterId;

    use super::*;
    use crate::manifests::tenant;

    #[test]
    fn a_tenant_is_applied_admission_first_roles_before_bindings_and_its_record_last() {
        let all = tenant::names_of(&ClusterId::new("home-1").expect("valid"));
        // Two Roles share a name in two namespaces: told apart by those.
        let key = |m: &Manifest| format!("{} in {:?}", m.describe(), m.api_resource().1);
        let described: Vec<String> = all.iter().map(key).collect();
        let groups = by_rank(all);
        let kind_of = |m: &Manifest| {
            m.describe()
                .split('/')
                .next()
                .unwrap_or_default()
                .to_owned()
        };
        let kinds_by_group: Vec<BTreeSet<String>> = groups
            .iter()
            .map(|g| g.iter().map(kind_of).collect())
            .collect();
        let set = |ks: &[&str]| ks.iter().map(|k| (*k).to_owned()).collect::<BTreeSet<_>>();
        assert_eq!(
            kinds_by_group,
            vec![
                set(&["Namespace"]),
                set(&["ValidatingAdmissionPolicyBinding"]),
                set(&["ClusterRole", "ResourceQuota", "Role"]),
                set(&["ClusterRoleBinding", "RoleBinding"]),
                set(&["Tenant"]),
            ]
        );
        // Nothing lost, and each group keeps the order it was given in.
        let mut flat: Vec<String> = groups.iter().flatten().map(key).collect();
        let mut given = described.clone();
        flat.sort();
        given.sort();
        assert_eq!(flat, given);
        assert!(given.windows(2).all(|w| w[0] != w[1]), "each key once");
        for group in &groups {
            let at: Vec<usize> = group
                .iter()
                .map(|m| described.iter().position(|d| *d == key(m)).expect("given"))
                .collect();
            assert!(at.is_sorted(), "{at:?}");
        }
    }
}
