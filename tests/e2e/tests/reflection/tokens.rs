//! A pod's service account token, made on the consumer for its remote pod.

use super::*;

/// A pod that mounts its service account token gets a Secret in the twin
/// whose token authenticates on the consumer's API, gone with the pod.
#[liqo_e2e::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_mounts_its_token_gets_one_of_the_consumer_that_works_there() -> Result<()> {
    let shop = Shop::at(Stage::Offloaded(NS)).await?;
    let Shop {
        pods,
        cms,
        remote_secrets,
        remote_rs,
        ..
    } = &shop;
    let pp = PostParams::default();

    // A pod that mounts its service account token gets one of the
    // consumer's, for its own account, that works on the consumer's API.
    let accounts: Api<ServiceAccount> = Api::namespaced(shop.local(), NS);
    accounts
        .create(
            &pp,
            &serde_json::from_value(json!({ "metadata": { "name": "builder", "namespace": NS } }))?,
        )
        .await?;
    let mut token_user = pod("token-user", json!([]), json!([]))?;
    token_user
        .spec
        .as_mut()
        .context("spec")?
        .service_account_name = Some("builder".to_owned());
    pods.create(&pp, &token_user).await?;
    let token_secret = "liqo-sa-token-token-user";
    // The Secret is written before the pod's ReplicaSet, which mounts it.
    wait_for(
        "the token Secret and the pod's ReplicaSet in the twin",
        WAIT,
        || async {
            Ok(remote_secrets.get_opt(token_secret).await?.is_some()
                && remote_rs.get_opt("token-user").await?.is_some())
        },
    )
    .await?;
    let secret = remote_secrets.get(token_secret).await?;
    assert!(is_ours(&secret.metadata));
    let data = secret.data.context("data")?;
    let token = String::from_utf8(data.get("token").context("token")?.0.clone())?;
    let ca = data.get("ca.crt").context("ca.crt")?.0.clone();
    assert_eq!(
        data.get("namespace").map(|b| b.0.as_slice()),
        Some(NS.as_bytes())
    );
    let local_ca = cms.get("kube-root-ca.crt").await?.data.context("data")?;
    assert_eq!(
        local_ca.get("ca.crt").map(String::as_bytes),
        Some(ca.as_slice()),
        "the consumer's CA"
    );
    let rs = remote_rs.get("token-user").await?;
    let spec = rs
        .spec
        .and_then(|s| s.template)
        .and_then(|t| t.spec)
        .context("remote pod spec")?;
    let volume = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name.starts_with("kube-api-access-"))
        .context("the token volume")?;
    assert_eq!(
        volume
            .secret
            .as_ref()
            .and_then(|s| s.secret_name.as_deref()),
        Some(token_secret)
    );
    let container = &spec.containers[0];
    let mount = container
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == volume.name)
        .context("the token mount")?;
    assert_eq!(
        mount.mount_path,
        "/var/run/secrets/kubernetes.io/serviceaccount"
    );
    let env = |name: &str| {
        container
            .env
            .iter()
            .flatten()
            .find(|e| e.name == name)
            .and_then(|e| e.value.clone())
    };
    let host = env("KUBERNETES_SERVICE_HOST").context("KUBERNETES_SERVICE_HOST")?;
    let port = env("KUBERNETES_SERVICE_PORT").context("KUBERNETES_SERVICE_PORT")?;
    // What an in-cluster client of the remote pod does: the address from
    // its env, the CA and token from its mount.
    let kubeconfig = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": "c", "cluster": {
            "server": format!("https://{host}:{port}"),
            "certificate-authority-data": base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &ca),
        } }],
        "users": [{ "name": "u", "user": { "token": token } }],
        "contexts": [{ "name": "c", "context": { "cluster": "c", "user": "u" } }],
        "current-context": "c",
    });
    let kubeconfig: kube::config::Kubeconfig = serde_json::from_value(kubeconfig)?;
    let as_pod = kube::Client::try_from(
        kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?,
    )?;
    let review = Api::<SelfSubjectReview>::all(as_pod)
        .create(&pp, &SelfSubjectReview::default())
        .await?;
    let user = review
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username);
    assert_eq!(user.as_deref(), Some("system:serviceaccount:shop:builder"));
    // Deleted with the pod.
    pods.delete("token-user", &DeleteParams::default()).await?;
    wait_for("the token Secret gone with the pod", WAIT, || async {
        Ok(remote_secrets.get_opt(token_secret).await?.is_none())
    })
    .await?;
    Ok(())
}
