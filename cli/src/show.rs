//! How sharing amounts and costs read for people, in every command's
//! output: `cpu 2, memory 1Gi, pods 10`.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use liqo_api::sharing::{Cost, Resources};

/// Resources as people read them: `cpu 2, memory 1Gi, pods 10`, and
/// `, storage 20Gi in 10 claims` where storage is granted.
pub(crate) fn show_resources(r: &Resources) -> String {
    let q = |q: &Option<Quantity>| q.as_ref().map_or("0".to_owned(), |q| q.0.clone());
    let mut out = format!(
        "cpu {}, memory {}, pods {}",
        q(&r.cpu),
        q(&r.memory),
        q(&r.pods)
    );
    if r.storage.is_some() || r.claims.is_some() {
        out.push_str(&format!(
            ", storage {} in {} claims",
            q(&r.storage),
            q(&r.claims)
        ));
    }
    out
}

/// A cost as people read it: `0.02 EUR per CPU-hour, 0.005 EUR per GiB-hour`.
pub(crate) fn show_cost(c: &Cost) -> String {
    let price = |p: &str| {
        if c.currency.is_empty() {
            p.to_owned()
        } else {
            format!("{p} {}", c.currency)
        }
    };
    let mut parts = Vec::new();
    if let Some(p) = &c.cpu_hour {
        parts.push(format!("{} per CPU-hour", price(p)));
    }
    if let Some(p) = &c.memory_gib_hour {
        parts.push(format!("{} per GiB-hour", price(p)));
    }
    if parts.is_empty() {
        return "-".to_owned();
    }
    parts.join(", ")
}
