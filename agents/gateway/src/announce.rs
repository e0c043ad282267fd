//! Announcing the cluster on the LAN with mDNS/DNS-SD (`_liqo._tcp.local.`,
//! docs/discovery.md). One announcer serves both modes: the agent feeds it
//! the record made from the cluster's identity, and changes it when the
//! identity changes; `liqo-gateway announce` feeds it a record from flags.
//! The record's format is `liqo_api::discovery`'s; only the sockets are
//! here (mdns-sd runs them on a thread of its own).

use anyhow::Context as _;
use liqo_api::discovery::{ClusterRecord, MDNS_SERVICE_TYPE};
use mdns_sd::{IfKind, ServiceDaemon, ServiceInfo};
use tokio::sync::watch;

use crate::flags::AnnounceArgs;

/// Announces `records`' current value until the sender goes or `stop`
/// ends, then withdraws it (mDNS goodbye packets, so that browsers forget
/// it at once). `None` announces nothing. With `interface`, only there;
/// else on every interface with an address.
pub async fn announce(
    interface: Option<&str>,
    mut records: watch::Receiver<Option<ClusterRecord>>,
    stop: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let daemon = ServiceDaemon::new().context("starting the mDNS responder")?;
    if let Some(interface) = interface {
        daemon
            .disable_interface(IfKind::All)
            .and_then(|()| daemon.enable_interface(interface))
            .with_context(|| format!("confining mDNS to the interface {interface}"))?;
    }
    let mut announced: Option<(ClusterRecord, String)> = None;
    let result = async {
        tokio::pin!(stop);
        loop {
            let wanted = records.borrow_and_update().clone();
            if wanted.as_ref() != announced.as_ref().map(|(r, _)| r) {
                if let Some((_, fullname)) = announced.take() {
                    withdraw(&daemon, &fullname).await;
                }
                if let Some(record) = wanted {
                    let fullname = register(&daemon, &record)?;
                    tracing::info!(
                        cluster_id = %record.cluster_id,
                        name = %record.cluster_name,
                        api = %record.api,
                        %fullname,
                        "announcing on the LAN"
                    );
                    announced = Some((record, fullname));
                }
            }
            tokio::select! {
                changed = records.changed() => if changed.is_err() { return Ok(()) },
                () = &mut stop => return Ok(()),
            }
        }
    }
    .await;
    if let Some((_, fullname)) = announced {
        withdraw(&daemon, &fullname).await;
    }
    if let Ok(done) = daemon.shutdown() {
        let _ = done.recv_async().await;
    }
    result
}

/// The mDNS service for `record`: instance name = cluster name, SRV port =
/// the API server's, on a host name of the cluster's own whose addresses
/// are the announcer's (mdns-sd keeps them current); the TXT record says
/// where the API server is.
fn service(record: &ClusterRecord) -> anyhow::Result<ServiceInfo> {
    let txt = record.to_txt()?;
    let properties: Vec<(&str, &str)> = txt.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    Ok(ServiceInfo::new(
        MDNS_SERVICE_TYPE,
        &record.cluster_name,
        &record.mdns_host(),
        "",
        record.api.port(),
        &properties[..],
    )
    .context("building the mDNS service")?
    .enable_addr_auto())
}

fn register(daemon: &ServiceDaemon, record: &ClusterRecord) -> anyhow::Result<String> {
    let service = service(record)?;
    let fullname = service.get_fullname().to_owned();
    daemon
        .register(service)
        .context("registering the mDNS service")?;
    Ok(fullname)
}

async fn withdraw(daemon: &ServiceDaemon, fullname: &str) {
    tracing::info!(%fullname, "withdrawing the announcement");
    match daemon.unregister(fullname) {
        Ok(done) => {
            let _ = done.recv_async().await;
        }
        Err(e) => tracing::warn!(%fullname, error = %e, "withdrawing the announcement"),
    }
}

/// `liqo-gateway announce`: announces the cluster its flags describe,
/// until stopped.
pub async fn from_flags(args: AnnounceArgs) -> anyhow::Result<()> {
    use liqo_api::discovery::txt_keys;
    // Checked as a browser would check it: what is announced can be read.
    let mut txt = vec![
        (txt_keys::ID.to_owned(), args.cluster_id),
        (txt_keys::NAME.to_owned(), args.cluster_name),
        (txt_keys::API.to_owned(), args.api_address),
        (txt_keys::VERSION.to_owned(), liqo_api::VERSION.to_owned()),
    ];
    for label in &args.labels {
        let (key, value) = label
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--label {label:?} is not KEY=VALUE"))?;
        txt.push((format!("{}{key}", txt_keys::LABEL_PREFIX), value.to_owned()));
    }
    let record = ClusterRecord::from_txt(txt)?;
    let (_keep, records) = watch::channel(Some(record));
    announce(
        args.interface.as_deref(),
        records,
        liqo_agent_runtime::shutdown_signal(),
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_service_carries_the_record() {
        let record = ClusterRecord::from_txt_strings([
            "id=c1",
            "name=home",
            "api=https://10.0.0.1:6443",
            "version=0.1.0",
            "label.region=eu",
        ])
        .expect("valid");
        let service = service(&record).expect("service");
        assert_eq!(service.get_fullname(), "home._liqo._tcp.local.");
        assert_eq!(service.get_hostname(), "liqo-c1.local.");
        assert_eq!(service.get_port(), 6443);
        assert_eq!(service.get_property_val_str("id"), Some("c1"));
        assert_eq!(service.get_property_val_str("label.region"), Some("eu"));
        assert!(service.is_addr_auto());
    }
}
