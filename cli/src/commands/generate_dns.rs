//! `liqoctl generate dns-records`: the DNS-SD records (PTR, SRV, TXT) an
//! administrator publishes so that `liqoctl discover --domain` finds this
//! cluster. Reads the identity; prints zone-file lines; writes nothing.

use liqo_api::discovery::{self, ApiAddress, ClusterRecord};
use liqo_api::names;

use crate::cli::{DnsRecordsArgs, GlobalArgs};
use crate::error::UserError;
use crate::factory::ClusterClient;
use crate::kube::cluster::{installed_gateway_args, read_identity};
use crate::printer::Printer;

pub async fn run(
    args: &DnsRecordsArgs,
    global: &GlobalArgs,
    printer: Printer,
) -> anyhow::Result<()> {
    let usage = UserError::Usage;
    let domain =
        discovery::parse_domain(&args.domain).map_err(|e| usage(format!("--domain: {e}")))?;
    let flag_address = args
        .api_address
        .as_deref()
        .map(|a| ApiAddress::parse(a).map_err(|e| usage(format!("--api-address: {e}"))))
        .transpose()?;
    let cluster = ClusterClient::local(global).await?;
    let identity = read_identity(&cluster)
        .await?
        .ok_or_else(|| {
            UserError::NotFound(format!(
                "liqo-rs is not installed on cluster {} (no ConfigMap {}/{}); run liqoctl install first",
                cluster.name,
                names::NAMESPACE,
                names::IDENTITY_CONFIGMAP
            ))
        })?;
    let api = match flag_address {
        Some(address) => address,
        None => {
            let installed = installed_gateway_args(&cluster)
                .await?
                .advertise_address
                .unwrap_or_else(|| cluster.server.clone());
            ApiAddress::parse(&installed).map_err(|e| {
                usage(format!(
                    "cannot publish the API server address of cluster {}: {e}; pass --api-address",
                    cluster.name
                ))
            })?
        }
    };
    let record = ClusterRecord::of(&identity, api);
    let zone = discovery::zone_records(&record, &domain, args.ttl).map_err(|e| {
        UserError::Refused(format!("cannot describe cluster {}: {e}", cluster.name))
    })?;
    printer.result(zone.trim_end());
    Ok(())
}
