//! The mission, step by step, on two clusters of real nodes.

use super::*;

pub(super) struct Mission<'a> {
    pub(super) home: &'a Cluster,
    pub(super) foreign: &'a Cluster,
    /// More `liqoctl install` flags for the foreign cluster.
    pub(super) foreign_install: Vec<String>,
}

impl Mission<'_> {
    pub(super) async fn run(&self, peer: impl FnOnce() -> Result<()>) -> Result<()> {
        let (home, foreign) = (self.home, self.foreign);
        let hc = home.client().await?;
        let fc = foreign.client().await?;

        // 1. The agents from their images, as real pods.
        for (cluster, id, extra) in [
            (home, "home-1", &[][..]),
            (foreign, "foreign-1", &self.foreign_install[..]),
        ] {
            let id = format!("--cluster-id={id}");
            let cidr = format!("--pod-cidr={}", cluster.spec().pod_cidr);
            let mut args = vec!["install", &id, &cidr, "--timeout=90"];
            args.extend(extra.iter().map(String::as_str));
            liqoctl(Some(cluster.kubeconfig_path()), &args).success();
        }
        let gw = &liqo_pod(home, "liqo-gateway")?;
        ensure!(
            gw["spec"]["nodeName"] == home.real_node_name().unwrap_or("?"),
            "the gateway runs on {}",
            gw["spec"]["nodeName"]
        );
        ensure!(
            gw["status"]["containerStatuses"][0]["imageID"]
                .as_str()
                .is_some_and(|i| i.contains("sha256:")),
            "the gateway's container has no image digest: {}",
            gw["status"]
        );
        runs_the_shipped_image(gw, "liqo-gateway")?;

        // 2. Peer.
        let foreign_before = snapshot(&fc).await?;
        let home_before = snapshot(&hc).await?;
        peer()?;
        let vk = kubectl(home, &["-n", "liqo", "get", "pods", "-o", "wide"])?.success();
        ensure!(
            vk.stdout
                .lines()
                .any(|l| l.starts_with("liqo-vk-") && l.contains(" Running ")),
            "the virtual kubelet is not a running pod: {}",
            vk.stdout
        );
        runs_the_shipped_image(&liqo_pod(home, "liqo-vk-")?, "liqo-virtual-kubelet")?;

        // 3. Offload; the web Deployment runs on the provider's real node.
        kubectl(home, &["create", "namespace", OFFLOADED])?.success();
        liqoctl(
            Some(home.kubeconfig_path()),
            &["offload", "namespace", OFFLOADED],
        )
        .success();
        let mut template = web_pod("web");
        template["spec"]["nodeSelector"] = liqo_e2e::virtual_node_selector();
        template["spec"]["tolerations"] = liqo_e2e::virtual_node_tolerations();
        create(
            &hc,
            OFFLOADED,
            json!({
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "web"},
                "spec": {
                    "replicas": 2,
                    "selector": {"matchLabels": {"app": "web"}},
                    "template": {"metadata": template["metadata"], "spec": template["spec"]},
                },
            }),
        )
        .await?;
        service(&hc, OFFLOADED, "web").await?;
        let web = ready_pods(&hc, OFFLOADED, "web", 2).await?;
        let foreign_node = foreign.real_node_name().context("foreign's node")?;
        let remote = ready_pods(&fc, &format!("{OFFLOADED}-home"), "web", 2).await;
        // The twin namespace's name is the provider's; find it by the pods.
        let remote_pods = match remote {
            Ok(pods) => pods,
            Err(_) => {
                let all: Api<Pod> = Api::all(fc.clone());
                all.list(&ListParams::default().labels("app=web"))
                    .await?
                    .items
            }
        };
        ensure!(
            remote_pods.len() == 2
                && remote_pods
                    .iter()
                    .all(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref())
                        == Some(foreign_node)),
            "the provider's web pods are not on its real node"
        );
        let twin = remote_pods[0]
            .metadata
            .namespace
            .clone()
            .context("twin namespace")?;
        let pod = web[0].metadata.name.clone().context("pod name")?;

        // 4. A consumer pod reaches them through the Service.
        create(&hc, "default", toolbox("client", "sleep 3600", json!({}))).await?;
        ready_pods(&hc, "default", "client", 1).await?;
        let web_ip = cluster_ip(&hc, OFFLOADED, "web").await?;
        let answer = curl_until(
            home,
            "default",
            "client",
            &format!("http://{web_ip}/"),
            &format!("on {foreign_node}"),
        )
        .await?;
        eprintln!("consumer pod -> offloaded Service: {}", answer.trim());

        // ... and a provider pod reaches a consumer Service.
        let home_node = home.real_node_name().context("home's node")?;
        let mut echo = web_pod("echo");
        echo["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": home_node});
        create(&hc, OFFLOADED, echo).await?;
        service(&hc, OFFLOADED, "echo").await?;
        ready_pods(&hc, OFFLOADED, "echo", 1).await?;
        let reflected = cluster_ip(&fc, &twin, "echo").await?;
        let back = match curl_until(
            home,
            OFFLOADED,
            &pod,
            &format!("http://{reflected}/"),
            &format!("on {home_node}"),
        )
        .await
        {
            Ok(back) => back,
            Err(e) => {
                let provider = kubectl(
                    foreign,
                    &["get", "endpointslices,pods,svc", "-A", "-o", "wide"],
                )?;
                let consumer = kubectl(
                    home,
                    &["get", "endpointslices,pods,svc", "-A", "-o", "wide"],
                )?;
                let connection = kubectl(home, &["get", "connections", "-A", "-o", "yaml"])?;
                anyhow::bail!(
                    "{e}\nprovider:\n{}\nconsumer:\n{}\n{}",
                    provider.stdout,
                    consumer.stdout,
                    connection.stdout
                );
            }
        };
        eprintln!("offloaded pod -> consumer Service: {}", back.trim());

        // 5. Names, as at home: the offloaded pod resolves the consumer's
        // Service by each of its names, though its twin namespace is
        // called otherwise (where the provider's DNS would find nothing,
        // or the provider's own namespace of that name), and the Service
        // was made after the pod; a consumer pod reaches the offloaded
        // Service by name.
        ensure!(twin != OFFLOADED, "the twin is named otherwise: {twin}");
        for name in [
            "echo".to_owned(),
            format!("echo.{OFFLOADED}"),
            format!("echo.{OFFLOADED}.svc.cluster.local"),
        ] {
            let answer = curl_until(
                home,
                OFFLOADED,
                &pod,
                &format!("http://{name}/"),
                &format!("on {home_node}"),
            )
            .await?;
            eprintln!("offloaded pod -> http://{name}/: {}", answer.trim());
        }
        let resolv = kubectl(
            home,
            &[
                "-n",
                OFFLOADED,
                "exec",
                &pod,
                "--",
                "cat",
                "/etc/resolv.conf",
            ],
        )?
        .success();
        ensure!(
            resolv.stdout.contains(&format!(
                "search {OFFLOADED}.svc.cluster.local svc.cluster.local cluster.local"
            )),
            "the offloaded pod's search path is not its home's: {}",
            resolv.stdout
        );
        let by_name = curl_until(
            home,
            "default",
            "client",
            &format!("http://web.{OFFLOADED}/"),
            &format!("on {foreign_node}"),
        )
        .await?;
        eprintln!(
            "consumer pod -> http://web.{OFFLOADED}/: {}",
            by_name.trim()
        );

        // 6. logs and exec reach the remote container.
        let logs = kubectl(home, &["-n", OFFLOADED, "logs", &pod])?.success();
        ensure!(
            logs.stdout.contains(&format!("serving on {foreign_node}")),
            "logs: {}",
            logs.stdout
        );
        let exec = kubectl(
            home,
            &[
                "-n",
                OFFLOADED,
                "exec",
                &pod,
                "--",
                "cat",
                "/www/index.html",
            ],
        )?
        .success();
        ensure!(
            exec.stdout.contains(&format!("on {foreign_node}")),
            "exec: {}",
            exec.stdout
        );

        // 7. liqoctl test network.
        liqoctl(
            Some(home.kubeconfig_path()),
            &["test", "network", "--timeout=120"],
        )
        .success();

        // 8. A ConfigMap and a Secret, mounted, followed.
        kubectl(
            home,
            &[
                "-n",
                OFFLOADED,
                "create",
                "configmap",
                "settings",
                "--from-literal=greeting=first",
            ],
        )?
        .success();
        kubectl(
            home,
            &[
                "-n",
                OFFLOADED,
                "create",
                "secret",
                "generic",
                "password",
                "--from-literal=word=alpha",
            ],
        )?
        .success();
        let reader = toolbox(
            "reader",
            "while true; do echo \"$(cat /cfg/greeting) $(cat /sec/word)\"; sleep 1; done",
            json!({"spec": {
                "nodeSelector": liqo_e2e::virtual_node_selector(),
                "tolerations": liqo_e2e::virtual_node_tolerations(),
                "volumes": [
                    {"name": "cfg", "configMap": {"name": "settings"}},
                    {"name": "sec", "secret": {"secretName": "password"}},
                ],
            }}),
        );
        let mut reader = reader;
        reader["spec"]["containers"][0]["volumeMounts"] = json!([
            {"name": "cfg", "mountPath": "/cfg"},
            {"name": "sec", "mountPath": "/sec"},
        ]);
        create(&hc, OFFLOADED, reader).await?;
        ready_pods(&hc, OFFLOADED, "reader", 1).await?;
        let read = |expect: &'static str| async move {
            wait_for(
                &format!("the offloaded pod to read {expect:?}"),
                WAIT,
                || async {
                    let out = kubectl(
                        home,
                        &[
                            "-n",
                            OFFLOADED,
                            "exec",
                            "reader",
                            "--",
                            "sh",
                            "-c",
                            "echo $(cat /cfg/greeting) $(cat /sec/word)",
                        ],
                    )?;
                    Ok(out.stdout.trim() == expect)
                },
            )
            .await
        };
        read("first alpha").await?;
        kubectl(
            home,
            &[
                "-n",
                OFFLOADED,
                "patch",
                "configmap",
                "settings",
                "-p",
                r#"{"data":{"greeting":"second"}}"#,
            ],
        )?
        .success();
        kubectl(
            home,
            &[
                "-n",
                OFFLOADED,
                "patch",
                "secret",
                "password",
                "-p",
                r#"{"stringData":{"word":"beta"}}"#,
            ],
        )?
        .success();
        read("second beta").await?;

        // 9. A Job runs to completion.
        let job = toolbox(
            "job",
            "echo counted $(seq 1 3 | wc -l)",
            json!({"spec": {
                "restartPolicy": "Never",
                "nodeSelector": liqo_e2e::virtual_node_selector(),
                "tolerations": liqo_e2e::virtual_node_tolerations(),
            }}),
        );
        create(&hc, OFFLOADED, json!({
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "count"},
            "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": {"app": "job"}}, "spec": job["spec"]}},
        }))
        .await?;
        kubectl(
            home,
            &[
                "-n",
                OFFLOADED,
                "wait",
                "--for=condition=Complete",
                "job/count",
                "--timeout=120s",
            ],
        )?
        .success();
        let job_logs = kubectl(home, &["-n", OFFLOADED, "logs", "job/count"])?.success();
        ensure!(
            job_logs.stdout.contains("counted 3"),
            "the Job's logs: {}",
            job_logs.stdout
        );

        // 10. The clusterset: a Service exported on the provider is
        // imported on the consumer, in the namespace of the same name, and
        // a consumer pod reaches it by its clusterset name (CoreDNS's
        // multicluster zone, the clusterset IP, the tunnel).
        for cluster in [home, foreign] {
            kubectl(cluster, &["create", "namespace", SHARED])?.success();
        }
        create(&fc, SHARED, web_pod("exported")).await?;
        service(&fc, SHARED, "exported").await?;
        create(
            &fc,
            SHARED,
            json!({"apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceExport", "metadata": {"name": "exported"}}),
        )
        .await?;
        let by_clusterset_name = curl_until(
            home,
            "default",
            "client",
            &format!("http://exported.{SHARED}.svc.clusterset.local/"),
            &format!("on {foreign_node}"),
        )
        .await?;
        eprintln!(
            "consumer pod -> the provider's exported Service: {}",
            by_clusterset_name.trim()
        );

        // 11. Unpeer: nothing of the peering is left, its imports neither.
        kubectl(home, &["delete", "namespace", OFFLOADED, "--timeout=120s"])?.success();
        let remote_kubeconfig = foreign
            .kubeconfig_path()
            .to_str()
            .context("path")?
            .to_owned();
        liqoctl(
            Some(home.kubeconfig_path()),
            &["unpeer", "--remote-kubeconfig", &remote_kubeconfig, "--yes"],
        )
        .success();
        let imported = |kind: &'static str| async move {
            let listed = kubectl(home, &["-n", SHARED, "get", kind, "-o", "name"])?;
            anyhow::Ok(
                listed
                    .stdout
                    .lines()
                    .filter(|l| l.contains("exported"))
                    .count(),
            )
        };
        wait_for("the import to go with the peering", WAIT, || async {
            Ok(imported("serviceimports").await? == 0
                && imported("services").await? == 0
                && imported("endpointslices").await? == 0)
        })
        .await?;
        // The test's own Services go, and the addresses they held.
        for cluster in [home, foreign] {
            kubectl(cluster, &["delete", "namespace", SHARED, "--timeout=120s"])?.success();
        }
        let mine = [OFFLOADED, "default", SHARED];
        let home_after = without(snapshot(&hc).await?, &mine);
        let foreign_after = without(snapshot(&fc).await?, &[SHARED]);
        let leftovers = |before: &BTreeSet<String>, after: &BTreeSet<String>| {
            after.difference(before).cloned().collect::<Vec<_>>()
        };
        let home_left = leftovers(&without(home_before, &mine), &home_after);
        ensure!(home_left.is_empty(), "left on home: {home_left:?}");
        let foreign_left = leftovers(&without(foreign_before, &[SHARED]), &foreign_after);
        ensure!(foreign_left.is_empty(), "left on foreign: {foreign_left:?}");
        Ok(())
    }
}
